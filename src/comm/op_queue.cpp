#include "comm/op_queue.h"

#include "comm/timeline.h"
#include "dsgd/common/error.h"

namespace dsgd::comm {

OpQueue::OpQueue(std::string name) : name_(std::move(name)), thread_([this] { loop(); }) {}

OpQueue::~OpQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (!error_) error_ = std::make_exception_ptr(CommError(name_ + " destroyed", "shutdown"));
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Work> OpQueue::submit(std::string description, std::function<void()> op) {
  auto work = std::make_shared<Work>(std::move(description));
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) {
    work->complete(error_);
  } else {
    queue_.push_back({work, std::move(op), timeline::current_bucket()});
    cv_.notify_one();
  }
  return work;
}

void OpQueue::run(std::string description, const std::function<void()>& op) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
    if (queue_.empty() && !running_) {
      running_ = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        timeline::Span span(description, timeline::current_bucket());
        op();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      running_ = false;
      if (error && !error_) error_ = error;
      // Wake the queue thread only if it has something to do: a needless wake-up costs a
      // context switch on the core this rank computes on.
      if (!queue_.empty() || stopping_) cv_.notify_all();
      if (error) std::rethrow_exception(error);
      return;
    }
  }
  submit(std::move(description), op)->wait();
}

void OpQueue::loop() {
  timeline::set_thread_name(name_);
  while (true) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return (stopping_ && !running_) || (!queue_.empty() && !running_); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      if (error_) {
        item.work->complete(error_);
        continue;
      }
      running_ = true;
    }
    std::exception_ptr error;
    try {
      timeline::BucketScope scope(item.bucket);  // what the op runs or queues in turn names it too
      timeline::Span span(item.work->description(), item.bucket);
      item.op();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
      if (error && !error_) error_ = error;
    }
    cv_.notify_all();
    item.work->complete(error);
  }
}

}  // namespace dsgd::comm
