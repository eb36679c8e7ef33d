// The job's state at its last consistent point, the snapshot: the first member's models,
// optimizers and position (control.proto's get_state), with every replica's error feedback under
// compression. A recovery restores it; when to take it is SnapshotPolicy's (snapshot_policy.h).
// Also the state's transfers between the driver and the members, in pieces, and get_model's
// local replica. A part of the driver's Job (runtime/driver/job.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/driver/snapshot_policy.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace dsgd {
namespace torch_glue {
class ReplicaRuntime;  // torch/replica/replica.h; only job_state.cpp needs it whole
}  // namespace torch_glue

namespace runtime {

class Job;

// Error feedback by replica rank (compression; empty without): runtime::Checkpoint::feedback.
using Feedback = std::map<int64_t, std::string>;

class JobState {
 public:
  explicit JobState(Job& job);
  ~JobState();

  // States travel in pieces of this size (control.proto's StateChunk: one message of gigabytes
  // would hold the receiver's gRPC poller, and with it the heartbeats, for seconds).
  static constexpr size_t kChunkBytes = 4u << 20;
  // Every member (or `targets`) loads `state` with its `feedback`, sent in pieces; throws as
  // Job::raw_call does.
  void send(const std::string& state, const Feedback& feedback, std::vector<int> targets = {});
  // Worker `member`'s state, read in pieces; throws as Job::raw_call does.
  std::string fetch(int member);
  // The first member's state. Optimizer state held on the ps shards or split by ZeRO comes back
  // into its optimizers first (a collective: every member). With compression, *feedback (if
  // given) gets every replica's error feedback (every member).
  std::string read(Feedback* feedback = nullptr);
  // The models as a pickle of named tensors from the first member (model.pt); under ZeRO stage 3
  // its parameters gathered first.
  std::string model_pickle();

  // The snapshot = read(), timed for the policy and seconds(). `before_steps`: the start-up's,
  // of a state no step has touched.
  void take(bool before_steps = false);
  // take(), surviving a lost worker: false when it recovered instead, back to the previous
  // snapshot (from a survivor's state the members stand where the chunk left them: taken again).
  bool take_or_recover();
  // Takes the snapshot the policy put off, before a command whose effect a replay of training
  // would not reproduce (a worker function).
  void flush();
  // Every member loads the snapshot.
  void restore() { send(snapshot_, feedback_); }
  // After restore(): trains again the steps done since the snapshot (deferred snapshots), so
  // every replica is where the last train() left it. Their results were returned already.
  void replay();
  // The snapshot is now `state` (a save's read, a checkpoint loaded or gone on from): nothing
  // is pending.
  void set(std::string state, Feedback feedback);
  const std::string& snapshot() const { return snapshot_; }
  const Feedback& feedback() const { return feedback_; }
  SnapshotPolicy& policy() { return policy_; }

  // Seconds of the current train() call spent taking snapshots and handing checkpoints over.
  double call_seconds() const { return call_s_; }
  void add_call_seconds(double s) { call_s_ += s; }
  void begin_call() { call_s_ = 0; }

  // Model `index` of a local replica holding the first member's state (Trainer::get_model).
  std::shared_ptr<torch::nn::Module> model(size_t index);
  // A sharded checkpoint (runtime/checkpoint/sharded_checkpoint.h) as the state read() gives, read
  // into the local replica and serialised there, with its error feedback by rank into *feedback:
  // what a driver's restart goes on from when the checkpoint it names is sharded.
  std::string whole_state(const std::string& sharded_dir, Feedback* feedback);

 private:
  Job& job_;
  std::string snapshot_;
  Feedback feedback_;
  SnapshotPolicy policy_;
  double call_s_ = 0;
  torch_glue::ReplicaRuntime& local();  // made at the first call
  std::unique_ptr<torch_glue::ReplicaRuntime> local_;  // model()'s and whole_state()'s replica
};

}  // namespace runtime
}  // namespace dsgd
