// The Trainer's one validation of a TrainerConfig (dsgd::validate_config), and the values derived
// from one. Each rule is checked here once, or in the one function of the part it belongs to:
// the strategies' combinations in strategy::validate, a launcher's needs in validate_launcher,
// loss scaling's bounds in LossScaler, the operator's config in its registered check. Every
// ConfigError names the TrainerConfig field (ConfigError::field()), so a front end can name its
// own spelling of it.
#include <cstdlib>

#include "dsgd/error.h"
#include "dsgd/operator.h"
#include "dsgd/trainer.h"
#include "runtime/launch/launcher.h"
#include "runtime/worker/job_spec.h"
#include "runtime/worker/worker_functions.h"
#include "strategy/strategy.h"
#include "torch/loss_scaler.h"

namespace dsgd {
namespace {

void require(bool ok, const char* field, const std::string& what) {
  if (!ok) throw ConfigError(what, field);
}

// Each fixed-set field: ConfigError "unknown <field> '<spelling>'; use a, b or c".
template <typename E>
void check_known(const Choice<E>& c) {
  try {
    (void)c.value();
  } catch (const ConfigError& e) {
    throw ConfigError(e.what(), std::string(ChoiceTraits<E>::field));
  }
}

void validate_processes(const TrainerConfig& c) {
  require(c.num_workers >= 1 && c.num_workers <= 4096, "num_workers",
          "num_workers must be in 1..4096, got " + std::to_string(c.num_workers));
  require(c.devices_per_worker >= 1 && c.devices_per_worker <= 256, "devices_per_worker",
          "devices_per_worker must be in 1..256, got " + std::to_string(c.devices_per_worker));
  require(c.standby_workers >= 0 && c.standby_workers <= 64, "standby_workers",
          "standby_workers must be in 0..64, got " + std::to_string(c.standby_workers));
  require(c.local_hosts >= 1, "local_hosts", "local_hosts must be >= 1, got " + std::to_string(c.local_hosts));
  require(c.threads_per_worker >= 0, "threads_per_worker",
          "threads_per_worker must be >= 0 (0 = cores / workers), got " + std::to_string(c.threads_per_worker));
  const int64_t world = int64_t{c.num_workers} * c.devices_per_worker;
  require(c.batch_size >= world, "batch_size",
          "batch_size (global) must be at least the number of replicas (" + std::to_string(world) + "), got " +
              std::to_string(c.batch_size));
  require(
      c.ps_placement != PsPlacement::kProcesses || runtime::launcher_of(c) != Launcher::kNone || c.num_ps_shards > 0,
      "num_ps_shards",
      "ps_placement processes in remote mode needs num_ps_shards > 0: as many shard processes as you start "
      "(dsgd ps-server --shard 0..n-1)");
  if (!c.listen.empty()) {
    const auto colon = c.listen.rfind(':');
    require(colon != std::string::npos && colon + 1 < c.listen.size(), "listen",
            "listen must be HOST:PORT (e.g. 0.0.0.0:29500), got '" + c.listen + "'");
  }
}

void validate_step(const TrainerConfig& c) {
  require(c.grad_shard_bytes > 0, "grad_shard_bytes",
          "grad_shard_bytes must be > 0, got " + std::to_string(c.grad_shard_bytes));
  require(c.forward_overlap_buckets >= -1, "forward_overlap_buckets",
          "forward_overlap_buckets must be >= 0 (0 = off) or -1 (auto), got " +
              std::to_string(c.forward_overlap_buckets));
  const bool server_steps = c.strategy == Strategy::kPsAsync || c.ps_update_on_shards;
  require(c.forward_overlap_buckets == 0 || !server_steps, "forward_overlap_buckets",
          "forward_overlap_buckets needs averaged gradients (allreduce, ps, simple); under ps_async and "
          "ps_update_on_shards the servers take the step. Set it to 0");
  // Explicit CUDA only; under auto the worker's GradSync says the same where it finds a GPU.
  require(c.device != Device::kCuda || !server_steps, "device",
          "device cuda takes the strategies simple, allreduce and ps (without ps_update_on_shards): their servers "
          "update on the CPU. Use one of those, or device cpu");
  require(c.device != Device::kCuda || c.forward_overlap_buckets == 0, "forward_overlap_buckets",
          "forward_overlap_buckets is CPU-only: set it to 0 with device cuda");
  require(c.precision != Precision::kFp16 || c.device != Device::kCpu, "precision",
          "precision fp16 needs CUDA: LibTorch's CPU autocast runs bfloat16 only. Use precision bf16 on the CPU");
  require(c.loss_scale >= 0 || c.loss_scale == -1, "loss_scale",
          "loss_scale must be > 0 (dynamic from that scale), 0 (dynamic under fp16, else off) or -1 (off), got " +
              std::to_string(c.loss_scale));
  if (const double s = loss_scale_of(c); s > 0) {
    try {
      torch_glue::LossScaler({.init_scale = s, .growth_interval = c.loss_scale_growth_interval});  // its bounds
    } catch (const ConfigError& e) {
      throw ConfigError(e.what(), "loss_scale");
    }
    require(!server_steps && c.forward_overlap_buckets == 0, "loss_scale",
            "loss scaling needs the optimizer step in the replicas, once per batch after the gradient check: not "
            "with ps_async, ps_update_on_shards or forward_overlap_buckets (set it to 0)" +
                std::string(c.precision == Precision::kFp16 ? "; precision fp16 scales the loss by default" : ""));
  }
}

void validate_recovery(const TrainerConfig& c) {
  require(c.checkpoint_keep >= 1, "checkpoint_keep",
          "checkpoint_keep must be >= 1, got " + std::to_string(c.checkpoint_keep));
  require(c.max_failures >= 0, "max_failures", "max_failures must be >= 0, got " + std::to_string(c.max_failures));
  require(c.checkpoint_max_overhead >= 0 && c.checkpoint_max_overhead < 1, "checkpoint_max_overhead",
          "checkpoint_max_overhead must be in [0, 1) (0 = every checkpoint_every_steps), got " +
              std::to_string(c.checkpoint_max_overhead));
  require(c.checkpoint_every_steps >= 0, "checkpoint_every_steps",
          "checkpoint_every_steps must be >= 0 (0 = once per train call), got " +
              std::to_string(c.checkpoint_every_steps));
  require(c.registration_timeout.count() > 0, "registration_timeout", "registration_timeout must be positive");
  require(c.replacement_timeout.count() > 0, "replacement_timeout", "replacement_timeout must be positive");
  require(c.heartbeat_timeout.count() >= 100, "heartbeat_timeout",
          "heartbeat_timeout must be >= 100 ms, got " + std::to_string(c.heartbeat_timeout.count()) + " ms");
  require(c.comm_timeout.count() > 0, "comm_timeout", "comm_timeout must be positive");
}

}  // namespace

void validate_config(const std::string& op, const TrainerConfig& c) {
  require(!op.empty(), "", "no operator name given");
  if (!has_operator(op)) make_operator(op);  // throws the error listing the registered ones
  check_known(c.strategy);
  check_known(c.ps_placement);
  check_known(c.allreduce_algo);
  check_known(c.scheduler_step_freq);
  check_known(c.nonfinite_policy);
  check_known(c.device);
  check_known(c.precision);
  check_known(c.compression);
  check_known(c.launcher);
  validate_processes(c);
  validate_step(c);
  validate_recovery(c);
  require(c.initialization_hook.empty() || runtime::has_worker_function(c.initialization_hook),
          "initialization_hook",
          "initialization_hook '" + c.initialization_hook +
              "' is not a registered worker function (DSGD_REGISTER_WORKER_FUNCTION)");
  strategy::validate(runtime::strategy_options(runtime::make_job_spec(op, c)));
  runtime::validate_launcher(c);
  check_operator_config(op, c.config);  // the operator's own rules for its config, if it registered them
  if (const char* parent = std::getenv("DSGD_WORKER_OF")) {
    throw ConfigError(std::string("this process was started as a dsgd worker (by pid ") + parent +
                      ") but main() went on to create a Trainer: call dsgd::init(argc, argv) first thing in main()");
  }
}

int worker_processes(const TrainerConfig& c) { return c.num_workers + c.standby_workers; }

double loss_scale_of(const TrainerConfig& c) {
  if (c.loss_scale > 0) return c.loss_scale;
  return c.loss_scale == 0 && c.precision == Precision::kFp16 ? 65536.0 : 0.0;
}

int ps_shard_processes(const TrainerConfig& c) {
  if (c.strategy != Strategy::kPs || c.ps_placement != PsPlacement::kProcesses) return 0;
  return c.num_ps_shards > 0 ? c.num_ps_shards : c.local_hosts;
}

}  // namespace dsgd
