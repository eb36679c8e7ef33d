// dsgd/torch/self_contained_model.h — a model that is a program of its own. Torch-free.
#pragma once

#include <string>

namespace dsgd {

// A model that is a program of its own (a TorchScript module): model.pt (Trainer::save, the
// checkpoints' model file) holds what model_file() writes, with the current weights, instead of
// a name -> tensor dict. Implemented by models::ScriptedModel.
class SelfContainedModel {
 public:
  virtual ~SelfContainedModel() = default;
  virtual std::string model_file() const = 0;
};

}  // namespace dsgd
