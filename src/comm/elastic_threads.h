// ElasticThreads: runs each task at once on a thread of its own, reusing threads whose task has
// ended instead of creating one per task (creating and joining a thread costs ~33 us here, and
// point-to-point traffic posts thousands of waits a step). Never queues a task behind a busy
// thread, since tasks may block for long (a wait for a message). Idle threads stay until join().
//
//   ElasticThreads threads;
//   threads.run([op] { op->wait(); });     // returns at once
//   threads.join();                        // after whatever the tasks block on has been woken
//
// Thread-safe. Torch-free; internal to dsgd_comm.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsgd::comm {

class ElasticThreads {
 public:
  ElasticThreads() = default;
  ~ElasticThreads() { join(); }
  ElasticThreads(const ElasticThreads&) = delete;
  ElasticThreads& operator=(const ElasticThreads&) = delete;

  void run(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    // A thread whose task has returned counts as free even before it is back waiting: it takes
    // the queue's next task when it gets there.
    const size_t busy = busy_.load(), free = threads_.size() > busy ? threads_.size() - busy : 0;
    if (tasks_.size() > free) {
      threads_.emplace_back([this] { loop(); });
    } else {
      cv_.notify_one();
    }
  }

  // Lets the threads finish their tasks (and those queued), then joins them. Idempotent.
  void join() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      threads.swap(threads_);
    }
    cv_.notify_all();
    for (auto& t : threads) t.join();
  }

  // Threads made so far (until join()).
  size_t threads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return threads_.size();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      ++busy_;
      lock.unlock();
      task();
      --busy_;
      lock.lock();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mutex_
  std::atomic<size_t> busy_{0};              // threads running a task (written under mutex_ going up)
  bool stopping_ = false;                    // guarded by mutex_
  std::vector<std::thread> threads_;         // guarded by mutex_
};

}  // namespace dsgd::comm
