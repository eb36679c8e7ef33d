// A TorchScript module as a Classifier (dsgd/models/registry.h: ScriptedModel). The torch::nn::Module
// side is a mirror: one empty Module per script submodule, holding the script's own parameter
// and buffer tensors under the same names. Everything the runtime does to a model's tensors
// (copy_ on a restore, set_data on a device move, .grad from backward) therefore reaches the
// script, which computes the forward pass.
#include <torch/script.h>

#include <sstream>

#include "dsgd/common/error.h"
#include "dsgd/models/registry.h"
#include "dsgd/torch/parameter_gate.h"
#include "models/zoo.h"

namespace dsgd::models {

struct ScriptedModel::Script {
  torch::jit::Module module;
};

namespace {

void mirror(torch::nn::Module& into, const torch::jit::Module& from) {
  for (const auto& p : from.named_parameters(/*recurse=*/false)) {
    into.register_parameter(p.name, p.value, p.value.requires_grad());
  }
  for (const auto& b : from.named_buffers(/*recurse=*/false)) into.register_buffer(b.name, b.value);
  for (const auto& child : from.named_children()) {
    auto m = std::make_shared<torch::nn::Module>();
    mirror(*m, child.value);
    into.register_module(child.name, m);
  }
}

// c10::Error's message runs on with a C++ backtrace: its first line says what went wrong.
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// `what` ("model", "loss") names the file's role in messages.
torch::jit::Module load_module(const std::string& path, const std::string& what) {
  torch::jit::Module m;
  try {
    m = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    throw ConfigError(what + " file '" + path + "': torch.jit.load cannot read it (" +
                      first_line(e.what_without_backtrace()) + "); save a " + what +
                      " with torch.jit.save(torch.jit.script(" + what + "), '" + path + "')");
  }
  if (!m.find_method("forward")) {
    throw ConfigError(what + " file '" + path + "': the TorchScript module has no forward method");
  }
  return m;
}

}  // namespace

std::shared_ptr<ScriptedModel> ScriptedModel::load(const std::string& path) {
  auto script = std::make_unique<Script>();
  script->module = load_module(path, "model");
  return std::shared_ptr<ScriptedModel>(new ScriptedModel(std::move(script), path));
}

std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> load_scripted_loss(const std::string& path) {
  torch::jit::Module m = load_module(path, "loss");
  return [m, path](const torch::Tensor& output, const torch::Tensor& target) mutable {
    const c10::IValue loss = m.forward({output, target});
    if (!loss.isTensor() || loss.toTensor().numel() != 1) {
      throw ConfigError("loss file '" + path + "': forward(output, target) must return the loss as one number");
    }
    return loss.toTensor();
  };
}

ScriptedModel::ScriptedModel(std::unique_ptr<Script> script, std::string path)
    : script_(std::move(script)), path_(std::move(path)) {
  mirror(*this, script_->module);
  torch::nn::Module::train(script_->module.is_training());
}

ScriptedModel::~ScriptedModel() = default;

torch::Tensor ScriptedModel::forward(const torch::Tensor& x) {
  wait_for_parameters(*this);  // the script's layers are out of reach: all of them first
  const c10::IValue out = script_->module.forward({x});
  if (!out.isTensor()) {
    throw ConfigError("model file '" + path_ + "': forward returned " + std::string(out.tagKind()) +
                      "; dsgd needs one tensor (the logits)");
  }
  return out.toTensor();
}

void ScriptedModel::train(bool on) {
  torch::nn::Module::train(on);
  script_->module.train(on);
}

namespace {

// `net`'s output on `input` (in eval mode: BatchNorm's statistics stay as they are); ConfigError
// naming the file unless it is `expected`.
void check_output(ScriptedModel& net, const torch::Tensor& input, const std::string& input_name,
                  const std::vector<int64_t>& expected, const std::string& hint) {
  torch::NoGradGuard no_grad;
  const bool training = net.is_training();
  net.eval();
  std::ostringstream shapes;
  shapes << input_name << " " << input.sizes();
  torch::Tensor out;
  try {
    out = net.forward(input);
  } catch (const c10::Error& e) {
    throw ConfigError("model file '" + net.path() + "' fails on " + shapes.str() + ": " +
                      first_line(e.what_without_backtrace()));
  }
  net.train(training);
  if (out.sizes() != torch::IntArrayRef(expected)) {
    std::ostringstream message;
    message << "model file '" << net.path() << "' returns " << out.sizes() << " for " << shapes.str() << "; " << hint;
    throw ConfigError(message.str());
  }
}

}  // namespace

std::shared_ptr<Classifier> load_scripted(const std::string& path, const ModelOptions& o) {
  auto net = ScriptedModel::load(path);
  std::vector<int64_t> shape = {2, o.in_channels, o.image_size, o.image_size};
  if (!o.input_shape.empty()) {
    shape = {2};
    shape.insert(shape.end(), o.input_shape.begin(), o.input_shape.end());
  }
  check_output(*net, torch::zeros(shape), o.input_shape.empty() ? "images" : "inputs", {2, o.num_classes},
               "the data has " + std::to_string(o.num_classes) + " classes: its forward must return [N, " +
                   std::to_string(o.num_classes) + "] logits");
  return net;
}

std::shared_ptr<ScriptedModel> load_scripted_language_model(const std::string& path, int64_t context,
                                                            int64_t vocab_size) {
  auto net = ScriptedModel::load(path);
  check_output(*net, torch::zeros({2, context}, torch::kInt64), "tokens", {2, context, vocab_size},
               "the tokens have a vocabulary of " + std::to_string(vocab_size) +
                   ": its forward must return [N, T, " + std::to_string(vocab_size) + "] logits");
  return net;
}

std::string ScriptedModel::model_file() const {
  std::ostringstream out;
  script_->module.save(out);
  return std::move(out).str();
}

}  // namespace dsgd::models
