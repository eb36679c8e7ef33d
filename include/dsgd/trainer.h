// dsgd/trainer.h — the driver's handle on a distributed training job.
//
//   int main(int argc, char** argv) {
//     dsgd::init(argc, argv);                      // first: makes this binary a worker when spawned
//     dsgd::Trainer trainer(dsgd::operator_of<MyOperator>(), {.num_workers = 2, .strategy = "allreduce"});
//     for (int e = 0; e < 10; ++e) {
//       auto t = trainer.train();                  // one epoch; t.metrics["loss"]
//       auto v = trainer.validate();               // v.metrics["accuracy"]
//     }
//     trainer.save("ckpt");
//   }
//
// Local mode (default): the driver spawns num_workers processes of this same binary, which meet
// the driver over gRPC on loopback. Remote mode (`listen` set): the driver waits for num_workers
// workers started elsewhere (`dsgd worker --driver HOST:PORT --token T`, or this binary with
// `--dsgd-worker --driver HOST:PORT --token T`); both modes run the same code after registration.
// Each worker holds devices_per_worker replicas; replicas average gradients every step through
// the strategy, so they stay identical. The constructor validates everything it can before any
// process is spawned (dsgd::ConfigError). Any later failure (a worker's error, a lost worker)
// throws and leaves the Trainer unusable (shutdown() is still safe); the failure names the worker.
// Not thread-safe: drive it from one thread. Torch-free header except get_model's return type.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dsgd/choice.h"
#include "dsgd/metrics.h"

namespace torch::nn {
class Module;
}

namespace dsgd {

// Makes this process a worker when the driver spawned it (or a launcher started it with
// --dsgd-worker), or a parameter-server shard (--dsgd-ps-server, ps_placement "processes"):
// serves the job, then exits the process. Otherwise returns at once. Call it first thing in
// main().
void init(int argc, char** argv);

struct TrainProgress {
  int64_t batches = 0;          // done in this train() call (worker 0's first replica)
  int64_t batches_total = 0;    // of this call
  double loss = 0;              // the last batch's loss
  double elapsed_s = 0;
};

struct RecoveryEvent;

struct TrainerConfig {
  int num_workers = 1;
  int devices_per_worker = 1;                // replicas per worker process (threads on CPU, GPUs with CUDA)
  // auto: CUDA when the workers' LibTorch sees a GPU, else the CPU. With CUDA, replica i of a
  // worker at position w is on cuda:((w * devices_per_worker + i) % GPUs), so workers share GPUs
  // when there are fewer; gradients are staged through pinned host memory to the strategy.
  // CUDA takes the strategies simple, allreduce and ps (without ps_update_on_shards), and no
  // forward_overlap_buckets.
  Choice<Device> device = Device::kAuto;
  // bf16: forward and loss under autocast in bfloat16 (weights, gradients and the optimizer stay
  // float32), on the CPU or CUDA. fp16: the same in float16, CUDA only (LibTorch's CPU autocast
  // has no float16: ConfigError, use bf16), with dynamic loss scaling by default.
  Choice<Precision> precision = Precision::kFp32;
  // Dynamic loss scaling, PyTorch's GradScaler: the loss times S before backward, the averaged
  // gradients times 1/S before the step; a step whose gradients are not finite is skipped on
  // every replica (counted in skipped_steps, whatever nonfinite_policy says, until S is at
  // its minimum 2^-24) and S halved; S doubles after loss_scale_growth_interval finite steps in
  // a row. 0: on from S = 65536 under fp16, off otherwise; > 0: on from that S (a power of two,
  // so scaling is exact: float32 gradients that do not overflow give the unscaled step bit for
  // bit); -1: off. S is reported ("loss_scale" in the train metrics) and kept in snapshots and
  // checkpoints. The optimizer step must be the replicas' own, once per check_gradients: not
  // with ps_async, ps_update_on_shards or forward_overlap_buckets (ConfigError).
  double loss_scale = 0;
  int64_t loss_scale_growth_interval = 2000;
  // What crosses hosts (strategy allreduce, allreduce_algo auto; ps with ps_placement workers and
  // without ps_update_on_shards): none (float32); fp16 / bf16: each host leader
  // sends its host's gradient sum in 16 bits and sums what it gets in float32 (allreduce:
  // dsgd/comm/hierarchical.h; ps: pushes and pulls), half the bytes; powersgd (ps: its factors
  // summed among the host leaders): PowerSGD's rank-`powersgd_rank`
  // factors of each matrix-shaped gradient (after `powersgd_start_steps` plain steps; vectors
  // and small matrices as they are). Within a host all stays float32. Error feedback: each
  // replica keeps what compression left out (GradSync's residuals) and adds it to its next
  // gradient. Every replica's feedback (and PowerSGD's warm start) is part of snapshots and
  // checkpoints, so a recovery to the same number of workers is exact; a job of another size
  // loads a checkpoint with its feedback starting from zero (logged). Other strategies:
  // ConfigError (not yet).
  Choice<Compression> compression = Compression::kNone;
  int powersgd_rank = 4;                     // 1..1024
  int powersgd_start_steps = 10;             // per bucket, plain float32 first
  Choice<Strategy> strategy = Strategy::kAllreduce;  // simple | allreduce | ps | ps_async
  int num_ps_shards = 0;                     // ps: parameter-server shards (0 = one per host), 1..64
  // ps: the shards apply SGD themselves and hold the momentum of their slices (MXNet's
  // update_on_kvstore); each model's parameters must be in one torch::optim::SGD param group.
  // Checkpoints gather the momentum back, so they load under any strategy.
  bool ps_update_on_shards = false;
  // ps: where the shards live. "workers": in the host leaders (every host serves 1/hosts of the
  // parameters: BytePS's and MXNet's arrangement). "processes": num_ps_shards processes of
  // their own (0 = local_hosts), Ray's and TensorFlow's arrangement: started by the driver's
  // launcher (local: shard s on pseudo-host s % local_hosts; ssh: a slot of the hosts each;
  // slurm: a job step each; a lost one is started again and the job recovers from its
  // snapshot), or with `dsgd ps-server --shard s` (launcher none; mpirun starts workers only).
  Choice<PsPlacement> ps_placement = PsPlacement::kWorkers;
  // ps_async: a replica more than this many updates ahead of the slowest on a shard waits there
  // (stale synchronous parallel); -1 = never waits. Replicas report staleness_mean/_max.
  int max_staleness = 4;
  Choice<AllreduceAlgo> allreduce_algo =
      AllreduceAlgo::kAuto;                  // auto (shared memory within a host, Gloo across) | ring | hd
  int64_t grad_shard_bytes = 10 << 20;       // gradient bucket size
  bool overlap = true;                       // false: communicate after backward, not during
  // > 0: communication also overlaps the next forward. This many buckets, spread evenly over
  // the layers, travel after backward, first layer first, and each bucket's optimizer step is
  // taken when the next forward reaches its layer (the model calls dsgd::wait_for_parameters, as
  // the built-in models do; one that does not is trained without it). The runtime steps the
  // registered optimizers per bucket itself, so custom train_batch code sees no .grad after
  // backward, and a non-finite bucket skips its own step only. allreduce, ps and simple. It
  // gains most with many buckets per step (a smaller grad_shard_bytes).
  // -1 (auto): train() tries T = 0, 3N/16, N/4, 5N/16, 3N/8 and N/2 of the N buckets for 6 steps
  // each, then 0 and the two fastest again, and keeps the best mean (0 unless another is 3%
  // faster; logged at info level). Those steps train as usual; calls of fewer than 3 steps
  // (step()) are not timed, and T stays 0 until the trials are done.
  int forward_overlap_buckets = 0;
  Choice<NonfinitePolicy> nonfinite_policy =
      NonfinitePolicy::kSkip;                // a NaN/inf gradient: skip the step (and warn) | error
  int64_t batch_size = 64;                   // global: split across all replicas
  Choice<SchedulerStepFreq> scheduler_step_freq = SchedulerStepFreq::kEpoch;  // batch | epoch | manual
  uint64_t seed = 1;
  nlohmann::json config = nlohmann::json::object();  // handed to every replica's setup()
  std::string initialization_hook;           // a registered worker function run before setup ("" = none)
  int threads_per_worker = 0;                // intra-op threads per worker; 0 = cores / workers (local)

  // Processes.
  std::string listen;                        // "" = loopback only (local); "HOST:PORT" = bind here, for
                                             //   workers on other hosts
  std::string token;                         // job token; "" = random (remote mode prints it)
  std::string worker_binary;                 // what the driver starts; "" = this binary
  // Who starts the workers (dsgd/choice.h): auto is local without `listen` and none with it.
  // ssh: the driver starts each worker on one of `hosts` through the system's ssh client
  // (`ssh_command`, split at spaces; BatchMode, so keys or an agent, never a password prompt),
  // runs `worker_binary` there (the same path on every host), tells it the driver's address from
  // `listen` (a HOST the hosts reach, not 0.0.0.0) and hands it the token on standard input,
  // never on a command line. The ssh client's life is the worker's: it exits with it, and ending
  // it (or the driver) ends the worker. A replacement goes to a host with a free slot, one that
  // lost no worker when there is such.
  //
  // mpirun: one `mpirun_command` (split at spaces) starts every worker and standby at once, on
  // `hosts` when given (mpirun --host; else where mpirun puts them), the token exported to the
  // ranks from the environment (-x), never on a command line. Open MPI 4's mpirun is told to
  // keep the other ranks when one dies; a lost worker cannot be replaced, so the job goes on
  // with fewer and says so. With hosts, `listen` must be a HOST they reach, as for ssh.
  Choice<Launcher> launcher = Launcher::kAuto;
  std::vector<std::string> hosts;            // ssh, mpirun: "host" or "host:slots" (workers there at most; 1)
  std::string ssh_command = "ssh";
  std::string mpirun_command = "mpirun";     // e.g. "mpirun --allow-run-as-root --oversubscribe"
  // Local mode: spread the workers over this many pseudo-hosts (worker i on "local-host-<i % n>";
  // a replacement on its lost worker's): shared memory joins only workers of one pseudo-host,
  //
  // slurm: inside a Slurm allocation (sbatch or salloc; SLURM_JOB_ID set), each worker is one job
  // step, `srun_command` (split at spaces) with --nodes=1 --ntasks=1 --exclusive, so Slurm picks
  // its node; a replacement's step excludes the nodes that lost a worker while the allocation
  // has others. The token goes to the step on its standard input, never on a command line or in
  // Slurm's records; ending srun (or the driver) cancels the step. `listen` must be a HOST the
  // nodes reach (examples/slurm/train.sbatch uses its batch node's address).
  // the rest goes over Gloo as between machines. For testing and measuring cross-host
  // strategies on one machine.
  int local_hosts = 1;
  std::chrono::milliseconds registration_timeout{60000};
  std::string srun_command = "srun";         // e.g. "srun --partition=gpu --time=2:00:00"
  // A worker silent this long is lost (a hung or stopped process, a cut link): evicted and the
  // job recovers. Workers beat every heartbeat_timeout / 5 (100 ms .. 1 s) and hear a recovery
  // through the same long-polled call within moments. The default holds on a machine whose cores
  // are oversubscribed 2x (HangDetection.*, tests/runtime/long_trainer_test.cpp).
  std::chrono::milliseconds heartbeat_timeout{3000};
  // Every collective's deadline. A lost peer is found sooner, by heartbeats (or its exit); this
  // bounds a collective that stalls with every process alive.
  std::chrono::milliseconds comm_timeout{60000};

  // Fault tolerance: a lost worker (crashed, killed, hung, cut off) is evicted, survivors abort
  // their communication, a standby takes its place (or the survivors go on without it), the
  // group is re-formed and every replica restores the last in-memory snapshot, taken every
  // checkpoint_every_steps steps; the steps since are trained again.
  int max_failures = 3;                      // beyond this, train() fails listing the failures
  // Workers started, registered and set up (operator, data) but outside the group, each ready to
  // take a lost worker's place: its position and (local mode) pseudo-host, so the job goes on
  // computing what a fault-free run computes, after only a re-formation and a restore (well
  // under a second). A new standby is started in the background after each promotion. Local
  // mode spawns them; in remote mode workers that register beyond num_workers are the
  // standbys. Each costs a worker's memory (logged when it is ready) but no compute while idle.
  // A standby runs setup() before it knows its rank: info() says rank 0 until it joins.
  int standby_workers = 0;
  // Without a ready standby, a loss is survived at once by the survivors (the global batch
  // re-split over them: the job's steps differ from a fault-free run's from then on, see
  // docs/RELIABILITY.md) and new workers join between chunks when set up. true: idle until the
  // new workers are set up (up to replacement_timeout plus registration_timeout), then resume
  // with num_workers, as a fault-free run would.
  bool wait_for_replacements = false;
  // In-memory snapshot interval (steps), at least; train() calls shorter than that (step())
  // share one: a recovery restores it and trains the steps since again.
  int64_t checkpoint_every_steps = 50;
  // Snapshots take at most about this share of training time: after a snapshot that took s
  // seconds, the next one waits for at least s / checkpoint_max_overhead seconds of training
  // (the interval in steps grows to match, for big models with fast steps); s is scaled to the
  // state's size, which the first steps double with SGD's momentum. 0 = exactly every
  // checkpoint_every_steps. A lost worker costs at most one interval.
  double checkpoint_max_overhead = 0.02;
  // "" = snapshots stay in memory. Else every snapshot is also written to
  // <checkpoint_dir>/step-<N> and only the newest checkpoint_keep are kept; load(checkpoint_dir)
  // resumes from the newest intact one (a damaged one is named and passed over).
  std::string checkpoint_dir;
  int checkpoint_keep = 3;
  // Local mode: spawn new processes for lost workers (and promoted standbys), set up in the
  // background. One that fails to start (or to register within replacement_timeout) is tried
  // again with exponential back-off (1 s, 2 s, ... 60 s) until the job is back at num_workers
  // and standby_workers. In remote mode, workers that join later are taken in the same way.
  // false: never spawn them.
  bool replace_lost_workers = true;
  std::chrono::milliseconds replacement_timeout{30000};  // for a new process to register
  std::function<void(const TrainProgress&)> on_progress;  // called ~10x/s during train()
  // Called when a recovery starts (failure set, resumed_at unset) and when training resumed
  // (the whole event), and after a scale-up: for a progress display.
  std::function<void(const RecoveryEvent&)> on_recovery;
};

struct TrainOptions {
  int64_t num_steps = 0;        // > 0: at most this many global batches (within the current epoch)
  // Add the seconds per batch of each phase of the default train_batch, each its own work only:
  // forward_s, backward_s, optimizer_s (with forward_overlap_buckets, including the steps taken
  // as forward goes), comm_wait_s (every wait for communication, wherever it fell), and epoch_s.
  // Also snapshot_s: the driver's seconds in all, during the call, taking the snapshots a lost
  // worker's recovery starts from (and writing them to checkpoint_dir), between chunks.
  bool profile = false;
  bool reduce_results = true;   // false: also fill per_worker
  // Non-empty: when the call returns, a timeline of it is written to this file as a Chrome trace
  // (open it in ui.perfetto.dev or chrome://tracing): each worker a process; rows for its
  // replica's thread (forward, backward, optimizer, the next batch, each wait for a bucket, each
  // deferred step) and for each communication thread (every allreduce, push and pull, by lane,
  // with its bucket); each bucket's launch an instant. Times from the driver's clock, each
  // worker's placed at the send of each command (to about a millisecond). About 100 events per
  // step and worker, all held in memory until the call returns: meant for calls of hundreds of
  // steps, not whole runs (each worker keeps at most 2^20 per chunk). Off, each event costs one
  // atomic load.
  std::string trace_path = {};
};

// What a recovery did (in Results::recoveries of the call during which it happened).
struct RecoveryEvent {
  // "recovery": a failure survived. "scale_up": after going on with fewer workers, the job grew
  // back towards num_workers between chunks (failure and lost are empty; rolled_back_steps 0).
  std::string kind = "recovery";
  std::string failure;          // what was detected, naming the worker
  std::string lost;             // the evicted worker(s): "worker 1 (host h, pid 123, last step 310)"
  int64_t rolled_back_steps = 0;  // steps done since the snapshot, redone
  // Steps the job had completed (over every train() call) when the failure was detected: those
  // before the failing chunk plus the lost worker's last report of it.
  int64_t at_step = 0;
  // How long the failure may have gone unnoticed: from the lost worker's last sign of life (its
  // last heartbeat; for a local process that exited, the last time it was seen running) to the
  // detection. An exit is seen within ~0.1 s, a hung worker after heartbeat_timeout.
  double detect_s = 0;
  // From the failure to training resumed (group re-formed, state restored): detect_s plus the
  // recovery itself. For a killed worker, the kill-to-resumed time (to within ~0.1 s).
  double recovery_s = 0;
  std::chrono::steady_clock::time_point detected_at;  // when the driver saw the failure (this process's clock)
  std::chrono::steady_clock::time_point resumed_at;   // when training resumed
  int workers_after = 0;
  int standbys_used = 0;        // lost workers whose places standbys took
  // Where recovery_s went after the detection, in order, in seconds: "drain" (the old generation
  // aborted; survivors idle, the lost known), "replace" (eviction; standbys promoted, or with
  // wait_for_replacements new workers awaited), "connect" (the new group forms), "restore"
  // (every replica loads the snapshot), "replay" (steps done since the snapshot by calls that
  // returned, redone). A recovery that failed part-way and went round again adds its phases
  // again.
  std::vector<std::pair<std::string, double>> phases;
};

struct Results {
  Metrics metrics;                  // averaged over batches, then workers, weighted by samples
  std::vector<Metrics> per_worker;  // one per worker (TrainOptions::reduce_results = false)
  int64_t epoch = 0;                // epochs completed so far
  int64_t batch = 0;                // next global batch within the current epoch
  int64_t batches_per_epoch = 0;
  std::vector<RecoveryEvent> recoveries;  // failures survived during this call
};

class Trainer {
 public:
  // `operator_name`: a registered TrainingOperator (operator_of<T>()). Spawns or awaits the
  // workers, runs setup on every replica, checks that all replicas hold the same parameters and
  // starts them from replica 0's values.
  Trainer(const std::string& operator_name, TrainerConfig config);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  Results train(const TrainOptions& options = {});
  Results validate();
  // One synchronous step (one global batch): DistributedSGD.step.
  Results step();
  // Runs the registered worker function `name` once per worker, on its first replica; returns
  // each worker's result, in worker order.
  std::vector<nlohmann::json> foreach_worker(const std::string& name, const nlohmann::json& arg = {});
  // Checkpoint directory `path`: checkpoint.dsgd (models, optimizers, schedules, operator state,
  // epoch and sampler position; checksummed, written atomically) and model.pt (every model's
  // parameters and buffers as one name -> tensor dict for Python's torch.load: model 0's under
  // their own names, model m's prefixed "model<m>.").
  void save(const std::string& path);
  // Restores a checkpoint saved under any worker count and strategy. `path` is a checkpoint
  // directory, or a checkpoint_dir root: then the newest intact step-* in it.
  // The optimizers' state (momentum buffers) comes from the checkpoint; their hyper-parameters
  // (each param group's learning rate, momentum, ...) stay as this job's setup() made them from
  // its config, as LibTorch's optimizer load leaves them (schedules then apply their step).
  void load(const std::string& path);
  // The trained model(s) in this process: an operator set up here with the workers' state.
  std::shared_ptr<torch::nn::Module> get_model(size_t index = 0);
  // Stops the workers (idempotent; the destructor calls it).
  void shutdown();

  const TrainerConfig& config() const;
  // Replaces config().on_progress and on_recovery, for a front end that drives the calls
  // (dsgd::fit, dsgd/fit.h); empty functions turn them off.
  void set_callbacks(std::function<void(const TrainProgress&)> on_progress,
                     std::function<void(const RecoveryEvent&)> on_recovery);
  // Trainable parameter elements of all models of one replica.
  int64_t parameter_count() const;
  // The control plane's address ("HOST:PORT") and the job token, for remote workers.
  std::string address() const;
  const std::string& token() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Values derived from a TrainerConfig, one function each (nothing keeps a copy of them).
// Worker processes the job keeps running: num_workers plus standby_workers.
int worker_processes(const TrainerConfig& config);
// Parameter-server shard processes (strategy ps with ps_placement processes: num_ps_shards, 0
// resolved to local_hosts); 0 otherwise.
int ps_shard_processes(const TrainerConfig& config);
// The loss scaling the job runs with: 0 (off), or the initial scale (loss_scale 0 resolved to
// 65536 under precision fp16, off otherwise; -1 off).
double loss_scale_of(const TrainerConfig& config);

// Checks `config` for a job of `operator_name` as the Trainer's constructor does, starting
// nothing: throws the same ConfigError (naming the field, the value and what is allowed),
// including the operator's own check of config.config where it registered one
// (register_operator_config_check). For front ends that check many configs up front (dsgd tune).
void validate_config(const std::string& operator_name, const TrainerConfig& config);

// A hosts file for TrainerConfig::hosts: one "host" or "host:slots" a line; blank lines and
// text from '#' on are ignored. ConfigError if it cannot be read or names no host (the entries
// themselves are checked with the rest of the config).
std::vector<std::string> read_hosts_file(const std::string& path);

// ---- worker functions (foreach_worker, initialization_hook), registered by name ----
class TrainingOperator;
// `op` is the worker's first replica (null for the initialization hook, which runs before setup).
using WorkerFunction = std::function<nlohmann::json(TrainingOperator* op, const nlohmann::json& arg)>;
void register_worker_function(const std::string& name, WorkerFunction fn);

}  // namespace dsgd

// At namespace scope in a .cpp of the binary: DSGD_REGISTER_WORKER_FUNCTION(name, callable).
#define DSGD_REGISTER_WORKER_FUNCTION(name, ...)                             \
  static const bool dsgd_worker_function_registered_##name = [] {           \
    ::dsgd::register_worker_function(#name, __VA_ARGS__);                   \
    return true;                                                            \
  }()
