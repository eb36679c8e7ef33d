// GradSync's staging on a CUDA device: the strategy averages host memory, so each full bucket is
// copied from the device to the host in the device's queue (behind backward's kernels), and a
// thread of this class's own waits for each copy and hands the bucket on, so backward goes on
// meanwhile.
//
//   HostStager stager(device, [&](size_t bucket) { /* on the stager's thread: host copy done */ });
//   stager.stage(bucket, host.narrow(0, o, n), flat.narrow(0, o, n));   // queued copy, then the call
//   stager.wait_idle();                                                  // every staged bucket handed on
//
// `copied` runs on the stager's thread, one bucket at a time in the order staged; it must not
// throw, and the caller must not hold a lock `copied` takes while it calls wait_idle.
#pragma once

#include <c10/core/Event.h>
#include <torch/types.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace dsgd::torch_glue {

class HostStager {
 public:
  HostStager(torch::Device device, std::function<void(size_t bucket)> copied);
  ~HostStager();  // waits for what is staged
  HostStager(const HostStager&) = delete;
  HostStager& operator=(const HostStager&) = delete;

  // Queues the copy of `device_part` into `host_part` (pinned host memory) on the device's
  // current stream, then `copied(bucket)` once it is done.
  void stage(size_t bucket, torch::Tensor host_part, const torch::Tensor& device_part);
  void wait_idle();

 private:
  struct Staged {
    size_t bucket;
    c10::Event copied;
  };
  void loop();

  const torch::Device device_;
  const std::function<void(size_t)> copied_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Staged> queue_;
  size_t staging_ = 0;  // queued or being handed on
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace dsgd::torch_glue
