// A train() call's chunks (Trainer::train): the chunk in flight, which a recovery restarts from
// the snapshot or lets go on from a survivor's steps; its progress for on_progress; the members'
// traces; and forward_overlap_buckets auto's trials. A part of the driver's Job
// (runtime/driver/job.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "dsgd/runtime/trainer.h"
#include "control/driver_service.h"
#include "runtime/driver/overlap_tuner.h"

namespace dsgd::runtime {

class Job;
class TraceFile;  // runtime/worker/trace_file.h

class TrainChunks {
 public:
  using Clock = std::chrono::steady_clock;
  using Position = std::pair<int64_t, int64_t>;  // (epoch, batch)
  explicit TrainChunks(Job& job) : job_(job) {}

  // What a train call counts afresh: the recoveries' catching up.
  void begin_call() { catching_up_.clear(); }
  // What train() does on the driver's tick: watches for stragglers; worker 0's progress in this
  // call to on_progress, `done` steps before the current chunk.
  std::function<void()> progress_tick(const TrainOptions& options, const int64_t& done, Clock::time_point t0);
  // Trains one chunk (*request's train, its chunk number set here) on every member. A recovery
  // during it restarts it from the snapshot (its start), or, from a peer, goes on from the steps
  // the survivors kept (*kept): those are left out of its metrics' averages (the workers' sums
  // were lost with the call), and the caller counts them in its batches (count_kept_steps).
  std::vector<proto::CommandResult> train(proto::Command* request, const std::function<void()>& tick, int64_t* kept);
  // At a chunk's end, `batches` trained since the last resumption: the recoveries' caught_up_s.
  void note_caught_up(int64_t batches);
  // The chunk's `kept` steps added to its batches and num_samples: their metric sums were lost
  // with the aborted call, so the chunk's means (the steps after the recovery) stand for them.
  void count_kept_steps(Results* r, int64_t kept) const;
  // Each member's trace of a chunk that started `offset_us` into the call.
  void add_traces(const std::vector<proto::CommandResult>& outs, double offset_us, TraceFile* trace) const;
  // Under forward_overlap_buckets auto: the chunk of `steps` cut to the tuner's trial (returned,
  // *args set to try its next T); after it, the trial's step time for the tuner (while it tunes).
  int64_t overlap_trial(proto::TrainRequest* args, int64_t steps);
  void record_overlap_trial(const std::vector<proto::CommandResult>& outs, int64_t batches);

  // What a recovery reads: the chunk in flight's number (0: none, between calls), its start and
  // steps (0: to the epoch's end).
  uint64_t in_flight() const { return in_flight_; }
  Position start() const { return start_; }
  int64_t size() const { return size_; }
  // After a recovery: the retry trains the chunk's steps but the `kept` ones the members hold
  // (0 after a snapshot's restore); `completed`: a donor trained it to its end, results only.
  void resume(int64_t kept, bool completed) {
    resumed_ = kept;
    completed_ = completed;
  }
  // A recovery from the snapshot during the chunk: event `event` of the call redoes `steps`,
  // whose caught_up_s the chunk's end settles.
  void redo(size_t event, int64_t steps) { catching_up_.emplace_back(event, steps); }

 private:
  Position first_member_position();

  Job& job_;
  OverlapTuner overlap_tuner_;  // forward_overlap_buckets -1: T's choice
  uint64_t sent_ = 0;           // train chunks numbered (TrainRequest::chunk)
  uint64_t in_flight_ = 0;      // the one being trained, 0 when none: progress of others is past
  Position start_{0, 0};
  int64_t size_ = 0;
  int64_t resumed_ = 0;
  bool completed_ = false;
  std::vector<std::pair<size_t, int64_t>> catching_up_;  // (index in events, steps of the chunk redone)
};

}  // namespace dsgd::runtime
