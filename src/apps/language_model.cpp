#include "dsgd/apps/language_model.h"

#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "dsgd/common/error.h"
#include "dsgd/models/gpt.h"
#include "dsgd/apps/image_classifier.h"
#include "dsgd/common/json_fields.h"
#include "dsgd/models/model_names.h"
#include "dsgd/models/registry.h"
#include "dsgd/torch/operator.h"
#include "dsgd/data/text.h"

namespace dsgd {
namespace {

void require(bool ok, const std::string& key, const std::string& what) {
  if (!ok) throw ConfigError("language model config: '" + key + "' " + what);
}

void validate(const LanguageModelOptions& o) {
  if (models::is_model_file(o.model)) {
    std::error_code ec;
    require(std::filesystem::is_regular_file(o.model, ec), "model",
            "names a file that is not there: '" + o.model + "' (a TorchScript module; every worker reads it)");
    require(o.context > 0, "context", "must be given for a model from a file: the tokens of a sample");
  } else {
    (void)models::gpt_options(o.model, 256);  // ConfigError naming the sizes for an unknown one
  }
  require(!o.train_tokens.empty(), "train_tokens", "is missing: a token file (dsgd prepare-text writes one)");
  require(o.context >= 0, "context", "must be >= 0 (0 = the model's), got " + std::to_string(o.context));
  require(o.dropout >= 0 && o.dropout < 1, "dropout", "must be in [0, 1), got " + std::to_string(o.dropout));
  require(std::isfinite(o.lr) && o.lr > 0, "lr", "must be > 0, got " + std::to_string(o.lr));
  require(std::isfinite(o.min_lr) && o.min_lr >= 0 && o.min_lr <= o.lr, "min_lr",
          "must be in [0, lr], got " + std::to_string(o.min_lr));
  require(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "weight_decay",
          "must be >= 0, got " + std::to_string(o.weight_decay));
  require(o.beta1 >= 0 && o.beta1 < 1, "beta1", "must be in [0, 1), got " + std::to_string(o.beta1));
  require(o.beta2 >= 0 && o.beta2 < 1, "beta2", "must be in [0, 1), got " + std::to_string(o.beta2));
  require(o.warmup_steps >= 0, "warmup_steps", "must be >= 0, got " + std::to_string(o.warmup_steps));
  require(o.decay_steps >= 0, "decay_steps", "must be >= 0 (0 = no decay), got " + std::to_string(o.decay_steps));
  require(o.val_sequences >= 0, "val_sequences",
          "must be >= 0 (0 = every sequence of val_tokens), got " + std::to_string(o.val_sequences));
}

class LanguageModel : public TrainingOperator {
 public:
  void setup(const nlohmann::json& config) override {
    const LanguageModelOptions o = language_model_options(config);
    val_sequences_ = o.val_sequences;
    auto train = std::make_shared<data::TokenDataset>(o.train_tokens, language_model_context(o));
    std::shared_ptr<const Dataset> val;
    if (!o.val_tokens.empty()) val = std::make_shared<data::TokenDataset>(o.val_tokens, train->context());
    std::shared_ptr<torch::nn::Module> model;
    if (models::is_model_file(o.model)) {
      model = register_model(models::load_scripted_language_model(o.model, train->context(), train->vocab_size()));
    } else {
      auto shape = models::gpt_options(o.model, train->vocab_size());
      shape.context = std::max(shape.context, train->context());
      shape.dropout = o.dropout;
      model = register_model(models::make_gpt(shape));
    }
    std::vector<torch::Tensor> decay, no_decay;  // matrices decay; biases, norms' weights do not
    for (const auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
    const auto adamw = torch::optim::AdamWOptions(o.lr).betas(std::make_tuple(o.beta1, o.beta2));
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (const auto& [params, wd] : {std::pair{&decay, o.weight_decay}, std::pair{&no_decay, 0.0}}) {
      auto options = std::make_unique<torch::optim::AdamWOptions>(adamw);
      options->weight_decay(wd);
      groups.emplace_back(*params, std::move(options));
    }
    register_optimizer(std::make_unique<torch::optim::AdamW>(std::move(groups), adamw));
    register_loss(models::next_token_loss);
    register_scheduler([o](int64_t t) { return language_model_lr_factor(o, t); });
    register_dataset(std::move(train), std::move(val));
  }

  // This replica's share of the validation sequences, 16 at a time: the default's 1000 samples a
  // batch are, for sequences, gigabytes of attention scores (gpt-base: 1000 x 12 x 1024^2 floats).
  Metrics validate() override {
    const auto& val = validation_dataset();
    if (val == nullptr) return {};
    torch::NoGradGuard no_grad;
    for (auto& m : models()) m->eval();
    const int64_t all = val->size(), n = val_sequences_ > 0 ? std::min(all, val_sequences_) : all;
    const int64_t w = replica().world_size, r = replica().rank;
    const int64_t begin = r * (n / w) + std::min(r, n % w), end = begin + n / w + (r < n % w ? 1 : 0);
    std::vector<Metrics> parts;
    for (int64_t s = begin; s < end; s += kValidationBatch) {
      Batch b = val->get_batch(torch::arange(s, std::min(end, s + kValidationBatch), torch::kInt64));
      b.data = b.data.to(replica().device);
      b.target = b.target.to(replica().device);
      parts.push_back(validate_batch(b));
    }
    for (auto& m : models()) m->train();
    return parts.empty() ? Metrics{} : weighted_mean(parts);
  }

 private:
  static constexpr int64_t kValidationBatch = 16;
  int64_t val_sequences_ = 0;  // 0: all
};

}  // namespace

LanguageModelOptions language_model_options(const nlohmann::json& config) {
  if (!config.is_object()) throw ConfigError("the language model's config must be a JSON object");
  static const std::vector<std::string> known = {
      "model", "train_tokens", "val_tokens", "val_sequences", "context",      "dropout",
      "lr",    "min_lr",       "weight_decay", "beta1",       "beta2",        "warmup_steps", "decay_steps"};
  for (const auto& [k, v] : config.items()) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      throw ConfigError("unknown language model config key '" + k + "'");
    }
  }
  LanguageModelOptions o;
  try {
    o.model = config.value("model", o.model);
    o.train_tokens = config.value("train_tokens", o.train_tokens);
    o.val_tokens = config.value("val_tokens", o.val_tokens);
    o.val_sequences = integer_field(config, "val_sequences", o.val_sequences);
    o.context = integer_field(config, "context", o.context);
    o.dropout = config.value("dropout", o.dropout);
    o.lr = config.value("lr", o.lr);
    o.min_lr = config.value("min_lr", std::min(o.min_lr, o.lr));
    o.weight_decay = config.value("weight_decay", o.weight_decay);
    o.beta1 = config.value("beta1", o.beta1);
    o.beta2 = config.value("beta2", o.beta2);
    o.warmup_steps = integer_field(config, "warmup_steps", o.warmup_steps);
    o.decay_steps = integer_field(config, "decay_steps", o.decay_steps);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(std::string("language model config: a value has the wrong type: ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("language model config: ") + e.what());
  }
  validate(o);
  return o;
}

int64_t language_model_context(const LanguageModelOptions& o) {
  if (o.context > 0 || models::is_model_file(o.model)) return o.context;
  return models::gpt_options(o.model, 256).context;
}

double language_model_lr_factor(const LanguageModelOptions& o, int64_t t) {
  if (t < o.warmup_steps) return static_cast<double>(t + 1) / static_cast<double>(o.warmup_steps);
  if (o.decay_steps == 0) return 1.0;
  const double progress = std::min(1.0, static_cast<double>(t - o.warmup_steps) / static_cast<double>(o.decay_steps));
  const double floor = o.min_lr / o.lr;
  return floor + (1 - floor) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

void register_language_model() {
  static const bool once = [] {
    register_operator(kLanguageModel, [] { return std::unique_ptr<TrainingOperator>(new LanguageModel()); });
    register_operator_config_check(kLanguageModel, [](const nlohmann::json& c) { (void)language_model_options(c); });
    // The mean loss per token over a whole split: its exp is the perplexity, exact.
    register_operator_derived_metrics(kLanguageModel, [](Metrics& m) {
      if (m.count("loss")) m["perplexity"] = std::exp(m.at("loss"));
    });
    return true;
  }();
  (void)once;
}

}  // namespace dsgd
