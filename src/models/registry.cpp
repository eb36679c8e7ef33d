#include <torch/nn/module.h>
#include <torch/types.h>

#include "dsgd/common/error.h"
#include "models/zoo.h"

namespace dsgd::models {

namespace {

// Lays out every 4-D parameter (the convolution weights) channels_last; moving the model to a
// device keeps the layout.
std::shared_ptr<Classifier> laid_out(std::shared_ptr<Classifier> model, const ModelOptions& o) {
  if (!o.channels_last) return model;
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  return model;
}

}  // namespace

std::shared_ptr<Classifier> make_model(const std::string& name, const ModelOptions& o) {
  if (o.in_channels < 1 || o.image_size < 1 || o.num_classes < 1) {
    throw ConfigError("model '" + name + "': in_channels, image_size and num_classes must be >= 1 (got " +
                      std::to_string(o.in_channels) + ", " + std::to_string(o.image_size) + ", " +
                      std::to_string(o.num_classes) + ")");
  }
  if (is_model_file(name)) return laid_out(load_scripted(name, o), o);
  if (o.channels_last && (name == "mlp" || name == "simulated")) {
    throw ConfigError("model '" + name + "' has no convolutions: channels_last applies to cnn, resnet18 and resnet50");
  }
  if (name == "cnn") {
    if (o.image_size < 6) {
      throw ConfigError("model 'cnn' needs images of at least 6x6 pixels (two 3x3 convolutions "
                        "and a 2x2 pool); got " + std::to_string(o.image_size));
    }
    return laid_out(make_cnn(o), o);
  }
  if (name == "mlp") {
    for (int64_t h : o.mlp_hidden) {
      if (h < 1) throw ConfigError("model 'mlp': hidden widths must be >= 1, got " + std::to_string(h));
    }
    return make_mlp(o);
  }
  if (name == "resnet18") return laid_out(make_resnet(18, o), o);
  if (name == "resnet50") return laid_out(make_resnet(50, o), o);
  if (name == "simulated") {
    if (o.sim_layers < 1 || o.sim_parameters < o.sim_layers || !(o.sim_step_ms >= 0)) {
      throw ConfigError("model 'simulated': needs sim_layers >= 1, sim_parameters >= sim_layers and sim_step_ms >= 0 "
                        "(got " + std::to_string(o.sim_layers) + ", " + std::to_string(o.sim_parameters) + ", " +
                        std::to_string(o.sim_step_ms) + ")");
    }
    return make_simulated(o);
  }
  std::string known;
  for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("unknown model '" + name + "'; known models: " + known +
                    ", or a TorchScript file (ending in .pt or .pth)");
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace dsgd::models
