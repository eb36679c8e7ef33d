// OpQueue: one thread that runs submitted operations in submission order, each completing its
// Work. The first failure is sticky: it fails everything queued and everything submitted later
// (a communication group in an unknown state must be re-formed, not reused).
//
//   OpQueue q("shm group");
//   auto w = q.submit("allreduce #3", [&] { do_it(); });   // returns at once
//   w->wait();                                              // rethrows do_it's exception
//
// Thread-safe. The destructor fails what is still queued and joins the thread after the
// operation in flight returns; operations must therefore be bounded by their own deadlines.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dsgd/comm/work.h"

namespace dsgd::comm {

class OpQueue {
 public:
  explicit OpQueue(std::string name);
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  std::shared_ptr<Work> submit(std::string description, std::function<void()> op);

  // Runs `op` and returns when it is done, rethrowing its error: on the caller's thread when
  // nothing is queued or running (saving two thread hand-offs, ~10 us, on small messages),
  // else queued behind the rest. Order is the same as submit's.
  void run(std::string description, const std::function<void()>& op);

 private:
  struct Item {
    std::shared_ptr<Work> work;
    std::function<void()> op;
    int64_t bucket = -1;  // the submitter's timeline::current_bucket(), for the op's span
  };
  void loop();

  const std::string name_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;      // guarded by mutex_
  std::exception_ptr error_;    // guarded by mutex_; the first failure
  bool stopping_ = false;       // guarded by mutex_
  bool running_ = false;        // guarded by mutex_; an operation is executing (either thread)
  std::thread thread_;          // why: callers overlap computation with queued communication
};

}  // namespace dsgd::comm
