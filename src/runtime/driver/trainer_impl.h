// Trainer's engine state, shared by the driver's two translation units: runtime/driver/trainer.cpp
// (construction, the Trainer calls, commands to the workers) and runtime/driver/trainer_recovery.cpp
// (snapshots, the recovery protocol, scaling back up). Private to the runtime: include it only
// from those two.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dsgd/runtime/trainer.h"
#include "control/driver_service.h"
#include "runtime/driver/checkpoint_writer.h"
#include "runtime/driver/driver_state.h"
#include "runtime/driver/failure_budget.h"
#include "runtime/driver/overlap_tuner.h"
#include "runtime/driver/snapshot_policy.h"
#include "runtime/driver/stragglers.h"
#include "runtime/driver/worker_pool.h"
#include "runtime/monitor/job_history.h"
#include "runtime/monitor/metrics.h"

namespace dsgd {
namespace torch_glue {
class ReplicaRuntime;  // torch/replica/replica.h; only trainer.cpp, which destroys Impl, needs it whole
}  // namespace torch_glue
namespace runtime {
class TraceFile;  // runtime/worker/trace_file.h
}  // namespace runtime

// A request without fields: command(&proto::Command::mutable_ping).
template <typename Request>
proto::Command command(Request* (proto::Command::*mutable_request)()) {
  proto::Command c;
  (c.*mutable_request)();
  return c;
}

// Error feedback by replica rank (compression; empty without): runtime::Checkpoint::feedback.
using Feedback = std::map<int64_t, std::string>;


struct Trainer::Impl {
  using json = nlohmann::json;
  using Clock = std::chrono::steady_clock;
  using milliseconds = std::chrono::milliseconds;

  std::string op_name;
  TrainerConfig config;
  std::string token;
  bool tls = false;                    // the control plane over mutual TLS
  std::unique_ptr<control::DriverServer> server;
  std::unique_ptr<runtime::WorkerPool> pool;  // who is in the group; local mode: their processes
  int64_t parameters = 0;
  std::string signature;               // of the members' models (SetupReply): a newcomer's must match
  int64_t generation = 1;              // of the communication group; +1 per re-formation
  std::string snapshot;                // replica state at the last consistent point
  Feedback snapshot_feedback;          // every replica's error feedback at that point
  std::unique_ptr<runtime::SnapshotPolicy> snapshots;  // when to take it; the steps since
  runtime::OverlapTuner overlap_tuner;                   // forward_overlap_buckets -1: T's choice
  runtime::FailureBudget failures;     // every lost worker, against recovery.max_failures
  std::vector<RecoveryEvent> events;   // of the current call
  // Recoveries from the snapshot during the chunk in flight: (index in events, steps of the chunk
  // redone), whose caught_up_s the chunk's end settles (note_caught_up).
  std::vector<std::pair<size_t, int64_t>> catching_up;
  std::vector<RecoveryEvent> start_events;  // of the start-up, reported by the first call
  int64_t steps_done = 0;              // steps completed over the job's train() calls (RecoveryEvent::at_step)
  uint64_t chunks_sent = 0;            // train chunks numbered (TrainRequest::chunk)
  uint64_t chunk_in_flight = 0;        // the one being trained, 0 when none: progress of others is past
  // That chunk's start (epoch, batch) and steps (0: to the epoch's end), and the steps of it the
  // members kept through a recovery from a peer (0 after a snapshot's): its retry trains the rest.
  std::pair<int64_t, int64_t> chunk_start{0, 0};
  int64_t chunk_size = 0;
  int64_t resumed_in_chunk = 0;
  bool chunk_completed = false;  // the donor of such a recovery trained it to its end: results only
  // Whether every member holds what the last command that changed a replica's state (train,
  // set_state, run, step_schedules, share_state) left in all of them: between calls a survivor's
  // state is then the job's (find_donor). raw_call keeps it.
  bool members_settled = false;
  double snapshot_s = 0;               // of the current call: taking snapshots, writing checkpoints
  int checkpoint_failures = 0;         // of the current call: checkpoints.dir writes that failed
  int64_t checkpoint_failures_total = 0;  // of the job
  Clock::time_point started_at = Clock::now();
  // monitor.metrics_port: the server, and what the training thread last published for it (the
  // workers' own figures come from their heartbeats at each scrape).
  std::unique_ptr<runtime::MetricsServer> metrics;
  mutable std::mutex published_m;
  runtime::JobGauges published;        // guarded by published_m
  std::vector<int> published_members;  // guarded by published_m
  std::string last_checkpoint;         // the newest one written to checkpoints.dir ("" = none yet)
  bool broken = false;
  bool stopped = false;
  std::unique_ptr<torch_glue::ReplicaRuntime> local;  // get_model's copy

  // One command to every member (or `targets`); any failure throws.
  std::vector<proto::CommandResult> raw_call(const proto::Command& request, std::vector<int> targets = {},
                                             const std::function<void()>& extra_tick = {},
                                             milliseconds timeout = milliseconds(0));

  // States travel in pieces of this size (control.proto's StateChunk: one message of gigabytes
  // would hold the receiver's gRPC poller, and with it the heartbeats, for seconds).
  static constexpr size_t kStateChunkBytes = 4u << 20;
  // Every member (or `targets`) loads `state` with its `feedback`, sent in pieces; throws as
  // raw_call does.
  void send_state(const std::string& state, const Feedback& feedback, std::vector<int> targets = {});
  // Worker `member`'s state (get_state), read in pieces; throws as raw_call does.
  std::string fetch_state(int member);

  // Strategy ps with shard processes: tells them the generation to join (runtime/ps_server_process.h).
  void announce_to_servers(const std::string& generation_or_state);

  // Throws if the trainer was shut down or broken by an unrecoverable failure.
  void ensure_usable() const;

  // Leaves the trainer broken (workers told to stop) and throws Error(why).
  [[noreturn]] void fail(const std::string& why);

  // f(), again after each recovery from a lost worker.
  template <typename F>
  auto recovering(F f) {
    ensure_usable();
    while (true) {
      try {
        return f();
      } catch (const std::exception& e) {
        recover_or_rethrow(e);
      }
    }
  }

  // A command that survives lost workers: on a recoverable failure the job is re-formed from
  // the last snapshot and the command is sent again. `first_only`: to the first live worker.
  std::vector<proto::CommandResult> call(const proto::Command& request, bool first_only = false,
                                         const std::function<void()>& extra_tick = {});

  // Pieces of train(): what it does on the driver's tick (watch_stragglers; worker 0's progress
  // in this call to on_progress, `done` steps before the current chunk); each member's trace of a
  // chunk that started `offset_us` into the call; under forward_overlap_buckets auto, a trial
  // chunk's step time for the tuner.
  std::function<void()> progress_tick(const TrainOptions& options, const int64_t& done, Clock::time_point t0);
  // What a train call counts afresh: its recoveries (the start-up's in the first), snapshot
  // seconds, checkpoint failures, straggler changes.
  void begin_train_call();
  void add_traces(const std::vector<proto::CommandResult>& outs, double offset_us, runtime::TraceFile* trace);
  void record_overlap_trial(const std::vector<proto::CommandResult>& outs, int64_t batches);

  // What a checkpoint of this job at (epoch, batch) says about itself.
  json checkpoint_header(int64_t epoch, int64_t batch) const;

  // Recovery and snapshots (runtime/driver/trainer_recovery.cpp).

  // The job's start: registration, every replica's setup, the first group, the first snapshot
  // given to every replica. A worker lost before every replica is set up (local mode) costs a
  // restart of every process (restart_every_worker); lost after, it is an ordinary recovery
  // (but a lone local worker without a standby, which is started again).
  // Both count as failures and are reported by the first call as RecoveryEvents.
  void start_up();
  // Registration and setup: false when a lost worker restarted every process (go round again).
  bool set_up_members();
  // The first group and the first snapshot given to every replica; `recover`: a lost worker is
  // recovered from (else the CommError is thrown).
  void form_first_group(bool recover);
  // Throws ConfigError naming the first line where worker `worker`'s model signature differs.
  void check_same_model(int worker, const std::string& sig) const;
  // Kills and starts again every process the driver started, after `failure` (kind "restart");
  // beyond max_failures the job fails naming every failure.
  void restart_every_worker(const std::string& failure);

  // Inside a catch block: a recoverable failure re-forms the job; anything else leaves the
  // trainer broken (workers told to stop) and is rethrown.
  void recover_or_rethrow(const std::exception& e);

  // The recovery protocol: abort the old generation, find and evict the lost workers, put ready
  // standbys in their places (else go on with the survivors, or with wait_for_replacements wait
  // for new ones), re-form the group with a new generation, restore the snapshot everywhere.
  // New processes are spawned in the background: set up as they come (WorkerPool::tend), they
  // become standbys or join between chunks (scale_up).
  void recover(std::string failure);

  // RecoveryEvent::phases as a recovery goes: mark(name) appends the seconds since the last mark
  // (or since construction). Records nothing without a list.
  using Phases = std::vector<std::pair<std::string, double>>;
  class PhaseClock {
   public:
    explicit PhaseClock(Phases* phases) : phases_(phases) {}
    void mark(const char* name) {
      const auto now = Clock::now();
      if (phases_ != nullptr) phases_->emplace_back(name, std::chrono::duration<double>(now - since_).count());
      since_ = now;
    }

   private:
    Phases* phases_;
    Clock::time_point since_ = Clock::now();
  };

  // One attempt of recover(), its phases appended to *phases: throws if another worker is lost
  // meanwhile. *from_peer: whether this attempt may take a survivor's state (find_donor); false
  // once an attempt restored the snapshot (survivors part-way through it hold older states).
  RecoveryEvent reform(const std::string& failure, Phases* phases, Clock::time_point detected, bool* from_peer);

  // After the drain of a loss during a chunk: the survivors' positions, whose furthest sets
  // ev->rolled_back_steps for a restore of the snapshot (the lost worker's last report may lag).
  // Returns, where `allowed` (recovery.from_peer), the survivor whose state the others take: only
  // where every survivor's last call ended at a step's end (none torn), and where the strategy's
  // state is all in the replicas (allreduce or simple, one device a worker, no ZeRO, compression
  // or forward overlap); nullopt otherwise. Where it trained the chunk to its end, the retry
  // trains nothing and takes the survivors' replies (Donor::completed). Between calls (no chunk in flight: a loss
  // in a validation, a snapshot, a checkpoint's read), any survivor, where the members are settled
  // and every survivor is at one position; nothing is redone.
  struct Donor {
    int id = -1;
    std::pair<int64_t, int64_t> at;  // its position (epoch, batch)
    std::vector<int> current;        // survivors at that position: they keep their state
    int64_t kept = 0;                // steps of the chunk in flight it completed
    bool completed = false;          // all of them: TrainRequest.results_only
  };
  std::optional<Donor> find_donor(const std::vector<int>& lost, bool allowed, RecoveryEvent* ev);
  // The donor's state into the receivers (worker ids), peer to peer over the job's group where
  // the strategy has a broadcast (allreduce: ShareStateRequest), else through the driver.
  void share_state(int donor, const std::vector<int>& receivers);
  // Whether a replica's state is all a job's state (a survivor can give it whole): allreduce or
  // simple, one device a worker, no ZeRO, compression or forward overlap.
  bool replicas_hold_whole_state() const;
  // reform's steps: wait until every member is idle or known lost, noting the lost ones in
  // *ev (returned); evict them, promote standbys to their places (or drop them), start new
  // processes and, with wait_for_replacements, wait for them.
  std::vector<int> drain(Clock::time_point detected, RecoveryEvent* ev);
  void replace_lost(const std::vector<int>& lost, const std::string& failure, RecoveryEvent* ev);

  // Every member joins the group of the current generation ("connect"). When the formation
  // itself fails (a connection refused, garbage from a peer, a timeout) while every member is
  // still alive, the generation is aborted and the group formed again under the next one, at
  // most kFormationAttempts times; then the job fails with an error naming every attempt. A
  // member lost meanwhile is rethrown at once, for the recovery protocol.
  static constexpr int kFormationAttempts = 3;
  void connect_group();

  // True if every member's process is known alive: not evicted, exited or silent.
  bool members_alive();

  // A new generation of the group: `joining` (set up, from WorkerPool::ready) join the members,
  // and everyone restores the snapshot; or, given a donor, the members not at its position take
  // its state (resumed_in_chunk = donor->kept). Marks its phases on *clock if given.
  void form_group(const std::vector<int>& joining, PhaseClock* clock = nullptr, const Donor* donor = nullptr);

  // The position of the first member (a call).
  std::pair<int64_t, int64_t> first_member_position();

  // Trains one chunk (*request's train, its chunk number set here) on every member. A recovery
  // during it restarts it from the snapshot (its start), or, from a peer, goes on from the steps
  // the survivors kept (*kept): those are left out of its metrics' averages (the workers' sums
  // were lost with the call), and the caller counts them in its batches.
  std::vector<proto::CommandResult> train_chunk(proto::Command* request, const std::function<void()>& tick,
                                                int64_t* kept);
  // At a chunk's end, `batches` trained since the last resumption: catching_up's caught_up_s.
  void note_caught_up(int64_t batches);
  // The chunk's `kept` steps (train_chunk) added to its batches and num_samples: their metric
  // sums were lost with the aborted call, so the chunk's means (the steps after the recovery)
  // stand for them.
  void count_kept_steps(Results* r, int64_t kept) const;

  // After restoring `snapshot`: trains the steps done since it (deferred snapshots) again, so
  // every replica is where the last train() left it. Their results were returned already.
  void replay();

  // Between chunks and calls: tends the pool (lost processes reaped, newcomers set up, new ones
  // started) and, below num_workers, grows back with the workers set up since (new processes in
  // local mode, spawned with back-off). Returns the event, or nullopt if nothing changed.
  std::optional<RecoveryEvent> scale_up();

  // scale_up, surviving a failure on the way like any call.
  void try_scale_up();

  // The first member's state (models, optimizers, position). Optimizer state held on the ps
  // shards comes back into the replicas' optimizers first (a collective: every member). With
  // compression, *feedback (if given) gets every replica's error feedback (every member).
  std::string read_state(Feedback* feedback = nullptr);

  // `snapshot`, `snapshot_feedback` = read_state(), timed for SnapshotPolicy and snapshot_s. `before_steps`: the
  // constructor's, of a state no step has touched.
  void take_snapshot(bool before_steps = false);

  // take_snapshot, surviving a lost worker: false when it recovered instead, back to the
  // previous snapshot.
  bool snapshot_or_recover();

  // Takes the snapshot SnapshotPolicy put off, before a command whose effect a replay of
  // training would not reproduce (a worker function).
  void flush_snapshot();

  // monitor.metrics_port: starts the server (nothing otherwise).
  void start_metrics();
  // The training thread's figures for the next scrape: after set-up, each chunk and each recovery.
  void publish_gauges(double samples_per_s = -1);
  // The dashboard's history (monitor.metrics_port or metrics_dir): validation results, recoveries
  // and stragglers as they happen; saved to metrics_dir after each chunk and, ended, at shutdown.
  std::unique_ptr<runtime::JobHistory> history;
  void record_validation(const Results& r);
  void record_event(const std::string& kind, const std::string& text);
  void save_history(bool ended);
  // What a scrape shows: the published figures and every worker's last heartbeat.
  runtime::JobGauges gauges_now() const;

  // The members' compute per step from their heartbeats (every ~0.5 s of a train call, on the
  // call's tick): names stragglers (a warning each) and clears them. The group of a new
  // generation starts its windows again.
  void watch_stragglers();
  // recovery.on_straggler evict: throws the CommError that starts a recovery in which worker `id`
  // (straggler `s`) counts as lost, if a standby is ready to take its place; else warns (once a
  // straggler) and is called again at the next watch.
  void evict_straggler(int id, const Straggler& s);
  std::vector<int> evicting;               // stragglers the recovery under way treats as lost
  std::vector<int64_t> kept_stragglers;    // pids warned about: no standby was ready
  runtime::StragglerDetector stragglers;
  Clock::time_point stragglers_checked{};
  std::vector<int64_t> published_stragglers;  // their pids, for a scrape (guarded by published_m)
  // Stragglers named or cleared during a train call: when, and what, for its trace.
  std::vector<std::pair<Clock::time_point, Straggler>> straggler_changes;
  // Those as instants in a call's trace that started at t0 (and forgotten).
  void add_straggler_notes(runtime::TraceFile* trace, Clock::time_point t0);
  int64_t stragglers_generation = 0;

  // The snapshot just taken, also on disk (TrainerConfig::checkpoints.dir), as step `step`:
  // model.pt read from a member now, both written by checkpoint_writer while training goes on.
  void persist_snapshot(int64_t epoch, int64_t batch, int64_t batches_per_epoch);
  std::unique_ptr<runtime::CheckpointWriter> checkpoint_writer;  // made at the first persist_snapshot
  // The checkpoint writes that finished (with `wait`, every one): the newest noted as the
  // checkpoint a restart goes on from; one that could not be written warned about and counted,
  // or thrown (DataError) with checkpoints.fail_on_write_error. Each call's end waits for its.
  void collect_checkpoints(bool wait);

  // recovery.driver_state_dir (runtime/driver/trainer_restart.cpp): what this driver keeps for
  // one started again in its place, and how a driver takes a job up from it.
  std::unique_ptr<runtime::DriverStateFile> driver_state;
  std::string job_fingerprint;       // of the job spec
  std::string listen_address;        // HOST:PORT the server listens on (Trainer::address)
  std::string tls_line;              // control::encode_keys of the job's keys ("" without TLS)
  int64_t driver_restarts = 0;       // drivers before this one that took the job up
  int64_t first_epoch = 0;           // where the job began (a load()ed checkpoint's epoch)
  std::string restart_checkpoint;    // what a restart goes on from: the newest checkpoint, or a load()ed one
  int64_t checkpoint_steps = 0;      // steps_done there
  int64_t checkpoint_bpe = 0;        // batches per epoch, where known (0: not yet)
  std::optional<JobPosition> restarted_at;
  // With recovery.driver_state_dir: the state file (driver_state), checkpoints.dir set if empty
  // (snapshots go to disk), and the state of a lost driver of the same job to take up, if any.
  std::optional<runtime::DriverState> open_driver_state(const proto::JobSpec& job);
  // The control plane's server; taking a lost driver's job up (`previous`), at its address, with
  // command numbers beyond its, and its workers known as registered from the first call on.
  void start_server(control::DriverServerOptions* options, const std::optional<runtime::DriverState>& previous);
  // Writes the driver's state (members, generation, keys, the checkpoint to go on from); a state
  // that cannot be written is warned about (the job goes on, but a restart would find less).
  void save_driver_state();
  // The state of a driver lost mid-job: adopt its workers, evict those that did not wait, restore
  // its newest checkpoint everywhere under a new generation (a RecoveryEvent of kind
  // "driver_restart" in start_events, timed from `started`, this driver's start). False, its
  // workers evicted, where the lost driver had written no checkpoint yet: the job starts anew.
  bool resume(const runtime::DriverState& previous, Clock::time_point started);
  // resume()'s steps: the old driver's members and standbys into the pool (their processes
  // watched by pid where it started them); the steps
  // the members (but `lost`) trained past the checkpoint at (epoch, batch); the event recorded
  // (`none_back`: no old worker answered, so those steps are unknown).
  void adopt_workers(const runtime::DriverState& previous);
  struct Survivors {
    int64_t steps = 0;                // the furthest any trained past the checkpoint
    std::pair<int64_t, int64_t> at;   // where they stand (epoch, batch), when together
    bool together = false;            // every one at one step's end, none torn
  };
  Survivors survivors_past(const std::vector<int>& lost, int64_t epoch, int64_t batch);
  // Every member back and together: the group re-formed with nobody restored, their state the
  // snapshot and the newest checkpoint.
  void go_on_from_members(const Survivors& members, PhaseClock* clock);
  void resumed(RecoveryEvent ev, Clock::time_point started, bool none_back);
  // resume()'s fallback when none of the old workers answered: start the job's processes again
  // (the driver starts its workers) and restore the checkpoint into them.
  void restart_without_workers(const std::string& why);
};

}  // namespace dsgd
