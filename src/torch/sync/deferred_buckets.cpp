#include "torch/sync/deferred_buckets.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "comm/timeline.h"

namespace dsgd::torch_glue {

DeferredBuckets::DeferredBuckets(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& slots,
                                 const strategy::BucketPlan& plan, std::function<bool(size_t bucket)> finite)
    : params_(params),
      slots_(slots),
      plan_(plan),
      finite_(std::move(finite)),
      schedule_(strategy::overlap_schedule(plan.buckets().size(), 0)),
      gated_(params.size(), false),
      pending_(plan.buckets().size()) {}

DeferredBuckets::~DeferredBuckets() { discard(); }

void DeferredBuckets::set_count(size_t count) {
  count_ = std::min(count, plan_.buckets().size());
  schedule_ = strategy::overlap_schedule(plan_.buckets().size(), count_);
}

void DeferredBuckets::wait_for(size_t param) {
  gated_[param] = true;
  const size_t bucket = plan_.slot(param).bucket;
  if (pending_[bucket]) apply(bucket);
}

void DeferredBuckets::flush() {
  for (size_t i : schedule_.launch_order) {
    if (pending_[i]) apply(i);
  }
}

bool DeferredBuckets::take_gates(const std::vector<bool>& got_grad) {
  bool all = count_ > 0 && step_.apply;
  for (size_t i = 0; i < gated_.size(); ++i) all = all && (!got_grad[i] || gated_[i]);
  std::fill(gated_.begin(), gated_.end(), false);
  return all;
}

void DeferredBuckets::apply(size_t bucket) {
  auto work = std::move(pending_[bucket]);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    comm::timeline::Span span("wait", static_cast<int64_t>(bucket));
    work->wait();
  } catch (...) {
    discard();
    throw;
  }
  comm::timeline::Span step_span("deferred step", static_cast<int64_t>(bucket));
  const auto t1 = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const double waited = std::chrono::duration<double>(t1 - t0).count();
    times_.wait_s += waited;
    total_wait_s_ += waited;
  }
  torch::NoGradGuard no_grad;
  const auto& b = plan_.buckets()[bucket];
  const bool finite = finite_(bucket);
  for (size_t i : b.params) params_[i].mutable_grad() = slots_[i];
  try {
    step_.apply(b.params, finite);
  } catch (...) {
    for (size_t i : b.params) params_[i].mutable_grad() = torch::Tensor();
    discard();
    throw;
  }
  for (size_t i : b.params) params_[i].mutable_grad() = torch::Tensor();
  std::lock_guard<std::mutex> lock(mutex_);
  times_.step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
}

void DeferredBuckets::discard() {
  for (auto& w : pending_) {
    if (!w) continue;
    try {
      w->wait();  // it writes into the GradSync's buffer
    } catch (...) {
    }
    w.reset();
  }
}

DeferredBuckets::Times DeferredBuckets::take_times() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(times_, Times{});
}

double DeferredBuckets::total_wait_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_wait_s_;
}

}  // namespace dsgd::torch_glue
