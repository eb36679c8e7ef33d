// GradSync's deferred buckets (TrainerConfig::comm.forward_overlap_buckets): communication
// overlapped with the next forward. With T > 0, T buckets spread over the layers
// (strategy::overlap_schedule) launch only after backward, first layer first; a backward whose
// forward called wait_for on every parameter that then got a gradient hands its buckets here
// (hold) and returns without waiting, and each bucket's step is applied (Step::apply) when the
// next forward asks for one of its parameters, at flush(), or at the next backward's end.
//
//   DeferredBuckets d(params, slots, plan, [&](size_t b) { return average_is_finite(b); });
//   d.set_count(2);  d.set_step({begin, apply});
//   for (...) d.wait_for(param);          // forward, before each layer
//   if (d.take_gates(got_grad)) d.hold(works);   // backward's end: every used parameter was gated
//
// Not thread-safe except take_times and total_wait_s: GradSync calls it from the training
// thread (forward) and at backward's end.
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "strategy/bucket_plan.h"
#include "strategy/strategy.h"

namespace dsgd::torch_glue {

class DeferredBuckets {
 public:
  struct Step {
    std::function<void()> begin;  // at a deferred backward's end: capture what its steps need
    // The parameters' .grad hold their bucket's average; `finite`: no NaN or infinity in it.
    std::function<void(const std::vector<size_t>& params, bool finite)> apply;
  };
  // params, slots (each parameter's averaged gradient) and plan: the GradSync's, which outlive
  // this. finite(bucket): its average passed the check, read once its work is done.
  DeferredBuckets(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& slots,
                  const strategy::BucketPlan& plan, std::function<bool(size_t bucket)> finite);
  ~DeferredBuckets();  // waits for what is pending (errors ignored)
  DeferredBuckets(const DeferredBuckets&) = delete;
  DeferredBuckets& operator=(const DeferredBuckets&) = delete;

  void set_step(Step step) { step_ = std::move(step); }
  // T, capped at the number of buckets; changed between backwards only (GradSync checks).
  void set_count(size_t count);
  size_t count() const { return count_; }
  // The launch order of every bucket: index order, the deferred ones last.
  const strategy::OverlapSchedule& schedule() const { return schedule_; }

  // Before forward uses `param`: applies its bucket's pending step, waiting for it.
  void wait_for(size_t param);
  // Applies every pending step (in launch order).
  void flush();
  // Forgets pending steps after waiting for their communication (errors ignored): the
  // parameters are about to be replaced (snapshot, checkpoint).
  void discard();
  bool pending(size_t bucket) const { return pending_[bucket] != nullptr; }

  // At a backward's end: whether its steps may wait for the next forward (T > 0, a step set,
  // and wait_for called since the last backward for every parameter with a gradient). Clears
  // the record of wait_for calls either way.
  bool take_gates(const std::vector<bool>& got_grad);
  // The backward's works (per bucket) become the pending steps; `works` is left empty-handed.
  void hold(std::vector<std::shared_ptr<comm::Work>>& works) { pending_.swap(works); }
  // After hold, outside the GradSync's lock: Step::begin.
  void begin() {
    if (step_.begin) step_.begin();
  }

  struct Times {
    double wait_s = 0, step_s = 0;  // waiting for pending buckets; applying their steps
  };
  Times take_times();
  double total_wait_s() const;

 private:
  void apply(size_t bucket);

  const std::vector<torch::Tensor>& params_;
  const std::vector<torch::Tensor>& slots_;
  const strategy::BucketPlan& plan_;
  const std::function<bool(size_t)> finite_;
  size_t count_ = 0;
  strategy::OverlapSchedule schedule_;
  Step step_;
  std::vector<bool> gated_;                          // per parameter: wait_for called since the last backward
  std::vector<std::shared_ptr<comm::Work>> pending_;  // per bucket: a step not yet applied
  mutable std::mutex mutex_;                         // guards times_ and total_wait_s_
  Times times_;
  double total_wait_s_ = 0;
};

}  // namespace dsgd::torch_glue
