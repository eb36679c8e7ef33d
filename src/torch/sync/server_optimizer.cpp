#include "torch/sync/server_optimizer.h"

#include <torch/optim/sgd.h>

#include <algorithm>

#include "dsgd/common/error.h"
#include "torch/state/optimizer_state.h"

namespace dsgd::torch_glue {

// Model `m`'s parameters on the servers: the torch::optim::SGD param group holding them all,
// whose options each step reads and whose state receives the servers' momentum.
ServerSteps::Optimizer server_optimizer(const TrainingOperator& op, size_t m,
                                           const std::vector<torch::Tensor>& params) {
  auto contains = [](const std::vector<torch::Tensor>& group, const torch::Tensor& p) {
    return std::any_of(group.begin(), group.end(),
                       [&](const torch::Tensor& q) { return q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl(); });
  };
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    torch::optim::Optimizer* opt = &op.optimizer(k);
    for (size_t g = 0; g < opt->param_groups().size(); ++g) {
      const auto& group = opt->param_groups()[g].params();
      if (!contains(group, params[0])) continue;
      auto* sgd = dynamic_cast<torch::optim::SGD*>(opt);
      const bool all =
          std::all_of(params.begin(), params.end(), [&](const torch::Tensor& p) { return contains(group, p); });
      if (sgd == nullptr || !all) {
        throw ConfigError("the ps servers apply SGD themselves (ps_update_on_shards, ps_async), so model " +
                          std::to_string(m) + "'s parameters must all be in one param group of a " +
                          "torch::optim::SGD; " +
                          (sgd == nullptr ? "its optimizer is another kind" : "they are spread over several groups") +
                          ". Use SGD, or allreduce or ps without update on shards");
      }
      ServerSteps::Optimizer o;
      o.options = [sgd, g] {
        const auto& x = static_cast<const torch::optim::SGDOptions&>(sgd->param_groups()[g].options());
        return strategy::SgdOptions{static_cast<float>(x.lr()), static_cast<float>(x.momentum()),
                                    static_cast<float>(x.dampening()), static_cast<float>(x.weight_decay()),
                                    x.nesterov()};
      };
      o.momentum = [sgd, params](size_t i) {
        auto it = sgd->state().find(optimizer_state_key(*sgd, params[i]));
        if (it == sgd->state().end()) return torch::Tensor();
        return static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
      };
      o.set_momentum = [sgd, params](size_t i, torch::Tensor t) {
        if (!t.defined()) {
          sgd->state().erase(optimizer_state_key(*sgd, params[i]));
          return;
        }
        auto state = std::make_unique<torch::optim::SGDParamState>();
        state->momentum_buffer(std::move(t));
        sgd->state()[optimizer_state_key(*sgd, params[i])] = std::move(state);
      };
      return o;
    }
  }
  throw ConfigError("the ps servers apply SGD themselves (ps_update_on_shards, ps_async), but model " +
                    std::to_string(m) + "'s parameters are in no optimizer; register a torch::optim::SGD for them "
                    "in setup");
}


}  // namespace dsgd::torch_glue
