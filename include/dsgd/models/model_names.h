// dsgd/models/model_names.h — the reference models' names, without LibTorch (config checks use it).
#pragma once

#include <string>
#include <vector>

namespace dsgd::models {

// The names make_model accepts: cnn, mlp, resnet18, resnet50, simulated.
const std::vector<std::string>& model_names();

// True where `name` is a model file rather than a reference model's name: it ends in .pt or
// .pth, or holds a '/'. make_model loads such a file as a TorchScript module (ScriptedModel).
bool is_model_file(const std::string& name);

}  // namespace dsgd::models
