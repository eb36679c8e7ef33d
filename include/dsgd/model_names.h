// dsgd/model_names.h — the reference models' names, without LibTorch (config checks use it).
#pragma once

#include <string>
#include <vector>

namespace dsgd::models {

// The names make_model accepts: cnn, mlp, resnet18, resnet50.
const std::vector<std::string>& model_names();

}  // namespace dsgd::models
