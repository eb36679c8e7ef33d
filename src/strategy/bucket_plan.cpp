#include "strategy/bucket_plan.h"

#include <algorithm>
#include <string>

#include "dsgd/common/error.h"

namespace dsgd::strategy {

BucketPlan::BucketPlan(const std::vector<size_t>& counts, size_t element_bytes, size_t grad_shard_bytes) {
  if (element_bytes == 0 || grad_shard_bytes == 0) {
    throw ConfigError("bucket plan: element size and grad_shard_bytes must be positive (got " +
                      std::to_string(element_bytes) + " and " + std::to_string(grad_shard_bytes) + ")");
  }
  const size_t cap = std::max<size_t>(1, grad_shard_bytes / element_bytes);
  slots_.resize(counts.size());
  for (size_t k = counts.size(); k-- > 0;) {  // reverse registration order
    const size_t n = counts[k];
    if (buckets_.empty() || (buckets_.back().count > 0 && buckets_.back().count + n > cap)) {
      buckets_.push_back({total_, 0, {}});
    }
    Bucket& b = buckets_.back();
    slots_[k] = {buckets_.size() - 1, total_, n};
    b.params.push_back(k);
    b.count += n;
    total_ += n;
  }
}

ShardLayout::ShardLayout(const BucketPlan& plan, int shards, int rank) : shards_(shards), rank_(rank) {
  if (shards < 1 || rank < 0 || rank >= shards) {
    throw Error("ShardLayout: rank " + std::to_string(rank) + " of " + std::to_string(shards) + " shards");
  }
  const auto n = static_cast<size_t>(shards), r = static_cast<size_t>(rank);
  pieces_.resize(plan.num_params());
  for (const auto& b : plan.buckets()) {
    const size_t block = (b.count + n - 1) / n;
    const size_t lo = b.offset + r * block, hi = std::min(b.offset + b.count, lo + block);  // this replica's
    for (size_t i : b.params) {
      const auto& s = plan.slot(i);
      const size_t from = std::max(lo, s.offset), to = std::min(hi, s.offset + s.count);
      if (from < to) pieces_[i] = {from - s.offset, to - from, shard_elements_ + from - lo};
    }
    blocks_.push_back(block);
    shard_offsets_.push_back(shard_elements_);
    shard_elements_ += block;
  }
}

OverlapSchedule overlap_schedule(size_t buckets, size_t deferred) {
  OverlapSchedule s;
  s.deferred.assign(buckets, deferred >= buckets);
  if (deferred > 0 && deferred < buckets) {
    for (size_t i = 0; i < deferred; ++i)
      s.deferred[1 + i * (buckets - 1) / deferred] = true;  // distinct: (n-1)/d >= 1
  }
  for (size_t b = 0; b < buckets; ++b) {
    if (!s.deferred[b]) s.launch_order.push_back(b);
  }
  for (size_t b = buckets; b-- > 0;) {
    if (s.deferred[b]) s.launch_order.push_back(b);
  }
  return s;
}

ReadyTracker::ReadyTracker(const BucketPlan& plan) : plan_(plan) { reset(); }

void ReadyTracker::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  param_ready_.assign(plan_.num_params(), false);
  bucket_missing_.clear();
  for (const auto& b : plan_.buckets()) bucket_missing_.push_back(b.params.size());
}

std::optional<size_t> ReadyTracker::mark_ready(size_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (param >= param_ready_.size()) {
    throw Error("gradient of parameter " + std::to_string(param) + " reported, but the model has " +
                std::to_string(param_ready_.size()) + " parameters");
  }
  if (param_ready_[param]) {
    throw Error("the gradient of parameter " + std::to_string(param) +
                " was produced twice in one step (a parameter used twice in forward?); buckets "
                "need each gradient once");
  }
  param_ready_[param] = true;
  const size_t b = plan_.slot(param).bucket;
  if (--bucket_missing_[b] == 0) return b;
  return std::nullopt;
}

std::vector<size_t> ReadyTracker::pending_buckets() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<size_t> out;
  for (size_t b = 0; b < bucket_missing_.size(); ++b) {
    if (bucket_missing_[b] > 0) out.push_back(b);
  }
  return out;
}

}  // namespace dsgd::strategy
