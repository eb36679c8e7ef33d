#include "torch/sync/zero.h"

#include <torch/optim.h>
#include <torch/serialize.h>

#include <algorithm>
#include <numeric>

#include "torch/state/optimizer_state.h"

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

namespace {
torch::Device first_parameter_device(torch::optim::Optimizer& opt) {
  for (auto& group : opt.param_groups()) {
    if (!group.params().empty()) return group.params().front().device();
  }
  return torch::kCPU;
}
}  // namespace

void gather_optimizer_state(TrainingOperator& op, strategy::Sharing& sharing, bool keep) {
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    auto& opt = op.optimizer(k);
    std::string mine;
    torch::serialize::OutputArchive archive;
    opt.save(archive);  // the state this replica holds: its share
    archive.save_to([&mine](const void* data, size_t n) {  // straight into the string, as save_replica_state
      mine.append(static_cast<const char*>(data), n);
      return n;
    });
    for (int r = 0; r < sharing.size(); ++r) {
      std::string bytes = r == sharing.rank() ? mine : std::string();
      sharing.broadcast_bytes(&bytes, r);
      if (!keep || r == sharing.rank()) continue;
      // Optimizer::load files each saved parameter's state under the parameter at the same place
      // in the param groups and leaves the others' as they are: a merge.
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size(), first_parameter_device(opt));  // beside the parameters
      opt.load(archive);
    }
  }
}

}  // namespace dsgd::torch_glue
