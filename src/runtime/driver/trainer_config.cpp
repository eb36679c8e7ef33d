// The Trainer's one validation of a TrainerConfig (dsgd::validate_config), and the values derived
// from one. Each rule is checked here once, or in the one function of the part it belongs to:
// the strategies' combinations in strategy::validate, a launcher's needs in validate_launcher,
// loss scaling's bounds in LossScaler, the operator's config in its registered check. Every
// ConfigError names the TrainerConfig field (ConfigError::field()), so a front end can name its
// own spelling of it.
#include <cmath>
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
  require(c.recovery.standby_workers >= 0 && c.recovery.standby_workers <= 64, "recovery.standby_workers",
          "recovery.standby_workers must be in 0..64, got " + std::to_string(c.recovery.standby_workers));
  require(c.launch.local_hosts >= 1, "launch.local_hosts",
          "launch.local_hosts must be >= 1, got " + std::to_string(c.launch.local_hosts));
  require(c.threads_per_worker >= 0, "threads_per_worker",
          "threads_per_worker must be >= 0 (0 = cores / workers), got " + std::to_string(c.threads_per_worker));
  const int64_t world = int64_t{c.num_workers} * c.devices_per_worker;
  require(c.batch_size >= world, "batch_size",
          "batch_size (global) must be at least the number of replicas (" + std::to_string(world) + "), got " +
              std::to_string(c.batch_size));
  require(
      c.ps.placement != PsPlacement::kProcesses || runtime::launcher_of(c) != Launcher::kNone || c.ps.shards > 0,
      "ps.shards",
      "ps.placement processes in remote mode needs ps.shards > 0: as many shard processes as you start "
      "(dsgd ps-server --shard 0..n-1)");
  if (!c.launch.listen.empty()) {
    const auto colon = c.launch.listen.rfind(':');
    require(colon != std::string::npos && colon + 1 < c.launch.listen.size(), "launch.listen",
            "listen must be HOST:PORT (e.g. 0.0.0.0:29500), got '" + c.launch.listen + "'");
  }
}

void validate_zero(const TrainerConfig& c) {
  const int z = c.step.zero_stage;
  require(z >= 0 && z <= 2, "step.zero_stage",
          "step.zero_stage must be 0 (off), 1 (optimizer state sharded) or 2 (gradients sharded too), got " +
              std::to_string(z));
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
          "step.zero_stage 2 runs on the CPU only for now: use stage 1 with device cuda, or device cpu");
}

void validate_step(const TrainerConfig& c) {
  require(c.comm.grad_shard_bytes > 0, "comm.grad_shard_bytes",
          "comm.grad_shard_bytes must be > 0, got " + std::to_string(c.comm.grad_shard_bytes));
  require(c.comm.forward_overlap_buckets >= -1, "comm.forward_overlap_buckets",
          "comm.forward_overlap_buckets must be >= 0 (0 = off) or -1 (auto), got " +
              std::to_string(c.comm.forward_overlap_buckets));
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
  require(c.step.loss_scale >= 0 || c.step.loss_scale == -1, "step.loss_scale",
          "step.loss_scale must be > 0 (dynamic from that scale), 0 (dynamic under fp16, else off) or -1 (off), got " +
              std::to_string(c.step.loss_scale));
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
  require(std::isfinite(c.step.max_grad_norm) && c.step.max_grad_norm >= 0, "step.max_grad_norm",
          "step.max_grad_norm must be >= 0 (0 = no clipping), got " + std::to_string(c.step.max_grad_norm));
  require(c.step.max_grad_norm == 0 || (!server_steps && c.comm.forward_overlap_buckets == 0), "step.max_grad_norm",
          "clipping needs the whole averaged gradient in the replicas before their step: not with ps_async, "
          "ps.update_on_shards or comm.forward_overlap_buckets (set it to 0)");
  const int64_t n = c.step.accumulate_steps, world = int64_t{c.num_workers} * c.devices_per_worker;
  require(n >= 1 && n <= 4096, "step.accumulate_steps",
          "step.accumulate_steps must be in 1..4096 (1 = no accumulation), got " + std::to_string(n));
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
  require(c.recovery.driver_grace.count() >= 1000 && c.recovery.driver_grace.count() <= 86400000,
          "recovery.driver_grace",
          "recovery.driver_grace must be 1 s to 24 h, got " + std::to_string(c.recovery.driver_grace.count()) + " ms");
}

void validate_recovery(const TrainerConfig& c) {
  require(c.checkpoints.keep >= 1, "checkpoints.keep",
          "checkpoints.keep must be >= 1, got " + std::to_string(c.checkpoints.keep));
  require(c.recovery.max_failures >= 0, "recovery.max_failures",
          "recovery.max_failures must be >= 0, got " + std::to_string(c.recovery.max_failures));
  require(c.checkpoints.max_overhead >= 0 && c.checkpoints.max_overhead < 1, "checkpoints.max_overhead",
          "checkpoints.max_overhead must be in [0, 1) (0 = every checkpoints.every_steps), got " +
              std::to_string(c.checkpoints.max_overhead));
  require(c.checkpoints.every_steps >= 0, "checkpoints.every_steps",
          "checkpoints.every_steps must be >= 0 (0 = once per train call), got " +
              std::to_string(c.checkpoints.every_steps));
  require(c.launch.registration_timeout.count() > 0, "launch.registration_timeout",
          "launch.registration_timeout must be positive");
  require(c.monitor.metrics_port >= -1 && c.monitor.metrics_port <= 65535, "monitor.metrics_port",
          "monitor.metrics_port must be a TCP port (0: any free one) or -1 (off), got " +
              std::to_string(c.monitor.metrics_port));
  require(!c.monitor.metrics_host.empty(), "monitor.metrics_host",
          "monitor.metrics_host must name an address to listen on (e.g. 127.0.0.1 or 0.0.0.0)");
  require(c.recovery.replacement_timeout.count() > 0, "recovery.replacement_timeout",
          "recovery.replacement_timeout must be positive");
  require(c.recovery.heartbeat_timeout.count() >= 100, "recovery.heartbeat_timeout",
          "recovery.heartbeat_timeout must be >= 100 ms, got " + std::to_string(c.recovery.heartbeat_timeout.count()) +
              " ms");
  require(c.comm.timeout.count() > 0, "comm.timeout", "comm.timeout must be positive");
  validate_driver_state(c);
}

}  // namespace

void validate_config(const std::string& op, const TrainerConfig& c) {
  require(!op.empty(), "", "no operator name given");
  if (!has_operator(op)) make_operator(op);  // throws the error listing the registered ones
  check_known(c.strategy);
  check_known(c.ps.placement);
  check_known(c.comm.allreduce_algo);
  check_known(c.step.scheduler_step_freq);
  check_known(c.step.nonfinite_policy);
  check_known(c.device);
  check_known(c.step.precision);
  check_known(c.comm.compression);
  check_known(c.launch.launcher);
  check_known(c.launch.tls);
  check_known(c.recovery.on_straggler);
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

int worker_processes(const TrainerConfig& c) { return c.num_workers + c.recovery.standby_workers; }

double loss_scale_of(const TrainerConfig& c) {
  if (c.step.loss_scale > 0) return c.step.loss_scale;
  return c.step.loss_scale == 0 && c.step.precision == Precision::kFp16 ? 65536.0 : 0.0;
}

// StepConfig's field table: what travels to the workers (the job spec's `step`). A new step
// setting adds its line here.
template <typename S, typename F>
void step_fields(S& s, F&& field) {
  field("precision", s.precision);
  field("loss_scale", s.loss_scale);
  field("loss_scale_growth_interval", s.loss_scale_growth_interval);
  field("nonfinite_policy", s.nonfinite_policy);
  field("scheduler_step_freq", s.scheduler_step_freq);
  field("max_grad_norm", s.max_grad_norm);
  field("accumulate_steps", s.accumulate_steps);
  field("zero_stage", s.zero_stage);
}

// A Choice as its enum's number (choice.h), never as a spelling.
template <typename E>
void to_json(nlohmann::json& j, const Choice<E>& c) {
  j = static_cast<int>(c.value());
}
template <typename E>
void from_json(const nlohmann::json& j, Choice<E>& c) {
  const int n = j.get<int>();
  if (n <= 0 || n > static_cast<int>(ChoiceTraits<E>::names.size())) {
    throw ConfigError(std::string(ChoiceTraits<E>::field) + " is " + std::to_string(n) +
                          ", which this build does not know: are the driver and this process from different dsgd "
                          "versions?",
                      std::string(ChoiceTraits<E>::field));
  }
  c = static_cast<E>(n);
}

void to_json(nlohmann::json& j, const StepConfig& step) {
  j = nlohmann::json::object();
  step_fields(step, [&j](const char* key, const auto& value) { j[key] = value; });
}

void from_json(const nlohmann::json& j, StepConfig& step) {
  step_fields(step, [&j](const char* key, auto& value) {
    if (j.contains(key)) j.at(key).get_to(value);
  });
}

int ps_shard_processes(const TrainerConfig& c) {
  if (c.strategy != Strategy::kPs || c.ps.placement != PsPlacement::kProcesses) return 0;
  return c.ps.shards > 0 ? c.ps.shards : c.launch.local_hosts;
}

}  // namespace dsgd
