#include "runtime/worker/job_spec.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "dsgd/common/error.h"
#include "dsgd/runtime/settings.h"
#include "strategy/strategy.h"
#include "torch/replica/device.h"
#include "torch/replica/replica.h"
#include "torch/state/replica_state.h"

namespace dsgd::runtime {
namespace {

// The groups that stay with the driver: who starts the workers, where checkpoints go, what it serves.
bool driver_only(const std::string& path) {
  for (const char* group : {"launch.", "checkpoints.", "monitor."}) {
    if (path.rfind(group, 0) == 0) return true;
  }
  return false;
}

}  // namespace

TrainerConfig resolved(const TrainerConfig& config) {
  TrainerConfig c = config;
  if (c.threads_per_worker == 0 && c.launch.listen.empty()) {
    c.threads_per_worker = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / c.num_workers);
  }
  if (const int shard_processes = ps_shard_processes(c); shard_processes > 0) c.ps.shards = shard_processes;
  return c;
}

proto::JobSpec make_job_spec(const std::string& op, const TrainerConfig& config) {
  const TrainerConfig c = resolved(config);
  nlohmann::json settings = nlohmann::json::object();
  const nlohmann::json all = settings_of(c);
  for (const auto& [path, value] : all.items()) {
    if (!driver_only(path)) settings[path] = value;
  }
  proto::JobSpec s;
  s.set_operator_name(op);
  s.set_operator_config(c.config.dump());
  s.set_settings(settings.dump());
  return s;
}

TrainerConfig job_settings(const proto::JobSpec& spec) {
  TrainerConfig c;
  try {
    apply_settings(c, nlohmann::json::parse(spec.settings()));
    c.config = nlohmann::json::parse(spec.operator_config());
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("the job spec's settings are not JSON (" + std::string(e.what()) +
                      "): are the driver and this process from different dsgd versions?");
  } catch (const ConfigError& e) {
    throw ConfigError("the job spec's settings do not read here (" + std::string(e.what()) +
                      "): are the driver and this process from different dsgd versions?");
  }
  return c;
}

torch_glue::ReplicaOptions replica_options(const TrainerConfig& job, const ReplicaInfo& info, int threads) {
  torch_glue::ReplicaOptions o;
  o.info = info;
  o.seed = job.seed;
  o.global_batch = job.batch_size;
  o.grad_shard_bytes = static_cast<size_t>(job.comm.grad_shard_bytes);
  o.step = job.step;
  o.step.loss_scale = loss_scale_of(job);  // 0 = off, else the initial scale
  o.threads = threads;
  o.overlap = job.comm.overlap;
  o.forward_overlap_buckets = job.comm.forward_overlap_buckets;
  o.info.device =
      torch_glue::replica_device(job.device.value(), info.worker * job.devices_per_worker + info.local_replica);
  return o;
}

strategy::StrategyOptions strategy_options(const TrainerConfig& job) {
  strategy::StrategyOptions o;
  o.kind = job.strategy.value();
  o.allreduce_algo = job.comm.allreduce_algo.value();
  o.num_ps_shards = job.ps.shards;
  o.ps_update_on_shards = job.ps.update_on_shards;
  o.ps_placement = job.ps.placement.value();
  o.max_staleness = job.ps.max_staleness;
  o.compression = {.kind = job.comm.compression.value(),
                   .powersgd_rank = job.comm.powersgd_rank,
                   .powersgd_start_steps = job.comm.powersgd_start_steps,
                   .seed = job.seed};
  return o;
}

std::string tensors_checksum(const std::vector<torch::Tensor>& tensors) {
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    const auto c = t.detach().to(torch::kCPU).contiguous();
    const auto* data = static_cast<const Bytef*>(c.data_ptr());
    for (size_t at = 0; at < c.nbytes(); at += 1u << 30) {  // uInt lengths
      crc = crc32(crc, data + at, static_cast<uInt>(std::min<size_t>(1u << 30, c.nbytes() - at)));
    }
    bytes += c.nbytes();
  }
  char out[40];
  std::snprintf(out, sizeof out, "%08lx-%llu", static_cast<unsigned long>(crc), static_cast<unsigned long long>(bytes));
  return out;
}

proto::SetupReply setup_reply(const std::vector<std::unique_ptr<torch_glue::ReplicaRuntime>>& all,
                              const TrainerConfig& job, int world) {
  auto& replica = *all.at(0);
  const auto replicas = static_cast<int64_t>(all.size());
  proto::SetupReply out;
  out.set_signature(replica.signature());
  int64_t parameters = 0;
  for (const auto& m : replica.op().models()) {
    for (const auto& p : m->parameters()) parameters += p.requires_grad() ? p.numel() : 0;
  }
  out.set_parameters(parameters);
  const auto bucket_bytes = static_cast<size_t>(job.comm.grad_shard_bytes);
  for (int stage = 0; stage <= 3; ++stage) {
    const auto need = torch_glue::memory_need(replica.op(), bucket_bytes, stage, world);
    auto* m = out.add_memory();
    m->set_parameters(need.parameters * replicas);
    m->set_gradients(need.gradients * replicas);
    m->set_optimizer_state(need.optimizer_state * replicas);
  }
  const auto digest_of = [](torch_glue::ReplicaRuntime& r) {
    std::vector<torch::Tensor> tensors;
    for (const auto& [name, t] : torch_glue::named_tensors(r.op())) tensors.push_back(t);
    return tensors_checksum(tensors);
  };
  std::string digest = digest_of(replica);
  for (size_t i = 1; i < all.size() && !digest.empty(); ++i) {
    if (digest_of(*all[i]) != digest) digest.clear();
  }
  out.set_start_digest(digest);
  return out;
}

}  // namespace dsgd::runtime
