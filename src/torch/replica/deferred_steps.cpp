#include "torch/replica/deferred_steps.h"

#include <unordered_set>
#include <utility>

#include "dsgd/common/error.h"
#include "dsgd/common/log.h"

namespace dsgd::torch_glue {

DeferredSteps::DeferredSteps(TrainingOperator& op, NonfinitePolicy policy, bool warn)
    : op_(op), policy_(policy), warn_(warn) {}

void DeferredSteps::reset(size_t syncs) { steps_.assign(syncs, Step{}); }

void DeferredSteps::begin(size_t sync, std::string where) {
  auto& d = steps_.at(sync);
  d.lrs.clear();
  for (size_t k = 0; k < op_.num_optimizers(); ++k) {
    d.lrs.emplace_back();
    for (const auto& g : op_.optimizer(k).param_groups()) d.lrs.back().push_back(g.options().get_lr());
  }
  d.where = std::move(where);
  d.skipped = false;
}

bool DeferredSteps::apply(size_t sync, const std::vector<torch::Tensor>& params, bool finite) {
  auto& d = steps_.at(sync);
  if (!finite) {
    if (policy_ == NonfinitePolicy::kError) {
      throw Error("non-finite gradient at " + d.where + " (a NaN or infinite loss on some replica); lower the " +
                  "learning rate, check the data, or set nonfinite_policy \"skip\"");
    }
    if (d.skipped) return false;
    d.skipped = true;
    if (warn_) {
      dsgd::log().warn("non-finite gradient at {}: the buckets holding it skipped the step on every replica "
                       "(with forward overlap each bucket steps on its own)", d.where);
    }
    return true;
  }
  std::unordered_set<const void*> mine;
  for (const auto& p : params) mine.insert(p.unsafeGetTensorImpl());
  // Each optimizer holding some of these parameters steps with only theirs visible (the others'
  // .grad hidden meanwhile), at the learning rates of the step they belong to.
  for (size_t k = 0; k < op_.num_optimizers(); ++k) {
    auto& groups = op_.optimizer(k).param_groups();
    bool owns = false;
    for (const auto& g : groups) {
      for (const auto& p : g.params()) owns = owns || mine.count(p.unsafeGetTensorImpl()) > 0;
    }
    if (!owns) continue;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> hidden;
    std::vector<double> lrs;
    for (size_t g = 0; g < groups.size(); ++g) {
      for (auto& p : groups[g].params()) {
        if (mine.count(p.unsafeGetTensorImpl()) == 0 && p.grad().defined()) {
          hidden.emplace_back(p, p.grad());
          p.mutable_grad() = torch::Tensor();
        }
      }
      lrs.push_back(groups[g].options().get_lr());
      if (k < d.lrs.size() && g < d.lrs[k].size()) groups[g].options().set_lr(d.lrs[k][g]);
    }
    auto restore = [&] {
      for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(lrs[g]);
      for (auto& [p, grad] : hidden) p.mutable_grad() = grad;
    };
    try {
      op_.optimizer(k).step();
    } catch (...) {
      restore();
      throw;
    }
    restore();
  }
  return false;
}

}  // namespace dsgd::torch_glue
