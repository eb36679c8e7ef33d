#include "comm/op_queue.h"

#include "dsgd/error.h"

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
    queue_.push_back({work, std::move(op)});
    cv_.notify_one();
  }
  return work;
}

void OpQueue::loop() {
  while (true) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      if (error_) {
        item.work->complete(error_);
        continue;
      }
    }
    try {
      item.op();
      item.work->complete();
    } catch (...) {
      auto error = std::current_exception();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = error;
      }
      item.work->complete(error);
    }
  }
}

}  // namespace dsgd::comm
