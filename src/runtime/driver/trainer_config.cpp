// The Trainer's one validation of a TrainerConfig (dsgd::validate_config), and the values derived
// from one. Each rule is checked once: a field's own range in its row of the settings table
// (trainer_settings.cpp), the rules between fields here, and the rest in the one function of the
// part it belongs to: the strategies' combinations in strategy::validate, a launcher's needs in
// validate_launcher, loss scaling's bounds in LossScaler, the operator's config in its registered
// check. Code further down asserts them as invariants, naming the rule. Every ConfigError names
// the TrainerConfig field (ConfigError::field()), so a front end can name its own spelling of it.
#include <cstdlib>

#include "dsgd/common/error.h"
#include "dsgd/torch/operator.h"
#include "dsgd/runtime/settings.h"
#include "dsgd/runtime/trainer.h"
#include "runtime/launch/launcher.h"
#include "runtime/worker/job_spec.h"
#include "runtime/worker/worker_functions.h"
#include "strategy/strategy.h"
#include "torch/replica/loss_scaler.h"

namespace dsgd {
namespace {

void require(bool ok, const char* field, const std::string& what) {
  if (!ok) throw ConfigError(what, field);
}

void validate_processes(const TrainerConfig& c) {
  require(c.recovery.min_workers <= c.num_workers, "recovery.min_workers",
          "recovery.min_workers (" + std::to_string(c.recovery.min_workers) + ") must be at most num_workers (" +
              std::to_string(c.num_workers) + "): an elastic size is MIN:MAX (--workers 2:4)");
  const int64_t world = int64_t{c.num_workers} * c.devices_per_worker;
  require(c.batch_size >= world, "batch_size",
          "batch_size (global) must be at least the number of replicas (" + std::to_string(world) + "), got " +
              std::to_string(c.batch_size));
  require(
      c.ps.placement != PsPlacement::kProcesses || runtime::launcher_of(c) != Launcher::kNone || c.ps.shards > 0,
      "ps.shards",
      "ps.placement processes in remote mode needs ps.shards > 0: as many shard processes as you start "
      "(dsgd ps-server --shard 0..n-1)");
}

void validate_zero(const TrainerConfig& c) {
  const int z = c.step.zero_stage;
  if (z == 0) return;
  const std::string stage = "step.zero_stage " + std::to_string(z);
  require(c.strategy == Strategy::kAllreduce, "step.zero_stage",
          stage + " shards the optimizer state over the replicas of strategy allreduce; strategy is '" +
              c.strategy.name() + "' (ps.update_on_shards shards SGD's state over the servers instead)");
  require(c.comm.compression == Compression::kNone, "step.zero_stage",
          stage + " does not combine with comm.compression '" + c.comm.compression.name() +
              "' yet: set compression none");
  require(c.comm.forward_overlap_buckets == 0, "step.zero_stage",
          stage + " needs the optimizer step taken whole after backward: set comm.forward_overlap_buckets to 0");
  require(z < 2 || c.device != Device::kCuda, "step.zero_stage",
          stage + " runs on the CPU only for now: use stage 1 with device cuda, or device cpu");
}

void validate_step(const TrainerConfig& c) {
  const bool server_steps = c.strategy == Strategy::kPsAsync || c.ps.update_on_shards;
  require(c.comm.forward_overlap_buckets == 0 || !server_steps, "comm.forward_overlap_buckets",
          "comm.forward_overlap_buckets needs averaged gradients (allreduce, ps, simple); under ps_async and "
          "ps.update_on_shards the servers take the step. Set it to 0");
  // Explicit CUDA only; under auto the worker's GradSync says the same where it finds a GPU.
  require(c.device != Device::kCuda || !server_steps, "device",
          "device cuda takes the strategies simple, allreduce and ps (without ps.update_on_shards): their servers "
          "update on the CPU. Use one of those, or device cpu");
  require(c.device != Device::kCuda || c.comm.forward_overlap_buckets == 0, "comm.forward_overlap_buckets",
          "comm.forward_overlap_buckets is CPU-only: set it to 0 with device cuda");
  require(c.step.precision != Precision::kFp16 || c.device != Device::kCpu, "step.precision",
          "precision fp16 needs CUDA: LibTorch's CPU autocast runs bfloat16 only. Use precision bf16 on the CPU");
  if (const double s = loss_scale_of(c); s > 0) {
    try {
      torch_glue::LossScaler({.init_scale = s, .growth_interval = c.step.loss_scale_growth_interval});  // its bounds
    } catch (const ConfigError& e) {
      throw ConfigError(e.what(), "step.loss_scale");
    }
    require(!server_steps && c.comm.forward_overlap_buckets == 0, "step.loss_scale",
            "loss scaling needs the optimizer step in the replicas, once per batch after the gradient check: not "
            "with ps_async, ps.update_on_shards or comm.forward_overlap_buckets (set it to 0)" +
                std::string(c.step.precision == Precision::kFp16 ? "; precision fp16 scales the loss by default" : ""));
  }
  require(c.step.max_grad_norm == 0 || (!server_steps && c.comm.forward_overlap_buckets == 0), "step.max_grad_norm",
          "clipping needs the whole averaged gradient in the replicas before their step: not with ps_async, "
          "ps.update_on_shards or comm.forward_overlap_buckets (set it to 0)");
  const int64_t n = c.step.accumulate_steps, world = int64_t{c.num_workers} * c.devices_per_worker;
  require(n == 1 || (c.batch_size % n == 0 && c.batch_size / n >= world), "step.accumulate_steps",
          "step.accumulate_steps " + std::to_string(n) + " must divide batch_size " + std::to_string(c.batch_size) +
              " into micro-batches of at least one sample per replica (" + std::to_string(world) + ")");
  require(n == 1 || (!server_steps && c.comm.forward_overlap_buckets == 0), "step.accumulate_steps",
          "gradient accumulation needs the optimizer step in the replicas: not with ps_async, ps.update_on_shards or "
          "comm.forward_overlap_buckets (set it to 0)");
  validate_zero(c);
}

// A driver that restarts in place needs workers that outlive it: processes it started itself
// (local) or that joined by themselves (none); ssh clients, mpirun and srun end with it.
void validate_driver_state(const TrainerConfig& c) {
  if (c.recovery.driver_state_dir.empty()) return;
  const Launcher l = runtime::launcher_of(c);
  require(l == Launcher::kLocal || l == Launcher::kNone, "recovery.driver_state_dir",
          std::string("recovery.driver_state_dir needs workers that outlive the driver: launcher local or none, "
                      "not ") + Choice<Launcher>(l).name() + " (its processes end with the driver)");
  require(ps_shard_processes(c) == 0, "recovery.driver_state_dir",
          "recovery.driver_state_dir does not keep ps shard processes (ps.placement processes) across a driver's "
          "restart; use ps.placement workers");
}

}  // namespace

void validate_config(const std::string& op, const TrainerConfig& c) {
  require(!op.empty(), "", "no operator name given");
  if (!has_operator(op)) make_operator(op);  // throws the error listing the registered ones
  check_setting_rules(c);  // each field's own range, and every choice's spelling
  validate_processes(c);
  validate_step(c);
  validate_driver_state(c);
  require(c.initialization_hook.empty() || runtime::has_worker_function(c.initialization_hook),
          "initialization_hook",
          "initialization_hook '" + c.initialization_hook +
              "' is not a registered worker function (DSGD_REGISTER_WORKER_FUNCTION)");
  strategy::validate(runtime::strategy_options(runtime::resolved(c)));
  runtime::validate_launcher(c);
  check_operator_config(op, c.config);  // the operator's own rules for its config, if it registered them
  if (const char* parent = std::getenv("DSGD_WORKER_OF")) {
    throw ConfigError(std::string("this process was started as a dsgd worker (by pid ") + parent +
                      ") but main() went on to create a Trainer: call dsgd::init(argc, argv) first thing in main()");
  }
}

int worker_processes(const TrainerConfig& c) { return c.num_workers + c.recovery.standby_workers; }

double loss_scale_of(const TrainerConfig& c) {
  if (c.step.loss_scale > 0) return c.step.loss_scale;
  return c.step.loss_scale == 0 && c.step.precision == Precision::kFp16 ? 65536.0 : 0.0;
}

int ps_shard_processes(const TrainerConfig& c) {
  if (c.strategy != Strategy::kPs || c.ps.placement != PsPlacement::kProcesses) return 0;
  return c.ps.shards > 0 ? c.ps.shards : c.launch.local_hosts;
}

}  // namespace dsgd
