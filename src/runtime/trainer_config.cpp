#include "runtime/trainer_config.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "dsgd/error.h"
#include "dsgd/operator.h"
#include "runtime/worker.h"

namespace dsgd::runtime {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw ConfigError(what);
}

}  // namespace

void validate_trainer_config(const std::string& op, const TrainerConfig& c) {
  require(!op.empty(), "no operator name given");
  if (!has_operator(op)) make_operator(op);  // throws the error listing the registered ones
  require(c.num_workers >= 1 && c.num_workers <= 4096,
          "num_workers must be in 1..4096, got " + std::to_string(c.num_workers));
  require(c.devices_per_worker >= 1 && c.devices_per_worker <= 256,
          "devices_per_worker must be in 1..256, got " + std::to_string(c.devices_per_worker));
  require(c.strategy == "simple" || c.strategy == "allreduce" || c.strategy == "ps" || c.strategy == "ps_async",
          "unknown strategy '" + c.strategy + "'; use simple, allreduce, ps or ps_async");
  require(c.max_staleness >= -1, "max_staleness must be >= -1 (-1 = unbounded), got " + std::to_string(c.max_staleness));
  require(c.num_ps_shards >= 0 && c.num_ps_shards <= 64,
          "num_ps_shards must be in 0..64 (0 = one per host), got " + std::to_string(c.num_ps_shards));
  require(!c.ps_update_on_shards || c.strategy == "ps",
          "ps_update_on_shards needs strategy ps, got '" + c.strategy + "'");
  require(c.ps_placement == "workers" || c.ps_placement == "processes",
          "unknown ps_placement '" + c.ps_placement + "'; use workers or processes");
  require(c.ps_placement == "workers" || c.strategy == "ps",
          "ps_placement processes needs strategy ps, got '" + c.strategy + "'");
  require(c.ps_placement == "workers" || c.listen.empty() || c.num_ps_shards > 0,
          "ps_placement processes in remote mode needs num_ps_shards > 0: as many shard processes as you start "
          "(dsgd ps-server --shard 0..n-1)");
  require(c.local_hosts >= 1, "local_hosts must be >= 1, got " + std::to_string(c.local_hosts));
  require(c.allreduce_algo == "auto" || c.allreduce_algo == "ring" || c.allreduce_algo == "hd",
          "unknown allreduce_algo '" + c.allreduce_algo + "'; use auto, ring or hd");
  require(c.forward_overlap_buckets >= -1, "forward_overlap_buckets must be >= 0 (0 = off) or -1 (auto), got " +
                                               std::to_string(c.forward_overlap_buckets));
  require(c.forward_overlap_buckets == 0 || (c.strategy != "ps_async" && !c.ps_update_on_shards),
          "forward_overlap_buckets needs averaged gradients (allreduce, ps, simple); under ps_async and "
          "ps_update_on_shards the servers take the step. Set it to 0");
  require(c.grad_shard_bytes > 0, "grad_shard_bytes must be > 0, got " + std::to_string(c.grad_shard_bytes));
  const int64_t world = int64_t{c.num_workers} * c.devices_per_worker;
  require(c.batch_size >= world, "batch_size (global) must be at least the number of replicas (" +
                                     std::to_string(world) + "), got " + std::to_string(c.batch_size));
  require(c.scheduler_step_freq == "batch" || c.scheduler_step_freq == "epoch" || c.scheduler_step_freq == "manual",
          "unknown scheduler_step_freq '" + c.scheduler_step_freq + "'; use batch, epoch or manual");
  require(c.threads_per_worker >= 0, "threads_per_worker must be >= 0 (0 = cores / workers), got " +
                                         std::to_string(c.threads_per_worker));
  require(c.nonfinite_policy == "skip" || c.nonfinite_policy == "error",
          "unknown nonfinite_policy '" + c.nonfinite_policy + "'; use skip or error");
  require(c.checkpoint_keep >= 1, "checkpoint_keep must be >= 1, got " + std::to_string(c.checkpoint_keep));
  require(c.max_failures >= 0, "max_failures must be >= 0, got " + std::to_string(c.max_failures));
  require(c.checkpoint_max_overhead >= 0 && c.checkpoint_max_overhead < 1,
          "checkpoint_max_overhead must be in [0, 1) (0 = every checkpoint_every_steps), got " +
              std::to_string(c.checkpoint_max_overhead));
  require(c.checkpoint_every_steps >= 0, "checkpoint_every_steps must be >= 0 (0 = once per train call), got " +
                                             std::to_string(c.checkpoint_every_steps));
  require(c.replacement_timeout.count() > 0 && c.registration_timeout.count() > 0 && c.heartbeat_timeout.count() > 0 && c.comm_timeout.count() > 0,
          "timeouts must be positive");
  require(c.initialization_hook.empty() || runtime::has_worker_function(c.initialization_hook),
          "initialization_hook '" + c.initialization_hook +
              "' is not a registered worker function (DSGD_REGISTER_WORKER_FUNCTION)");
  if (!c.listen.empty()) {
    const auto colon = c.listen.rfind(':');
    require(colon != std::string::npos && colon + 1 < c.listen.size(),
            "listen must be HOST:PORT (e.g. 0.0.0.0:29500), got '" + c.listen + "'");
  }
  if (const char* parent = std::getenv("DSGD_WORKER_OF")) {
    throw ConfigError(std::string("this process was started as a dsgd worker (by pid ") + parent +
                      ") but main() went on to create a Trainer: call dsgd::init(argc, argv) first thing in main()");
  }
}

int ps_shard_processes(const TrainerConfig& c) {
  if (c.strategy != "ps" || c.ps_placement != "processes") return 0;
  return c.num_ps_shards > 0 ? c.num_ps_shards : c.local_hosts;
}

nlohmann::json job_description(const std::string& op, const TrainerConfig& c) {
  int threads = c.threads_per_worker;
  if (threads == 0 && c.listen.empty()) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / c.num_workers);
  nlohmann::json job;
  job["operator"] = op;
  job["config"] = c.config;
  job["num_workers"] = c.num_workers;
  job["devices_per_worker"] = c.devices_per_worker;
  job["strategy"] = c.strategy;
  job["num_ps_shards"] = ps_shard_processes(c) > 0 ? ps_shard_processes(c) : c.num_ps_shards;
  job["ps_placement"] = c.ps_placement;
  job["ps_update_on_shards"] = c.ps_update_on_shards;
  job["max_staleness"] = c.max_staleness;
  job["allreduce_algo"] = c.allreduce_algo;
  job["grad_shard_bytes"] = c.grad_shard_bytes;
  job["batch_size"] = c.batch_size;
  job["seed"] = c.seed;
  job["scheduler_step_freq"] = c.scheduler_step_freq;
  job["initialization_hook"] = c.initialization_hook;
  job["threads_per_worker"] = threads;
  job["heartbeat_timeout_ms"] = c.heartbeat_timeout.count();
  job["comm_timeout_ms"] = c.comm_timeout.count();
  job["generation"] = 0;
  job["overlap"] = c.overlap;
  job["forward_overlap_buckets"] = c.forward_overlap_buckets;
  job["nonfinite_policy"] = c.nonfinite_policy;
  return job;
}

}  // namespace dsgd::runtime
