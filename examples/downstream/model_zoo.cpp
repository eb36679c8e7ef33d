// model_zoo: builds every reference model, runs one synthetic batch through it, and prints
//   cnn       1199882 parameters, logits [8, 10]
//   ...
// Build: see CMakeLists.txt beside this file. Exits 1 if any model gives the wrong shape.
#include <dsgd/data/datasets.h>
#include <dsgd/models/registry.h>

#include <cstdio>

int main() {
  auto data = dsgd::data::make_synthetic({.num_samples = 8, .channels = 1, .image_size = 28, .num_classes = 10});
  for (const auto& name : dsgd::models::model_names()) {
    auto model = dsgd::models::make_model(name);
    model->eval();
    auto logits = model->forward(data.images());
    std::printf("%-9s %9lld parameters, logits [%lld, %lld]\n", name.c_str(),
                static_cast<long long>(dsgd::models::parameter_count(*model)),
                static_cast<long long>(logits.size(0)), static_cast<long long>(logits.size(1)));
    if (logits.size(0) != 8 || logits.size(1) != 10) return 1;
  }
  return 0;
}
