#include "torch/zero.h"

#include <torch/optim.h>
#include <torch/serialize.h>

#include <algorithm>
#include <numeric>
#include <sstream>

#include "torch/optimizer_state.h"

namespace dsgd::torch_glue {

std::vector<int> partition_by_size(const std::vector<int64_t>& numels, int ranks) {
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  std::vector<int64_t> load(static_cast<size_t>(std::max(1, ranks)), 0);
  std::vector<int> owner(numels.size(), 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    owner[i] = static_cast<int>(least);
    load[static_cast<size_t>(least)] += numels[i];
  }
  return owner;
}

bool OwnedSet::owns(const torch::Tensor& p) const {
  const void* impl = p.unsafeGetTensorImpl();
  return owned.count(impl) > 0 || sharded.count(impl) == 0;
}

void drop_unowned_state(TrainingOperator& op, const OwnedSet& owned) {
  if (owned.empty()) return;
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    auto& opt = op.optimizer(k);
    for (auto& group : opt.param_groups()) {
      for (auto& p : group.params()) {
        if (!owned.owns(p)) opt.state().erase(optimizer_state_key(opt, p));
      }
    }
  }
}

void gather_optimizer_state(TrainingOperator& op, strategy::Sharing& sharing, bool keep) {
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    auto& opt = op.optimizer(k);
    std::string mine;
    {
      torch::serialize::OutputArchive archive;
      opt.save(archive);  // the state this replica holds: its share
      std::ostringstream out;
      archive.save_to(out);
      mine = out.str();
    }
    for (int r = 0; r < sharing.size(); ++r) {
      std::string bytes = r == sharing.rank() ? mine : std::string();
      sharing.broadcast_bytes(&bytes, r);
      if (!keep || r == sharing.rank()) continue;
      // Optimizer::load files each saved parameter's state under the parameter at the same place
      // in the param groups and leaves the others' as they are: a merge.
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
      opt.load(archive);
    }
  }
}

namespace {

int64_t bytes_of(const torch::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

int64_t state_bytes(const torch::optim::OptimizerParamState& s) {
  namespace o = torch::optim;
  if (const auto* x = dynamic_cast<const o::SGDParamState*>(&s)) return bytes_of(x->momentum_buffer());
  if (const auto* x = dynamic_cast<const o::AdamParamState*>(&s)) {
    return bytes_of(x->exp_avg()) + bytes_of(x->exp_avg_sq()) + bytes_of(x->max_exp_avg_sq());
  }
  if (const auto* x = dynamic_cast<const o::AdamWParamState*>(&s)) {
    return bytes_of(x->exp_avg()) + bytes_of(x->exp_avg_sq()) + bytes_of(x->max_exp_avg_sq());
  }
  if (const auto* x = dynamic_cast<const o::RMSpropParamState*>(&s)) {
    return bytes_of(x->square_avg()) + bytes_of(x->momentum_buffer()) + bytes_of(x->grad_avg());
  }
  if (const auto* x = dynamic_cast<const o::AdagradParamState*>(&s)) return bytes_of(x->sum());
  return 0;
}

}  // namespace

int64_t optimizer_state_bytes(const TrainingOperator& op) {
  int64_t total = 0;
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    for (const auto& [key, state] : op.optimizer(k).state()) total += state ? state_bytes(*state) : 0;
  }
  return total;
}

}  // namespace dsgd::torch_glue
