// dsgd/comm/work.h — the handle of an operation queued on a group's communication thread.
//
//   std::shared_ptr<dsgd::comm::Work> w = group->allreduce_async(buf, n, DataType::kFloat32, ReduceOp::kSum);
//   ... overlap computation ...
//   w->wait();                       // rethrows the operation's CommError / TimeoutError, if any
//
// Thread-safe. A Work completes exactly once, with success or an exception.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dsgd::comm {

class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}

  // Blocks until the operation completes or `timeout` passes; rethrows its error. On timeout
  // throws dsgd::TimeoutError (the operation itself goes on until its own deadline). Without a
  // timeout the wait is still bounded: the operation, and each queued before it, ends by its own
  // deadline (or at abort()), which completes this Work.
  void wait(std::chrono::milliseconds timeout = std::chrono::hours(24));

  // True once the operation has completed (successfully or not). Never blocks.
  bool test() const;

  // The operation's error, or null while pending or after success.
  std::exception_ptr error() const;

  // "allreduce #17 (4096 x float32, ring)".
  const std::string& description() const { return description_; }

  // Called once by the executor.
  void complete(std::exception_ptr error = nullptr);

 private:
  const std::string description_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;              // guarded by mutex_
  std::exception_ptr error_;       // guarded by mutex_
};

// Waits for every Work, going on past a failed one (each may still be writing into a buffer
// its caller is about to free), then rethrows the first error.
void wait_all(const std::vector<std::shared_ptr<Work>>& works);

}  // namespace dsgd::comm
