// The job's snapshots on disk (TrainerConfig::checkpoints.dir): each, with model.pt read from a
// member, handed to a CheckpointWriter that writes it while training goes on; the writes that
// finished collected, the newest noted as what a driver's restart goes on from, a failed one
// warned about and counted (or thrown with checkpoints.fail_on_write_error). A part of the
// driver's Job (runtime/driver/job.h).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/driver/checkpoint_writer.h"

namespace dsgd::runtime {

class Job;

class JobCheckpoints {
 public:
  explicit JobCheckpoints(Job& job) : job_(job) {}

  // What a checkpoint of this job at (epoch, batch) says about itself.
  nlohmann::json header(int64_t epoch, int64_t batch) const;
  // The snapshot just taken, also on disk, as step epoch * batches_per_epoch + batch.
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

  void begin_call() { call_failures_ = 0; }
  int call_failures() const { return call_failures_; }        // writes that failed in this call
  int64_t total_failures() const { return total_failures_; }  // of the job

 private:
  Job& job_;
  std::unique_ptr<CheckpointWriter> writer_;  // made at the first persist
  std::string last_;                          // the newest one written ("" = none yet)
  int call_failures_ = 0;
  int64_t total_failures_ = 0;
};

}  // namespace dsgd::runtime
