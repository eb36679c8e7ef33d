// When the driver snapshots the replicas' state during train(), and what a recovery must then
// redo. train() runs in chunks of chunk_steps(); after each, the snapshot is taken, unless
// defer() says it would come too soon (fewer steps since the last one than an interval: a short
// train() call, a step()). Deferred steps are `pending()`; a recovery restores the snapshot and
// trains them again up to `replay_to()`, so a lost worker still costs at most one interval.
//
// The interval follows from the last snapshot's cost, scaled to the state's size now: the
// trainer's first snapshot, before any step, holds no optimizer state yet (momentum appears at
// the first step: the MLP's 23 MB become 46), so after it the policy asks for the state's size
// (wants_size) and the driver answers with resized(). Torch-free.
//
//   SnapshotPolicy policy(config);
//   if (!policy.defer(batches, step_s, {epoch, batch})) { snapshot = read(); policy.taken(seconds, snapshot.size()); }
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "dsgd/runtime/trainer.h"

namespace dsgd::runtime {

class SnapshotPolicy {
 public:
  using Position = std::pair<int64_t, int64_t>;  // (epochs done, next batch)

  explicit SnapshotPolicy(const TrainerConfig& config) : config_(config) {}

  // A snapshot of `bytes` was just taken, in `seconds`: nothing is pending. `before_steps`: of a
  // state that training has not touched yet (its size will change: wants_size).
  void taken(double seconds, size_t bytes, bool before_steps = false) {
    cost_s_ = seconds;
    cost_bytes_ = state_bytes_ = bytes;
    wants_size_ = before_steps;
    pending_ = 0;
  }
  // The state would now serialise to `bytes`: the next snapshot's cost is predicted in proportion.
  void resized(size_t bytes) {
    state_bytes_ = bytes;
    wants_size_ = false;
  }
  // Whether the driver should find out the state's size after the next steps (resized).
  bool wants_size() const { return wants_size_; }
  // The next snapshot's cost: the last one's, scaled to the state's size now.
  double predicted_cost_s() const {
    if (cost_bytes_ == 0) return cost_s_;
    return cost_s_ * static_cast<double>(state_bytes_) / static_cast<double>(cost_bytes_);
  }
  // The state was set from elsewhere (a load): nothing is pending.
  void reset() { pending_ = 0; }

  // Steps in the next chunk: checkpoint_every_steps, or more where the last snapshot would
  // otherwise cost more than checkpoint_max_overhead of the chunk's step_s-long steps.
  // With checkpoints_by_workers, a multiple of checkpoint_every_steps: a snapshot's interval
  // ends at a checkpoint.
  int64_t chunk_steps(double step_s) const {
    const int64_t every = config_.checkpoints.every_steps;
    if (every == 0 || config_.checkpoints.max_overhead == 0 || step_s <= 0) return every;
    const double wanted_s = predicted_cost_s() / config_.checkpoints.max_overhead;
    const int64_t steps = std::max(every, static_cast<int64_t>(std::ceil(wanted_s / step_s)));
    return by_workers_ ? (steps + every - 1) / every * every : steps;
  }

  // Checkpoints written by the workers (JobCheckpoints::by_workers): a snapshot no longer goes to
  // disk, so it waits as without a checkpoint_dir, while every chunk ends at a checkpoint (at most
  // checkpoint_every_steps), taken whether or not its snapshot waits.
  void checkpoints_by_workers(bool on) { by_workers_ = on; }

  // Steps in the next chunk of a train() call: what is left of the interval (0: no limit).
  int64_t next_chunk(double step_s) const {
    const int64_t interval = chunk_steps(step_s);
    const int64_t left = interval == 0 ? 0 : std::max<int64_t>(1, interval - pending_);
    const int64_t every = config_.checkpoints.every_steps;
    if (!by_workers_ || every == 0) return left;
    return left == 0 ? every : std::min(left, every);
  }

  // Whether the snapshot after a chunk of `batches` steps, ending at `at`, waits. Never with a
  // checkpoint_dir the driver writes (every snapshot goes to disk) or checkpoint_every_steps 0 (one per call),
  // unless `cut_short`: the chunk ended before its interval for another reason (the forward
  // overlap's trials, OverlapTuner) and the call goes on; its snapshot then waits for the
  // interval's end (the call's, with checkpoint_every_steps 0).
  bool defer(int64_t batches, double step_s, Position at, bool cut_short = false) {
    const int64_t interval = chunk_steps(step_s);
    if (!cut_short && ((!config_.checkpoints.dir.empty() && !by_workers_) || interval == 0)) return false;
    if (interval > 0 && pending_ + batches >= interval) return false;
    pending_ += batches;
    replay_to_ = at;
    return true;
  }

  int64_t pending() const { return pending_; }
  Position replay_to() const { return replay_to_; }
  double cost_s() const { return cost_s_; }

 private:
  const TrainerConfig& config_;
  double cost_s_ = 0;       // of the last snapshot
  size_t cost_bytes_ = 0;   // its size
  size_t state_bytes_ = 0;  // the state's size now, as far as known
  bool wants_size_ = false;
  bool by_workers_ = false;
  int64_t pending_ = 0;     // steps trained since the snapshot, their results returned
  Position replay_to_{0, 0};
};

}  // namespace dsgd::runtime
