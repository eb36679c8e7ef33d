// dsgd/runtime/trainer.h — the driver's handle on a distributed training job.
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
// The settings are a TrainerConfig (dsgd/common/trainer_config.h). Local mode (default): the driver
// spawns num_workers processes of this same binary, which meet the driver over gRPC on loopback.
// Remote mode (`launch.listen` set): the driver waits for num_workers workers started elsewhere
// (`dsgd worker --driver HOST:PORT --token T`, or this binary with `--dsgd-worker --driver
// HOST:PORT --token T`); both modes run the same code after registration.
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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsgd/torch/metrics.h"
#include "dsgd/common/trainer_config.h"

namespace torch::nn {
class Module;
}

namespace dsgd {
namespace runtime {
class Job;
}  // namespace runtime

// Makes this process a worker when the driver spawned it (or a launcher started it with
// --dsgd-worker), or a parameter-server shard (--dsgd-ps-server, ps_placement "processes"):
// serves the job, then exits the process. Otherwise returns at once. Call it first thing in
// main().
void init(int argc, char** argv);

struct TrainOptions {
  int64_t num_steps = 0;        // > 0: at most this many global batches (within the current epoch)
  // Add the seconds per batch of each phase of the default train_batch, each its own work only:
  // forward_s, backward_s, optimizer_s (with comm.forward_overlap_buckets, including the steps taken
  // as forward goes), comm_wait_s (every wait for communication, wherever it fell), and epoch_s.
  // Also snapshot_s: the driver's seconds in all, during the call, taking the snapshots a lost
  // worker's recovery starts from (and writing them to checkpoints.dir), between chunks.
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

// What a recovery did (in Results::recoveries of the call during which it happened; the
// constructor's, during start-up, in the first call's).
struct RecoveryEvent {
  // "recovery": a failure survived. "restart": a worker lost before every replica was set up
  // (the driver starts its workers): every process started again. "scale_up": after going on
  // with fewer workers, the job grew back towards num_workers between chunks (failure and lost
  // are empty; rolled_back_steps 0). "driver_restart": this driver took a lost driver's job up
  // (recovery.driver_state_dir): lost names the old workers that did not wait for it, detect_s
  // is from the old driver's last sign of life to this one's start, recovery_s from that sign of
  // life to training resumed, rolled_back_steps those the workers had trained past the checkpoint
  // it went on from.
  std::string kind = "recovery";
  std::string failure;          // what was detected, naming the worker
  std::string lost;             // the evicted worker(s): "worker 1 (host h, pid 123, last step 310)"
  int64_t rolled_back_steps = 0;  // completed steps trained again (since the snapshot; 0 from a peer)
  // The new members took a survivor's state (recovery.from_peer): nothing rolled back; else the
  // snapshot was restored.
  bool from_peer = false;
  // Steps the job had completed (over every train() call) when the failure was detected: those
  // before the failing chunk plus the lost worker's last report of it.
  int64_t at_step = 0;
  // How long the failure may have gone unnoticed: from the lost worker's last sign of life (its
  // last heartbeat; for a local process that exited, the last time it was seen running) to the
  // detection. An exit is seen within ~0.1 s, a hung worker after recovery.heartbeat_timeout.
  double detect_s = 0;
  // From the failure to training resumed (group re-formed, state restored): detect_s plus the
  // recovery itself. For a killed worker, the kill-to-resumed time (to within ~0.1 s).
  double recovery_s = 0;
  // From the failure to training back at the step where it struck: recovery_s from a peer or
  // outside a chunk (steps since the snapshot are replayed within it); from the snapshot during a
  // chunk, plus the redone steps of that chunk at the pace its retry went.
  double caught_up_s = 0;
  std::chrono::steady_clock::time_point detected_at;  // when the driver saw the failure (this process's clock)
  std::chrono::steady_clock::time_point resumed_at;   // when training resumed
  int workers_after = 0;
  int standbys_used = 0;        // lost workers whose places standbys took
  // Where recovery_s went after the detection, in order, in seconds: "drain" (the old generation
  // aborted; survivors idle, the lost known), "replace" (eviction; standbys promoted, or with
  // recovery.wait_for_replacements new workers awaited), "connect" (the new group forms), "restore"
  // (every replica loads the snapshot; from a peer: the new members and any survivor a step
  // behind load the most advanced survivor's state), "replay" (steps done since the snapshot by
  // calls that returned, redone). A recovery that failed part-way and went round again adds its phases
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
  // Checkpoints to checkpoints.dir that could not be written during this call (each warned
  // about; training went on: checkpoints.fail_on_write_error).
  int checkpoint_failures = 0;
  // Training's wait for each checkpoint of this call, in seconds: the workers' copies of their
  // shares (or the driver's hand-over of the snapshot), and any wait for the previous write;
  // checkpoints_behind counts those that found it still going and waited for it.
  std::vector<double> checkpoint_waits_s;
  int checkpoints_behind = 0;
  // Workers named stragglers during this call (dsgd::Straggler; to_step -1: still slow at its
  // end, and named again by the next call until they keep pace).
  std::vector<Straggler> stragglers;
};

// Where a job stands in its data: for a driver that restarted in place (Trainer::restarted_at).
struct JobPosition {
  int64_t epoch = 0;        // 0-based epoch in progress
  int64_t batch = 0;        // next global batch within it
  int64_t steps = 0;        // steps the job had trained there, from its first_epoch's start
  int64_t first_epoch = 0;  // where the job began: 0, or the epoch of a checkpoint load()ed first
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
  // Runs the registered worker function `name` (with `arg`) once per worker, on its first
  // replica; returns each worker's result, in worker order. Built in: "dsgd.replica", a
  // replica's rank, worker, local index, device, parameter count and a checksum of its models'
  // parameters (equal on every replica of a synchronous job).
  std::vector<nlohmann::json> foreach_worker(const std::string& name, const nlohmann::json& arg = {});
  // The same on every replica of every worker (devices_per_worker of each): worker by worker,
  // replicas in order within each, so result i is replica rank i's (DistributedSGD.foreach_model).
  std::vector<nlohmann::json> foreach_model(const std::string& name, const nlohmann::json& arg = {});
  // Checkpoint directory `path`: checkpoint.dsgd (models, optimizers, schedules, operator state,
  // epoch and sampler position; checksummed, written atomically) and model.pt (every model's
  // parameters and buffers as one name -> tensor dict for Python's torch.load: model 0's under
  // their own names, model m's prefixed "model<m>."); where model 0 is a TorchScript module
  // (models::ScriptedModel, `--model file.pt`), model.pt is that module with the trained weights,
  // for torch.jit.load.
  void save(const std::string& path);
  // Restores a checkpoint saved under any worker count and strategy. `path` is a checkpoint
  // directory, or a checkpoints.dir root: then the newest intact step-* in it.
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
  // (dsgd::fit, dsgd/runtime/fit.h); empty functions turn them off.
  void set_callbacks(std::function<void(const TrainProgress&)> on_progress,
                     std::function<void(const RecoveryEvent&)> on_recovery);
  // Trainable parameter elements of all models of one replica.
  int64_t parameter_count() const;
  // Workers set up outside the group and ready to take a lost member's place (standbys, and new
  // workers waiting for the next call to join). Takes in those whose set-up finished since the
  // last call first; recovery.standby_workers start in the background when the Trainer is made.
  int ready_standbys();
  // The control plane's address ("HOST:PORT") and the job token, for remote workers.
  std::string address() const;
  const std::string& token() const;
  // Whether the control plane runs over mutual TLS (TrainerConfig::launch.tls).
  bool tls() const;
  // With recovery.driver_state_dir, a Trainer made where a job's driver was lost takes the job
  // up: its workers (their processes unchanged), re-formed, restored to the job's newest
  // checkpoint, which this returns (the constructor's first RecoveryEvent, of kind
  // "driver_restart", says how long it took). nullopt when this Trainer started the job.
  std::optional<JobPosition> restarted_at() const;

 private:
  std::unique_ptr<runtime::Job> job_;  // the driver's engine (its parts: src/runtime/driver/job.h)
};

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
