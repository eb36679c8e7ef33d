// Every parameter and buffer of an operator's models, then every optimizer's per-parameter
// state tensors in its groups' order, as one flat float64 tensor: two replicas' are equal
// exactly when their weights and optimizer states are. AdamW's step and moments and SGD's
// momentum are known here; `other` appends a state of another kind (and may check what it sees).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "dsgd/torch/operator.h"
#include "torch/state/optimizer_state.h"
#include "torch/state/replica_state.h"

namespace dsgd::testing {

using OtherState = std::function<void(const torch::optim::OptimizerParamState&, std::vector<torch::Tensor>*)>;

inline torch::Tensor state_tensors(TrainingOperator& op, const OtherState& other = {}) {
  std::vector<torch::Tensor> parts;
  for (const auto& [name, t] : torch_glue::named_tensors(op)) parts.push_back(t.flatten().to(torch::kFloat64));
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    auto& opt = op.optimizer(k);
    for (auto& group : opt.param_groups()) {
      for (auto& p : group.params()) {
        const auto it = opt.state().find(torch_glue::optimizer_state_key(opt, p));
        if (it == opt.state().end()) continue;
        if (const auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get())) {
          parts.push_back(torch::tensor({static_cast<double>(a->step())}, torch::kFloat64));
          parts.push_back(a->exp_avg().flatten().to(torch::kFloat64));
          parts.push_back(a->exp_avg_sq().flatten().to(torch::kFloat64));
          if (a->max_exp_avg_sq().defined()) parts.push_back(a->max_exp_avg_sq().flatten().to(torch::kFloat64));
        } else if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(it->second.get())) {
          parts.push_back(s->momentum_buffer().flatten().to(torch::kFloat64));
        } else if (other) {
          other(*it->second, &parts);
        }
      }
    }
  }
  return torch::cat(parts);
}

}  // namespace dsgd::testing
