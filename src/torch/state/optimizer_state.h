// The key torch::optim::Optimizer files a parameter's state under: its TensorImpl, spelled as a
// string by LibTorch 1.x (c10::guts::to_string) and as the pointer itself by 2.x.
//
//   auto it = sgd.state().find(optimizer_state_key(sgd, p));
#pragma once

#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace dsgd::torch_glue {

template <typename Optimizer>
auto optimizer_state_key(Optimizer& optimizer, const torch::Tensor& p) {
  using Key = typename std::decay_t<decltype(optimizer.state())>::key_type;
  c10::TensorImpl* impl = p.unsafeGetTensorImpl();
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << impl;
    return out.str();
  } else {
    return Key(impl);
  }
}

}  // namespace dsgd::torch_glue
