// Checkpoints written into a rotating root (checkpoint.h) on a thread of their own, so training
// goes on while the bytes reach the disk: at gpt-base's size (1.03 GB of state and a 344 MB
// model.pt) a write took the driver 10-13 s, about as long as the 4 steps between checkpoints.
// Torch-free.
//
//   CheckpointWriter w(root, keep);
//   w.submit({.step = 200, ...}, std::move(checkpoint), std::move(model_pt));  // returns at once
//   for (auto& done : w.take(/*wait=*/false)) ...;                            // the finished ones
//
// One write at a time: submit() first waits for the one in flight, so at most one copy of the
// state waits for the disk. The caller does its bookkeeping (the newest checkpoint, a failure's
// warning) with what take() returns, on its own thread; the destructor waits for the write in
// flight, so nothing submitted is lost.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/driver/checkpoint.h"

namespace dsgd::runtime {

class CheckpointWriter {
 public:
  // What a write was of, handed back with its outcome.
  struct Job {
    int64_t step = 0;              // the directory's name (step-<step>)
    int64_t steps_done = 0;        // the caller's count when it submitted (a restart's position)
    int64_t batches_per_epoch = 0;
  };
  struct Done {
    Job job;
    std::string path;   // the directory written; empty when it failed
    std::string error;  // why it failed (DataError's message); empty when written
    size_t bytes = 0;   // state and model.pt
    double seconds = 0;
  };

  CheckpointWriter(std::string root, int keep) : root_(std::move(root)), keep_(keep) {}
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void submit(const Job& job, Checkpoint checkpoint, std::string model_pt);
  // The writes finished since the last call, oldest first; with `wait`, the one in flight too.
  std::vector<Done> take(bool wait);
  bool busy() const;

 private:
  const std::string root_;
  const int keep_;
  std::thread thread_;      // the write in flight, if joinable
  mutable std::mutex mutex_;
  std::vector<Done> done_;  // guarded by mutex_
  bool running_ = false;    // guarded by mutex_
};

}  // namespace dsgd::runtime
