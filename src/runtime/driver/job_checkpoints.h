// The job's checkpoints on disk (TrainerConfig::checkpoints.dir), written while training goes on.
// Where every worker sees the directory, by the workers: at each checkpoint every member copies
// its replicas' shares between two steps (the only time training waits) and writes them on a
// thread of its own (runtime/worker/worker_shares.h); the next checkpoint, or the call's end,
// finishes that write: this driver checks every tensor is tiled, writes the manifest, renames the
// directory into <dir>/step-<step> (runtime/checkpoint/sharded_checkpoint.h) and rotates. Else
// (a worker that does not see it; the ps servers' strategies' state) the snapshot, with model.pt
// read from a member, goes to a CheckpointWriter in the whole format. Either way the newest is
// noted as what a driver's restart goes on from, a failed one warned about and counted (or
// thrown with checkpoints.fail_on_write_error). A part of the driver's Job (runtime/driver/job.h).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/driver/checkpoint_writer.h"

namespace dsgd {
struct Results;  // dsgd/runtime/trainer.h
}  // namespace dsgd

namespace dsgd::runtime {

class Job;

class JobCheckpoints {
 public:
  explicit JobCheckpoints(Job& job);

  // What a checkpoint of this job at (epoch, batch) says about itself.
  nlohmann::json header(int64_t epoch, int64_t batch) const;
  // Whether the workers write the checkpoints: then each persist() needs no snapshot, and comes
  // after every chunk (SnapshotPolicy::checkpoints_by_workers).
  bool by_workers() const { return by_workers_; }
  // The state now, on disk as step epoch * batches_per_epoch + batch: by the workers, else from
  // the snapshot just taken. The previous checkpoint's write is finished first.
  void persist(int64_t epoch, int64_t batch, int64_t batches_per_epoch);
  // The writes that finished (with `wait`, every one). Each train call's end waits for its.
  void collect(bool wait);

  // Sharded checkpoints (runtime/checkpoint/sharded_checkpoint.h), Trainer::save's and load's:
  // every member writes its replicas' shares into a temporary directory beside `path`, this
  // driver the manifest and model.pt, then the directory is renamed into place. False (nothing
  // written) where a worker does not see the directory: the caller writes the whole format.
  bool save_sharded(const std::string& path);
  // Every member reads what its replicas need; then the snapshot is taken from them.
  void load_sharded(const std::string& path);

  void begin_call() { call_failures_ = 0, call_waits_s_.clear(), call_behind_ = 0; }
  // A train call's end: its writes waited for (collect), and its figures into *r
  // (Results::checkpoint_failures, checkpoint_waits_s, checkpoints_behind; the last said).
  void end_call(Results* r);
  int64_t total_failures() const { return total_failures_; }  // of the job

 private:
  // A checkpoint the workers are writing.
  struct InFlight {
    CheckpointWriter::Job job;
    std::string tmp;  // beside its step-* directory
    nlohmann::json header;
    std::vector<int> members;  // that started it: each must finish it (a newcomer has no share)
    uint64_t bytes = 0;        // copied, to be written
  };
  // Starts one; false (nothing started) where a worker does not see the directory.
  bool start_by_workers(int64_t epoch, int64_t batch, const CheckpointWriter::Job& job);
  // Waits for the write in flight, commits and rotates it, or counts it failed. Returns the
  // seconds it waited for a write still going (0: it had ended).
  double finish_by_workers();
  // Warned about (with the disk's free space and what to do where `disk`: the volume, not a
  // lost worker) and counted, or thrown with checkpoints.fail_on_write_error.
  void failed(int64_t step, const std::string& error, uint64_t bytes, bool disk = true);
  void written(const std::string& path, const CheckpointWriter::Job& job);

  Job& job_;
  bool by_workers_ = false;
  std::optional<InFlight> in_flight_;
  std::unique_ptr<CheckpointWriter> writer_;  // the whole format's: made at its first persist
  std::string last_;                          // the newest one written ("" = none yet)
  int call_failures_ = 0;
  int64_t total_failures_ = 0;
  std::vector<double> call_waits_s_;
  int call_behind_ = 0;
};

}  // namespace dsgd::runtime
