// dsgd/common/trainer_config.h — every setting of a training job, grouped by concern.
//
//   dsgd::TrainerConfig c{.num_workers = 4, .strategy = "ps", .batch_size = 256};
//   c.step.max_grad_norm = 1.0;             // what each replica's step does
//   c.comm.compression = "bf16";            // how gradients travel
//   c.ps.shards = 2;                        // strategy ps's servers
//   c.recovery.standby_workers = 1;         // what a lost worker costs
//   c.checkpoints.dir = "ckpts";            // where snapshots go
//   c.launch.launcher = "ssh";              // who starts the workers
//
// A field is the one home of its setting, and its row in the settings table (dsgd/runtime/settings.h)
// its one description: path, type, default, flag, help, whether it can be tuned, its range. The
// CLI's flags, the Python keywords, the tuner, the summary and the job spec the workers get are
// all read from that table; the Trainer's constructor checks every field once
// (dsgd::validate_config; a ConfigError names the field by its path, e.g. "ps.shards"). A new
// setting is its field here, its row (with its rule), and its use. docs/SETTINGS.md has the long
// story of each group. Torch-free.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsgd/common/choice.h"

namespace dsgd {

// What every replica's optimizer step does. Carried to the workers whole.
struct StepConfig {
  // bf16: forward and loss under bfloat16 autocast (weights, gradients, optimizer float32), CPU
  // or CUDA. fp16: the same in float16, CUDA only, with loss scaling on by default.
  Choice<Precision> precision = Precision::kFp32;
  // Dynamic loss scaling (PyTorch's GradScaler): 0 = on from 65536 under fp16, off otherwise;
  // > 0 = on from this scale (a power of two); -1 = off. Needs the replicas' own step (not
  // ps_async, ps.update_on_shards or comm.forward_overlap_buckets).
  double loss_scale = 0;
  int64_t loss_scale_growth_interval = 2000;  // finite steps in a row before the scale doubles
  // A NaN/inf gradient: skip the step on every replica (and warn), or fail the call.
  Choice<NonfinitePolicy> nonfinite_policy = NonfinitePolicy::kSkip;
  // When registered schedules step: every batch, every epoch, or only when the operator says.
  Choice<SchedulerStepFreq> scheduler_step_freq = SchedulerStepFreq::kEpoch;
  // > 0: before each step, the averaged gradients of all models are scaled down so that their
  // global L2 norm is at most this (clip_grad_norm_; after unscaling; the same on every replica).
  // The train metrics report grad_norm, the mean norm before clipping. 0 = off. Needs the
  // replicas' own step, as loss_scale does.
  double max_grad_norm = 0;
  // Gradient accumulation: each step's global batch_size is trained as this many micro-batches
  // of batch_size / accumulate_steps, their gradients summed locally (no communication) and
  // averaged across replicas once, after the last; then one optimizer step. Needs the replicas'
  // own step, as loss_scale does. Steps, batches_per_epoch and positions count whole steps; an
  // epoch's last step may have fewer micro-batches.
  int64_t accumulate_steps = 1;
  // ZeRO (Rajbhandari et al.): 1 = each replica's optimizer holds state for, and steps, only its
  // share of the parameters (a flat block of every bucket), then shared with every replica;
  // 2 = its gradients too (4/N bytes a parameter plus a ring of 8 buckets; CPU); 3 = the
  // parameters too, each layer that forward names with dsgd::wait_for_parameters gathered whole
  // just before it runs (dsgd/torch/parameter_gate.h; CPU). Strategy allreduce, without
  // compression or comm.forward_overlap_buckets. 0 = off. docs/SETTINGS.md.
  int zero_stage = 0;
  // Activation checkpointing: every unit a model runs through dsgd::run_checkpointed (the GPT's
  // blocks, the ResNets' residual blocks) drops its activations after its forward and recomputes
  // them in its backward (dsgd/torch/activation_checkpoint.h): memory for each unit's input only,
  // for about a third more compute a step. Any strategy, stage and device.
  bool activation_checkpointing = false;
};

// How gradients travel between replicas.
struct CommConfig {
  // allreduce: auto (shared memory within a host, Gloo across) | ring | hd (halving-doubling).
  Choice<AllreduceAlgo> allreduce_algo = AllreduceAlgo::kAuto;
  int64_t grad_shard_bytes = 10 << 20;  // gradient bucket size
  bool overlap = true;                  // false: communicate after backward, not during it
  // > 0: this many buckets travel after backward and each is stepped as the next forward reaches
  // its layer; -1: train() picks the fastest of a few (docs/SETTINGS.md). allreduce, ps, simple.
  int forward_overlap_buckets = 0;
  // What crosses hosts: none (float32) | fp16 | bf16 (half the bytes) | powersgd (low-rank
  // factors); with error feedback. Strategy allreduce (algo auto) or ps (placement workers, no
  // update_on_shards).
  Choice<Compression> compression = Compression::kNone;
  int powersgd_rank = 4;                // 1..1024
  int powersgd_start_steps = 10;        // plain float32 steps first, per bucket
  // Every collective's deadline: bounds a collective that stalls with every process alive.
  std::chrono::milliseconds timeout{60000};
};

// Strategies ps and ps_async: the parameter servers.
struct PsConfig {
  int shards = 0;                // 0 = one per host (placement processes: local_hosts); 1..64
  // The shards apply SGD to their slices and hold their momentum (MXNet's update_on_kvstore);
  // each model's parameters in one torch::optim::SGD param group.
  bool update_on_shards = false;
  // workers: the shards live in the host leaders; processes: shard processes of their own,
  // started by the launcher (or `dsgd ps-server` under launcher none).
  Choice<PsPlacement> placement = PsPlacement::kWorkers;
  // ps_async: a replica this many updates ahead of the slowest on a shard waits; -1 = never.
  int max_staleness = 4;
};

// Who starts the workers, and where they find the driver.
struct LaunchConfig {
  // auto: local without `listen`, none with it | local | ssh | mpirun | slurm | none (workers
  // started by hand or a cluster manager: `dsgd worker --driver HOST:PORT`). docs/SETTINGS.md.
  Choice<Launcher> launcher = Launcher::kAuto;
  std::string listen;          // "" = loopback only (local); "HOST:PORT" = bind here, for other hosts
  std::string token;           // job token; "" = random (remote mode prints it)
  // Mutual TLS on the control plane (dsgd/common/choice.h; docs/RELIABILITY.md): auto makes a CA for the job
  // when the driver starts every worker, and hands the keys on as it does the token.
  Choice<Tls> tls = Tls::kAuto;
  // PEM files for every process of the job (`dsgd tls-keys DIR` makes them): all three or none.
  // Given, they are used whatever the launcher; needed for TLS where workers join by themselves.
  std::string tls_ca, tls_cert, tls_key;
  std::string worker_binary;   // what the driver starts; "" = this binary
  std::vector<std::string> hosts;  // ssh, mpirun: "host" or "host:slots" (workers there at most; 1)
  std::string ssh_command = "ssh";        // split at spaces; BatchMode
  std::string mpirun_command = "mpirun";  // e.g. "mpirun --allow-run-as-root --oversubscribe"
  std::string srun_command = "srun";      // e.g. "srun --partition=gpu --time=2:00:00"
  // Local mode: spread the workers over this many pseudo-hosts (worker i on local-host-<i % n>):
  // shared memory joins a pseudo-host's workers only; the rest goes over Gloo, as across machines.
  int local_hosts = 1;
  // How long the driver waits at start for the next worker to register (each arrival restarts it).
  std::chrono::milliseconds registration_timeout{60000};
  // The memory the workers the driver starts on its machine may hold together, in MiB (0: what
  // the machine has available as they set up). A job whose estimate exceeds it stops with a
  // ConfigError before its first step (docs/SETTINGS.md).
  int64_t memory_mib = 0;
};

// What a lost worker (crashed, killed, hung, cut off) costs: see docs/RELIABILITY.md.
struct RecoveryConfig {
  // A worker silent this long is lost. Workers beat every heartbeat_timeout / 4.
  std::chrono::milliseconds heartbeat_timeout{3000};
  // Lost workers survived within any failure_window; one more and train() fails, listing the
  // failures. failure_window 0: counted over the whole job. A job of weeks on a large cluster
  // (a loss every few hours) lives; a worker that dies again and again does not.
  int max_failures = 3;
  std::chrono::milliseconds failure_window{std::chrono::hours(1)};
  // Workers set up but outside the group, each ready to take a lost worker's place in well under
  // a second. Local mode spawns them; in remote mode, workers beyond num_workers.
  int standby_workers = 0;
  // Without a ready standby: false = the survivors go on at once (the global batch re-split);
  // true = wait for new workers to be set up, then resume as a fault-free run would.
  bool wait_for_replacements = false;
  // Elastic size (`--workers MIN:MAX`: num_workers is MAX). 0 = a fixed size: the job starts with
  // num_workers and goes on after losses with however many are left. N > 0: it starts once N
  // workers are set up (where workers join by themselves: launcher none; a launcher's own start
  // all num_workers), takes in those that join later up to num_workers between chunks, goes on
  // down to N after losses, and below N waits replacement_timeout for replacements, then fails.
  // The global batch stays batch_size, re-split over whoever is in the group.
  int min_workers = 0;
  // A loss in the middle of training: the new members take the state of a survivor that has
  // completed the most steps, so no completed step is trained again (allreduce and simple, one
  // device a worker, without ZeRO, compression or forward overlap; else, or false: the last
  // snapshot is restored and the steps since it are trained again).
  bool from_peer = true;
  // Local mode: spawn new processes for lost workers and promoted standbys (with back-off).
  bool replace_lost_workers = true;
  std::chrono::milliseconds replacement_timeout{30000};  // for a new process to register
  // A straggler named (Straggler): warn = say so and go on; evict = its place goes to a ready
  // standby, as if it were lost (the steps since the last snapshot are trained again); without a
  // ready standby it stays, with a warning.
  Choice<StragglerAction> on_straggler = StragglerAction::kWarn;
  // "" = the driver's loss ends the job (its workers exit within heartbeat_timeout). Else the
  // driver keeps what it needs to go on in this directory as it goes (driver.json: the workers,
  // the generation, the job's keys; its snapshots as checkpoints in <dir>/checkpoints unless
  // checkpoints.dir is set), and its workers outlive it by driver_grace: a driver started again
  // with the same directory and settings finds them, re-forms the group and goes on from the
  // last snapshot. Launcher local or none (ssh, mpirun and slurm processes end with the driver).
  std::string driver_state_dir;
  // With driver_state_dir: how long workers wait for a driver that stopped answering.
  std::chrono::milliseconds driver_grace{60000};
};

// Snapshots (in the driver's memory, what a recovery restores) and checkpoints (on disk).
struct CheckpointConfig {
  int64_t every_steps = 50;  // snapshot interval in steps, at least; with `dir`, the checkpoints'
  // Snapshots take at most about this share of training time (their interval grows to match);
  // 0 = exactly every every_steps.
  double max_overhead = 0.02;
  // "" = no checkpoints; else one every every_steps in <dir>/step-<N>, the newest `keep` kept;
  // load(dir) resumes from the newest intact one. Where every worker sees `dir`, the workers
  // write them (each its share, copied between two steps and written in the background:
  // docs/CHECKPOINTS.md); else (and under ps_async or ps.update_on_shards) the driver writes
  // each snapshot, which then comes with every checkpoint.
  std::string dir;
  int keep = 3;
  // A checkpoint in `dir` that cannot be written (the volume full, an I/O error): false = warn,
  // count it (Results::checkpoint_failures), keep the good ones, try again at the next one;
  // true = the job fails. A save() that cannot be written always fails.
  bool fail_on_write_error = false;
};

// What the driver shows while the job runs, besides on_progress.
struct MonitorConfig {
  // >= 0: the driver serves its live figures in Prometheus' text format at
  // http://metrics_host:metrics_port/metrics (0: a free port, logged); -1: off.
  int metrics_port = -1;
  std::string metrics_host = "127.0.0.1";  // 0.0.0.0 for a scraper on another machine
  // The same port serves a live dashboard at / (loss, validation, samples/s, each worker's step
  // time, recoveries, stragglers, the settings). "" = none; else its data is also written to
  // <metrics_dir>/history.json as the job goes, for `dsgd dashboard --metrics-dir` afterwards.
  std::string metrics_dir;
};

// A worker persistently slower than the rest: its compute per step (each step's time less its
// waits for communication) over a window of at least 20 steps and 10 s, against the median of
// the others', at least 1.10x. In a synchronous job every rank waits for it.
struct Straggler {
  int rank = 0;            // its place among the members when named
  std::string host;
  int64_t pid = 0;
  double slowdown = 1;     // the largest ratio seen while slow
  int64_t from_step = 0;   // the job's step where the first slow window began
  int64_t to_step = -1;    // where it was no longer slow; -1: still slow
  bool evicted = false;    // its place went to a standby (recovery.on_straggler evict)
};

struct TrainProgress {
  int64_t batches = 0;        // done in this train() call (worker 0's first replica)
  int64_t batches_total = 0;  // of this call
  double loss = 0;            // the last batch's loss
  double elapsed_s = 0;
  int64_t batches_per_epoch = 0;  // as worker 0 counts them (0 until it has said)
  std::vector<Straggler> stragglers;  // the workers slow now
};

struct RecoveryEvent;

struct TrainerConfig {
  int num_workers = 1;
  Choice<Strategy> strategy = Strategy::kAllreduce;  // simple | allreduce | ps | ps_async
  int64_t batch_size = 64;                           // global: split across all replicas
  int devices_per_worker = 1;  // replicas per worker process (threads on CPU, GPUs with CUDA)
  // auto: CUDA when the workers' LibTorch sees a GPU, else the CPU. docs/GPU.md.
  Choice<Device> device = Device::kAuto;
  uint64_t seed = 1;
  nlohmann::json config = nlohmann::json::object();  // handed to every replica's setup()
  std::string initialization_hook;  // a registered worker function run before setup ("" = none)
  int threads_per_worker = 0;       // intra-op threads per worker; 0 = cores / workers (local)

  StepConfig step;
  CommConfig comm;
  PsConfig ps;
  LaunchConfig launch;
  RecoveryConfig recovery;
  CheckpointConfig checkpoints;
  MonitorConfig monitor;

  std::function<void(const TrainProgress&)> on_progress;  // called ~10x/s during train()
  // Called when a recovery starts (failure set, resumed_at unset), when training resumed (the
  // whole event), and after a scale-up: for a progress display.
  std::function<void(const RecoveryEvent&)> on_recovery;
};

// Checks `config` for a job of `operator_name` as the Trainer's constructor does, starting
// nothing: throws the same ConfigError (naming the field, the value and what is allowed),
// including the operator's own check of config.config where it registered one
// (register_operator_config_check). For front ends that check many configs up front (dsgd tune).
void validate_config(const std::string& operator_name, const TrainerConfig& config);

// Settings by name, as data (apply_settings, settings_of) and each one's description: dsgd/runtime/settings.h.

// Values derived from a TrainerConfig, one function each (nothing keeps a copy of them).
// Worker processes the job keeps running: num_workers plus recovery.standby_workers.
int worker_processes(const TrainerConfig& config);
// Parameter-server shard processes (strategy ps with ps.placement processes: ps.shards, 0
// resolved to launch.local_hosts); 0 otherwise.
int ps_shard_processes(const TrainerConfig& config);
// The loss scaling the job runs with: 0 (off), or the initial scale (step.loss_scale 0 resolved
// to 65536 under precision fp16, off otherwise; -1 off).
double loss_scale_of(const TrainerConfig& config);

// A hosts file for LaunchConfig::hosts: one "host" or "host:slots" a line; blank lines and text
// from '#' on are ignored. ConfigError if it cannot be read or names no host (the entries
// themselves are checked with the rest of the config).
std::vector<std::string> read_hosts_file(const std::string& path);

}  // namespace dsgd
