// What a replica shares of its BatchNorm layers with the others: the batch statistics
// SyncBatchNorm sums in forward and backward (dsgd/torch/sync_batchnorm.h), and the running statistics
// averaged after every step.
#include <torch/types.h>
#include <torch/utils.h>

#include <string>
#include <vector>

#include "comm/timeline.h"
#include "dsgd/common/error.h"
#include "torch/replica/replica.h"

namespace dsgd::torch_glue {

void ReplicaRuntime::sum(float* data, size_t count) {
  if (syncs_.at(0)->updates_on_servers()) {
    throw ConfigError("sync_batchnorm sums every layer's statistics over the replicas: it needs a strategy that "
                      "averages (allreduce, simple, or ps without ps.update_on_shards), not one whose servers step");
  }
  comm::timeline::Span span("sum batch statistics");
  syncs_.at(0)->strategy().average_async(data, count)->wait();
  const float replicas = static_cast<float>(options_.info.world_size);
  for (size_t i = 0; i < count; ++i) data[i] *= replicas;
}

void ReplicaRuntime::sync_statistics() {
  if (syncs_.empty() || syncs_[0]->updates_on_servers()) return;
  std::vector<torch::Tensor> stats;
  int64_t total = 0;
  const auto is_stat = [](const std::string& name) {
    for (const std::string end : {"running_mean", "running_var"}) {
      if (name.size() >= end.size() && name.compare(name.size() - end.size(), end.size(), end) == 0) return true;
    }
    return false;
  };
  for (const auto& m : op_->models()) {
    for (const auto& b : m->named_buffers()) {
      if (!is_stat(b.key()) || b.value().scalar_type() != torch::kFloat32) continue;
      stats.push_back(b.value());
      total += b.value().numel();
    }
  }
  if (stats.empty()) return;
  comm::timeline::Span span("average running statistics");
  torch::NoGradGuard no_grad;
  if (stats_flat_.numel() != total) stats_flat_ = torch::empty({total}, torch::kFloat32);
  int64_t at = 0;
  for (const auto& s : stats) {
    stats_flat_.slice(0, at, at + s.numel()).copy_(s.reshape({-1}));
    at += s.numel();
  }
  syncs_[0]->strategy().average_async(stats_flat_.data_ptr<float>(), static_cast<size_t>(total))->wait();
  at = 0;
  for (auto& s : stats) {
    s.copy_(stats_flat_.slice(0, at, at + s.numel()).view(s.sizes()));
    at += s.numel();
  }
}

}  // namespace dsgd::torch_glue
