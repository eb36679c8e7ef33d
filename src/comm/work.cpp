#include "dsgd/comm/work.h"

#include "dsgd/common/error.h"

namespace dsgd::comm {

void Work::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_cv_.wait_for(lock, timeout, [this] { return done_; })) {
    throw TimeoutError(description_ + ": not complete after " + std::to_string(timeout.count()) +
                           " ms of waiting",
                       description_);
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::test() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

std::exception_ptr Work::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void Work::complete(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

void wait_all(const std::vector<std::shared_ptr<Work>>& works) {
  std::exception_ptr first;
  for (const auto& w : works) {
    try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace dsgd::comm
