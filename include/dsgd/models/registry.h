// dsgd/models/registry.h — the reference models, selectable by name.
//
//   auto model = dsgd::models::make_model("cnn");          // the PyTorch MNIST example's CNN
//   torch::Tensor logits = model->forward(images);          // [N, 1, 28, 28] -> [N, 10]
//
//   name       layout                                                    parameters (defaults)
//   cnn        conv 1->32 3x3, relu, conv 32->64 3x3, relu, maxpool 2,   1,199,882
//              dropout .25, fc 9216->128, relu, dropout .5, fc 128->10
//   mlp        784-2048-2048-10 with relu (communication-bound bench)    5,824,522
//   resnet18   torchvision's ResNet-18 (BasicBlock 2-2-2-2)              11.2 M (3x224x224, 1000 classes: 11,689,512)
//   resnet50   torchvision's ResNet-50 (Bottleneck 3-4-6-3)              23.5 M (3x224x224, 1000 classes: 25,557,032)
//   simulated  no compute: sim_layers parameter tensors whose forward    sim_parameters + a linear head
//              and backward sleep sim_step_ms in all (1/3 forward, 2/3
//              backward); gradients of the real size appear layer by
//              layer as backward reaches them (cluster benchmarks)
//   FILE.pt    a TorchScript module saved in Python (ScriptedModel      the script's
//              below): any name ending in .pt or .pth, or with a '/'
//
// ResNets use torchvision's stem (7x7 stride 2 + max pool) for images of 64 pixels or more and
// a 3x3 stride-1 stem without pooling for small images such as 28x28. make_model throws
// dsgd::ConfigError for an unknown name (listing the known ones) or inconsistent options
// (channels_last for a model without convolutions).
// Models are ordinary torch::nn::Modules; seed with torch::manual_seed before make_model for
// reproducible initial weights.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsgd/models/model_names.h"
#include "dsgd/torch/self_contained_model.h"

namespace dsgd::models {

struct ModelOptions {
  int64_t in_channels = 1;                   // image channels
  int64_t image_size = 28;                   // height = width, pixels
  int64_t num_classes = 10;                  // outputs (logits)
  std::vector<int64_t> input_shape = {};     // a model file's: one sample's shape, where the data
                                             // are not images (empty: [in_channels, image_size,
                                             // image_size])
  bool dropout = true;                       // false: dropout layers become identities (for
                                             // bit-exact equivalence tests)
  bool sync_batchnorm = false;               // resnets: BatchNorm over every replica's samples
                                             // (dsgd::SyncBatchNorm2d); false: each replica's own
  bool channels_last = false;                // cnn, resnets: convolution weights and images in
                                             // channels_last (NHWC) memory, the layout of
                                             // cuDNN's fastest kernels; the same values
  std::vector<int64_t> mlp_hidden = {2048, 2048};  // hidden widths of "mlp"
  int64_t sim_parameters = 1'000'000;        // "simulated": gradient elements (besides the head)
  int64_t sim_layers = 8;                    // "simulated": in this many equal tensors
  double sim_step_ms = 50;                   // "simulated": forward + backward time per step
};

// An image classifier: images [N, C, H, W] -> logits [N, num_classes].
class Classifier : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& images) = 0;
};

std::shared_ptr<Classifier> make_model(const std::string& name, const ModelOptions& options = {});

// Total number of parameter elements (trainable tensors only).
int64_t parameter_count(const torch::nn::Module& module);

// A loss from Python: a TorchScript module (torch.jit.save(torch.jit.script(loss), path)) whose
// forward(output, target) returns the loss as a scalar tensor. ConfigError naming the file when
// torch.jit.load cannot read it or it has no forward.
std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> load_scripted_loss(const std::string& path);

// A TorchScript module made in Python (torch.jit.save(torch.jit.script(net), path), or traced)
// as a Classifier: its parameters and buffers are the module's own tensors, under the names
// Python gives them ("conv1.weight", "features.0.bias"), so training this trains the script,
// and model_file() writes it back for torch.jit.load with the weights it has now. forward calls
// the script's forward(x); train()/eval() set its training flag (Dropout, BatchNorm).
//
//   auto net = ScriptedModel::load("cnn.pt");         // ConfigError naming the file if unreadable
//   auto logits = net->forward(images);
class ScriptedModel : public Classifier, public SelfContainedModel {
 public:
  static std::shared_ptr<ScriptedModel> load(const std::string& path);
  ~ScriptedModel() override;
  torch::Tensor forward(const torch::Tensor& x) override;
  void train(bool on = true) override;
  std::string model_file() const override;  // the bytes torch.jit.save would write
  const std::string& path() const { return path_; }

 private:
  struct Script;  // the torch::jit::Module (kept out of this header: torch/script.h is heavy)
  ScriptedModel(std::unique_ptr<Script> script, std::string path);
  std::unique_ptr<Script> script_;
  std::string path_;
};

// A TorchScript language model: forward(tokens int64 [N, context]) -> logits [N, context,
// vocab_size] (as dsgd/models/gpt.h's). ConfigError naming the file, when it cannot be read or gives
// other shapes on two blank sequences.
std::shared_ptr<ScriptedModel> load_scripted_language_model(const std::string& path, int64_t context,
                                                            int64_t vocab_size);

}  // namespace dsgd::models
