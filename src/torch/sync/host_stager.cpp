#include "torch/sync/host_stager.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <utility>

namespace dsgd::torch_glue {

HostStager::HostStager(torch::Device device, std::function<void(size_t bucket)> copied)
    : device_(device), copied_(std::move(copied)), thread_([this] { loop(); }) {}

HostStager::~HostStager() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return staging_ == 0; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HostStager::stage(size_t bucket, torch::Tensor host_part, const torch::Tensor& device_part) {
  host_part.copy_(device_part, /*non_blocking=*/true);
  c10::Event copied(device_.type());
  copied.record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  std::lock_guard<std::mutex> lock(mutex_);
  ++staging_;
  queue_.push_back({bucket, std::move(copied)});
  cv_.notify_all();
}

void HostStager::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return staging_ == 0; });
}

void HostStager::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Staged item = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    // c10::Event has no blocking wait in LibTorch 1.13: poll it.
    while (!item.copied.query()) std::this_thread::sleep_for(std::chrono::microseconds(10));
    copied_(item.bucket);
    lock.lock();
    --staging_;
    cv_.notify_all();
  }
}

}  // namespace dsgd::torch_glue
