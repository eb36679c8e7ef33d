#include "dsgd/apps/image_classifier.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "dsgd/common/error.h"
#include "dsgd/common/json_fields.h"
#include "dsgd/models/model_names.h"

namespace dsgd {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw ConfigError(what);
}

}  // namespace

void validate(const LocalJobOptions& o) {
  const auto& names = models::model_names();
  if (models::is_model_file(o.model)) {
    std::error_code ec;
    require(std::filesystem::is_regular_file(o.model, ec),
            "model file '" + o.model + "' not found (a TorchScript module: in Python, "
            "torch.jit.save(torch.jit.script(model), '" + o.model + "'); every worker reads it at this path)");
  } else if (std::find(names.begin(), names.end(), o.model) == names.end()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw ConfigError("unknown model '" + o.model + "'; known models: " + known +
                      ", or a TorchScript file (ending in .pt or .pth)");
  }
  if (models::is_model_file(o.loss)) {
    std::error_code ec;
    require(std::filesystem::is_regular_file(o.loss, ec),
            "loss file '" + o.loss + "' not found (a TorchScript module whose forward(output, target) returns "
            "the loss: in Python, torch.jit.save(torch.jit.script(loss_module), '" + o.loss + "'))");
  } else {
    require(o.loss == "cross_entropy" || o.loss == "nll" || o.loss == "mse",
            "unknown loss '" + o.loss + "'; use cross_entropy, nll, mse or a TorchScript file (ending in .pt)");
  }
  if (models::is_model_file(o.dataset)) {  // a file of tensors: names end as a model file's do
    std::error_code ec;
    require(std::filesystem::is_regular_file(o.dataset, ec),
            "dataset file '" + o.dataset + "' not found (tensors: in Python, torch.save({\"train_x\": x, "
            "\"train_y\": y}, '" + o.dataset + "'); every worker reads it at this path)");
  } else {
    require(o.dataset == "fashion-mnist" || o.dataset == "synthetic",
            "unknown dataset '" + o.dataset + "'; use fashion-mnist, synthetic or a file of tensors (ending in .pt)");
  }
  require(o.optimizer == "sgd" || o.optimizer == "adam" || o.optimizer == "adamw" || o.optimizer == "rmsprop",
          "unknown optimizer '" + o.optimizer + "'; use sgd, adam, adamw or rmsprop");
  require(!o.weight_decay || (std::isfinite(*o.weight_decay) && *o.weight_decay >= 0),
          "weight_decay must be >= 0, got " + std::to_string(o.weight_decay.value_or(0)));
  for (const auto& [name, beta] : {std::pair{"beta1", o.beta1}, std::pair{"beta2", o.beta2}}) {
    require(std::isfinite(beta) && beta >= 0 && beta < 1, std::string(name) + " must be in [0, 1), got " +
                                                              std::to_string(beta));
  }
  require(o.epochs >= 1, "epochs must be >= 1, got " + std::to_string(o.epochs));
  require(o.batch_size >= 1, "batch size must be >= 1, got " + std::to_string(o.batch_size));
  require(std::isfinite(o.lr) && o.lr > 0, "learning rate must be a positive number, got " + std::to_string(o.lr));
  require(std::isfinite(o.momentum) && o.momentum >= 0 && o.momentum < 1,
          "momentum must be in [0, 1), got " + std::to_string(o.momentum));
  require(std::isfinite(o.lr_decay) && o.lr_decay > 0 && o.lr_decay <= 1,
          "learning rate decay must be in (0, 1], got " + std::to_string(o.lr_decay));
  require(o.threads >= 1 && o.threads <= 1024, "threads must be in 1..1024, got " + std::to_string(o.threads));
  require(o.max_steps >= 0, "max steps must be >= 0 (0 = no limit), got " + std::to_string(o.max_steps));
  require(o.synthetic_samples >= 1, "synthetic samples must be >= 1, got " + std::to_string(o.synthetic_samples));
  require(o.synthetic_image_size >= 6 && o.synthetic_image_size <= 1024,
          "synthetic image size must be in 6..1024 pixels, got " + std::to_string(o.synthetic_image_size));
  require(o.synthetic_channels >= 1 && o.synthetic_channels <= 64,
          "synthetic channels must be in 1..64, got " + std::to_string(o.synthetic_channels));
  require(o.sim_layers >= 1 && o.sim_layers <= 4096,
          "sim_layers must be in 1..4096, got " + std::to_string(o.sim_layers));
  require(o.sim_parameters >= o.sim_layers && o.sim_parameters <= (int64_t{1} << 34),
          "sim_parameters must be in sim_layers..2^34, got " + std::to_string(o.sim_parameters));
  require(std::isfinite(o.sim_step_ms) && o.sim_step_ms >= 0 && o.sim_step_ms <= 600000,
          "sim_step_ms must be in 0..600000, got " + std::to_string(o.sim_step_ms));
}

nlohmann::json parse_config_text(std::string_view text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e400
    throw ConfigError(what + " is not valid JSON: " + e.what());
  }
}

LocalJobOptions image_classifier_options(const nlohmann::json& config) {
  if (!config.is_object()) throw ConfigError("the image classifier's config must be a JSON object");
  static const std::vector<std::string> known = {"model",
                                                 "loss",
                                                 "dataset",
                                                 "data_dir",
                                                 "optimizer",
                                                 "lr",
                                                 "momentum",
                                                 "weight_decay",
                                                 "beta1",
                                                 "beta2",
                                                 "lr_decay",
                                                 "dropout",
                                                 "channels_last",
                                                 "sync_batchnorm",
                                                 "cudnn_benchmark",
                                                 "synthetic_samples",
                                                 "synthetic_image_size",
                                                 "synthetic_channels",
                                                 "sim_parameters",
                                                 "sim_layers",
                                                 "sim_step_ms"};
  for (const auto& [k, v] : config.items()) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      throw ConfigError("unknown image classifier config key '" + k + "'");
    }
  }
  LocalJobOptions o;
  try {
    o.model = config.value("model", o.model);
    o.loss = config.value("loss", o.loss);
    o.dataset = config.value("dataset", o.dataset);
    o.data_dir = config.value("data_dir", o.data_dir);
    o.optimizer = config.value("optimizer", o.optimizer);
    o.lr = config.value("lr", o.lr);
    o.momentum = config.value("momentum", o.momentum);
    if (config.contains("weight_decay")) o.weight_decay = config.at("weight_decay").get<double>();
    o.beta1 = config.value("beta1", o.beta1);
    o.beta2 = config.value("beta2", o.beta2);
    o.lr_decay = config.value("lr_decay", o.lr_decay);
    o.dropout = config.value("dropout", o.dropout);
    if (config.contains("channels_last")) o.channels_last = config.at("channels_last").get<bool>();
    o.sync_batchnorm = config.value("sync_batchnorm", o.sync_batchnorm);
    o.cudnn_benchmark = config.value("cudnn_benchmark", o.cudnn_benchmark);
    o.synthetic_samples = integer_field(config, "synthetic_samples", o.synthetic_samples);
    o.synthetic_image_size = integer_field(config, "synthetic_image_size", o.synthetic_image_size);
    o.synthetic_channels = integer_field(config, "synthetic_channels", o.synthetic_channels);
    o.sim_parameters = integer_field(config, "sim_parameters", o.sim_parameters);
    o.sim_layers = integer_field(config, "sim_layers", o.sim_layers);
    o.sim_step_ms = config.value("sim_step_ms", o.sim_step_ms);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(std::string("image classifier config: a value has the wrong type: ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("image classifier config: ") + e.what());
  }
  validate(o);  // the single-process job's checks and messages
  if (o.channels_last.value_or(false) && (o.model == "mlp" || o.model == "simulated")) {
    throw ConfigError("image classifier config: channels_last lays out convolutions (models cnn, resnet18, resnet50); "
                      "model '" + o.model + "' has none: leave channels_last out");
  }
  if (o.sync_batchnorm && o.model.rfind("resnet", 0) != 0) {
    throw ConfigError("image classifier config: sync_batchnorm applies to the models with BatchNorm (resnet18, "
                      "resnet50); model '" + o.model + "' has none: leave sync_batchnorm out");
  }
  return o;
}

}  // namespace dsgd
