// A torch::optim::Optimizer's per-parameter state, whatever its kind, without naming its fields:
// the key a parameter's state is filed under, the state as named values (as LibTorch's own
// serialisation writes them), and states installed through the optimizer's own load, which
// makes each of its kind. What ZeRO slices and joins (torch/sync/zero.h) and sharded
// checkpoints write field by field (torch/replica/state_shares.cpp).
//
//   auto it = sgd.state().find(optimizer_state_key(sgd, p));
//   StateFields fields = state_fields(*it->second);        // {"momentum_buffer", tensor}
//   install_states(sgd, {{archive_key(p), fields}});
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

// One parameter's optimizer state as its named values, as the state serialises them (LibTorch's
// own kinds: the state's own tensors, not copies).
using StateFields = std::vector<std::pair<std::string, c10::IValue>>;
StateFields state_fields(const torch::optim::OptimizerParamState& state);
StateFields state_fields(torch::serialize::InputArchive& archive);
void write_fields(torch::serialize::OutputArchive& archive, const StateFields& fields);
std::string bytes_of(torch::serialize::OutputArchive& archive);
// A parameter's name in an optimizer's archive (its TensorImpl, as LibTorch 1.x spells it).
std::string archive_key(const torch::Tensor& p);
// A field that holds a value per element of `p`: a tensor shaped like it.
bool per_element(const c10::IValue& v, const torch::Tensor& p);
// Files `states` (key: archive_key of a parameter in opt's groups) through opt.load, which makes
// each state of the optimizer's own kind; the groups' options stay.
void install_states(torch::optim::Optimizer& opt, const std::vector<std::pair<std::string, StateFields>>& states);

}  // namespace dsgd::torch_glue
