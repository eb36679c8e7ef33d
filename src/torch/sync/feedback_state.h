// A compressing strategy's error feedback for one GradSync (strategy::ErrorFeedback): what the
// strategy left out of each bucket, kept by the replica and added back into the next step's.
//
//   FeedbackState feedback(plan, params);                  // zeros, in the plan's flat layout
//   auto work = feedback.average_async(*strategy->error_feedback(), bucket, data);
//   feedback.save(&bytes);  ...  if (!feedback.load(&p, end)) { /* other layout: back to zero */ }
//
// Per bucket: its residuals (one float per gradient element) and, for PowerSGD, its state (the
// calls so far and the warm-start Q of each matrix). Each parameter of two or more dimensions is
// a matrix of its first dimension by the rest (DDP's PowerSGD view). Not thread-safe: GradSync
// calls it under its lock.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "strategy/bucket_plan.h"
#include "strategy/strategy.h"

namespace dsgd::torch_glue {

class FeedbackState {
 public:
  FeedbackState(const strategy::BucketPlan& plan, const std::vector<torch::Tensor>& params);

  // Averages `bucket`'s gradients at `data` (its count floats) with its feedback.
  std::shared_ptr<comm::Work> average_async(strategy::ErrorFeedback& strategy, size_t bucket, float* data);
  // The residuals, in the flat layout (host memory).
  torch::Tensor& residuals() { return residuals_; }

  // As bytes, appended to *out: the layout (bucket sizes), the residuals (left out when all zero,
  // as on every replica but a host's leader) and the PowerSGD states. load reads what save wrote
  // from [*p, end) and advances *p; where it is of another layout or cut short it leaves the
  // feedback at zero and returns false.
  void save(std::string* out) const;
  bool load(const char** p, const char* end);
  void clear();

 private:
  std::vector<size_t> offsets_, counts_;                     // per bucket, in floats
  torch::Tensor residuals_;
  std::vector<std::vector<strategy::MatrixSlot>> matrices_;  // per bucket
  std::vector<strategy::PowerSgdState> powersgd_;            // per bucket
};

}  // namespace dsgd::torch_glue
