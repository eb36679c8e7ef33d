#include "runtime/trainer_config.h"

#include <algorithm>
#include <cstdlib>

#include "dsgd/error.h"
#include "dsgd/operator.h"
#include "runtime/launcher.h"
#include "runtime/worker_functions.h"
#include "torch/loss_scaler.h"

namespace dsgd::runtime {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw ConfigError(what);
}

void validate_launcher(const TrainerConfig& c) {
  const dsgd::Launcher launcher = launcher_of(c);  // an unknown spelling: ConfigError listing the known ones
  const std::string name = c.launcher.name();
  const bool ssh = launcher == Launcher::kSsh, mpirun = launcher == Launcher::kMpirun;
  require(ssh || mpirun || c.hosts.empty(), "hosts are where launcher ssh or mpirun starts workers; launcher is '" +
                                                name + "' (set launcher ssh or mpirun, or leave hosts out)");
  require(launcher == Launcher::kLocal || c.local_hosts == 1,
          "local_hosts spreads workers the driver starts on this host (launcher local); launcher is '" + name + "'");
  require(launcher != Launcher::kNone || !c.listen.empty(),
          "launcher none: the workers join over TCP, so the driver needs listen (HOST:PORT)");
  if (!ssh && !mpirun && launcher != Launcher::kSlurm) return;
  require(!mpirun || ps_shard_processes(c) == 0,
          "launcher mpirun starts the workers only: use ps_placement workers, or start each ps shard with dsgd "
          "ps-server");
  if (launcher == Launcher::kSlurm) {
    const char* job = std::getenv("SLURM_JOB_ID");
    require(job != nullptr && *job != '\0',
            "launcher slurm starts each worker as a job step of this Slurm allocation, but SLURM_JOB_ID is not set: "
            "run the driver inside one (sbatch, or salloc; examples/slurm/train.sbatch)");
    require(c.srun_command.find_first_not_of(" \t") != std::string::npos, "srun_command is empty (default: srun)");
    require(!reachable_listen_host(c).empty(),
            "launcher slurm tells each worker the driver's address: set listen to HOST:PORT with a HOST the nodes "
            "reach (not 0.0.0.0; examples/slurm/train.sbatch uses its node's address), got '" + c.listen + "'");
    return;
  }
  require(!ssh || !c.hosts.empty(), "launcher ssh needs hosts (\"host\" or \"host:slots\"; dsgd train --hosts FILE)");
  require(!mpirun || !c.wait_for_replacements,
          "launcher mpirun starts every worker at once and cannot start a replacement: leave wait_for_replacements "
          "off (the job goes on with the survivors)");
  const auto& command = ssh ? c.ssh_command : c.mpirun_command;
  require(command.find_first_not_of(" \t") != std::string::npos,
          std::string(ssh ? "ssh_command" : "mpirun_command") + " is empty (default: " + (ssh ? "ssh" : "mpirun") + ")");
  if (c.hosts.empty()) return;  // mpirun on this host
  const auto hosts = parse_hosts(c.hosts);
  int slots = 0;
  for (const auto& h : hosts) slots += h.slots;
  const int processes = c.num_workers + c.standby_workers + (mpirun ? 0 : ps_shard_processes(c));
  require(slots >= processes, "launcher " + name + ": the hosts have " + std::to_string(slots) + " slot(s) for " +
                                  std::to_string(processes) + " worker(s), standbys and ps shard processes; add "
                                  "hosts or slots");
  require(!reachable_listen_host(c).empty(),
          "launcher " + name + " tells each worker the driver's address: set listen to HOST:PORT with a HOST the "
          "hosts reach (not 0.0.0.0), got '" + c.listen + "'");
}

}  // namespace

void validate_trainer_config(const std::string& op, const TrainerConfig& c) {
  require(!op.empty(), "no operator name given");
  if (!has_operator(op)) make_operator(op);  // throws the error listing the registered ones
  require(c.num_workers >= 1 && c.num_workers <= 4096,
          "num_workers must be in 1..4096, got " + std::to_string(c.num_workers));
  require(c.devices_per_worker >= 1 && c.devices_per_worker <= 256,
          "devices_per_worker must be in 1..256, got " + std::to_string(c.devices_per_worker));
  // Each fixed-set field: ConfigError "unknown <field> '<spelling>'; use a, b or c".
  (void)c.strategy.value();
  (void)c.ps_placement.value();
  (void)c.allreduce_algo.value();
  (void)c.scheduler_step_freq.value();
  (void)c.nonfinite_policy.value();
  (void)c.device.value();
  (void)c.precision.value();
  (void)c.compression.value();
  require(c.powersgd_rank >= 1 && c.powersgd_rank <= 1024,
          "powersgd_rank must be in 1..1024, got " + std::to_string(c.powersgd_rank));
  require(c.powersgd_start_steps >= 0, "powersgd_start_steps must be >= 0, got " + std::to_string(c.powersgd_start_steps));
  require(c.compression == Compression::kNone ||
              (c.strategy == Strategy::kAllreduce && c.allreduce_algo == AllreduceAlgo::kAuto) ||
              (c.strategy == Strategy::kPs && !c.ps_update_on_shards && c.ps_placement == PsPlacement::kWorkers),
          "compression " + c.compression.name() + " applies to strategy allreduce with allreduce_algo auto (the "
          "hierarchy's across-host stage), and to strategy ps with its shards in the workers, without "
          "ps_update_on_shards (gradients, not parameters, cross hosts); strategy is '" + c.strategy.name() + "', allreduce_algo '" + c.allreduce_algo.name() +
          "'" + (c.strategy == Strategy::kPs ? ", ps_placement '" + c.ps_placement.name() + "'" +
                                                   (c.ps_update_on_shards ? ", ps_update_on_shards" : "")
                                             : std::string()));
  require(c.loss_scale >= 0 || c.loss_scale == -1,
          "loss_scale must be > 0 (dynamic from that scale), 0 (dynamic under fp16, else off) or -1 (off), got " +
              std::to_string(c.loss_scale));
  if (const double s = loss_scale_of(c); s > 0) {
    torch_glue::LossScaler({.init_scale = s, .growth_interval = c.loss_scale_growth_interval});  // its checks
    require(c.strategy != Strategy::kPsAsync && !c.ps_update_on_shards && c.forward_overlap_buckets == 0,
            "loss scaling needs the optimizer step in the replicas, once per batch after the gradient check: not "
            "with ps_async, ps_update_on_shards or forward_overlap_buckets (set it to 0)" +
                std::string(c.precision == Precision::kFp16 ? "; precision fp16 scales the loss by default" : ""));
  }
  require(c.precision != Precision::kFp16 || c.device != Device::kCpu,
          "precision fp16 needs CUDA: LibTorch's CPU autocast runs bfloat16 only. Use precision bf16 on the CPU");
  require(c.max_staleness >= -1, "max_staleness must be >= -1 (-1 = unbounded), got " + std::to_string(c.max_staleness));
  require(c.num_ps_shards >= 0 && c.num_ps_shards <= 64,
          "num_ps_shards must be in 0..64 (0 = one per host), got " + std::to_string(c.num_ps_shards));
  const bool ps = c.strategy == Strategy::kPs;
  const bool shard_processes = c.ps_placement == PsPlacement::kProcesses;
  require(!c.ps_update_on_shards || ps, "ps_update_on_shards needs strategy ps, got '" + c.strategy.name() + "'");
  require(!shard_processes || ps, "ps_placement processes needs strategy ps, got '" + c.strategy.name() + "'");
  require(!shard_processes || launcher_of(c) != Launcher::kNone || c.num_ps_shards > 0,
          "ps_placement processes in remote mode needs num_ps_shards > 0: as many shard processes as you start "
          "(dsgd ps-server --shard 0..n-1)");
  require(c.local_hosts >= 1, "local_hosts must be >= 1, got " + std::to_string(c.local_hosts));
  require(c.forward_overlap_buckets >= -1, "forward_overlap_buckets must be >= 0 (0 = off) or -1 (auto), got " +
                                               std::to_string(c.forward_overlap_buckets));
  require(c.forward_overlap_buckets == 0 || (c.strategy != Strategy::kPsAsync && !c.ps_update_on_shards),
          "forward_overlap_buckets needs averaged gradients (allreduce, ps, simple); under ps_async and "
          "ps_update_on_shards the servers take the step. Set it to 0");
  // Explicit CUDA only; under auto the worker's GradSync says the same where it finds a GPU.
  require(c.device != Device::kCuda || (c.strategy != Strategy::kPsAsync && !c.ps_update_on_shards),
          "device cuda takes the strategies simple, allreduce and ps (without ps_update_on_shards): their servers "
          "update on the CPU. Use one of those, or device cpu");
  require(c.device != Device::kCuda || c.forward_overlap_buckets == 0,
          "forward_overlap_buckets is CPU-only: set it to 0 with device cuda");
  require(c.grad_shard_bytes > 0, "grad_shard_bytes must be > 0, got " + std::to_string(c.grad_shard_bytes));
  const int64_t world = int64_t{c.num_workers} * c.devices_per_worker;
  require(c.batch_size >= world, "batch_size (global) must be at least the number of replicas (" +
                                     std::to_string(world) + "), got " + std::to_string(c.batch_size));
  require(c.threads_per_worker >= 0, "threads_per_worker must be >= 0 (0 = cores / workers), got " +
                                         std::to_string(c.threads_per_worker));
  require(c.checkpoint_keep >= 1, "checkpoint_keep must be >= 1, got " + std::to_string(c.checkpoint_keep));
  require(c.max_failures >= 0, "max_failures must be >= 0, got " + std::to_string(c.max_failures));
  require(c.standby_workers >= 0 && c.standby_workers <= 64,
          "standby_workers must be in 0..64, got " + std::to_string(c.standby_workers));
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
  validate_launcher(c);
  if (const char* parent = std::getenv("DSGD_WORKER_OF")) {
    throw ConfigError(std::string("this process was started as a dsgd worker (by pid ") + parent +
                      ") but main() went on to create a Trainer: call dsgd::init(argc, argv) first thing in main()");
  }
}

double loss_scale_of(const TrainerConfig& c) {
  if (c.loss_scale > 0) return c.loss_scale;
  return c.loss_scale == 0 && c.precision == Precision::kFp16 ? 65536.0 : 0.0;
}

int ps_shard_processes(const TrainerConfig& c) {
  if (c.strategy != Strategy::kPs || c.ps_placement != PsPlacement::kProcesses) return 0;
  return c.num_ps_shards > 0 ? c.num_ps_shards : c.local_hosts;
}

}  // namespace dsgd::runtime
