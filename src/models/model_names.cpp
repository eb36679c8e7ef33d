#include "dsgd/model_names.h"

namespace dsgd::models {

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {"cnn", "mlp", "resnet18", "resnet50", "simulated"};
  return names;
}

}  // namespace dsgd::models
