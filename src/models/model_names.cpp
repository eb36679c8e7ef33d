#include "dsgd/models/model_names.h"

namespace dsgd::models {

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {"cnn", "mlp", "resnet18", "resnet50", "simulated"};
  return names;
}

bool is_model_file(const std::string& name) {
  const auto ends_with = [&](const std::string& tail) {
    return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends_with(".pt") || ends_with(".pth") || name.find('/') != std::string::npos;
}

}  // namespace dsgd::models
