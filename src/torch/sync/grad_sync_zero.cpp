// GradSync's part in ZeRO (grad_sync.h, strategy::ShardLayout): where a bucket's reduction goes,
// the parameters gathered after the step (through the flat buffer at stage 1, the ring at
// stage 2), and stage 2's ring: a bucket's gradients reduced from a ring buffer into this
// replica's block.
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "comm/timeline.h"
#include "dsgd/common/error.h"
#include "torch/sync/grad_sync.h"

namespace dsgd::torch_glue {

float* GradSync::reduce_out_locked(size_t bucket) {
  if (buffer_.ring() == 0 || !acc_.held) return shard_->host_block(bucket);
  // Stage 2 after a micro-batch: the block holds the step's earlier averages; this one lands in
  // place, in this replica's block of the ring buffer, and is added at consume_locked.
  const auto& shards = buffer_.shards();
  return buffer_.host_data(bucket) + static_cast<size_t>(shards.rank()) * shards.block(bucket);
}

void GradSync::mark_not_finite(size_t bucket, float* data) const {
  // Tells every replica: the first element of the average it gets is then NaN, on every replica.
  const size_t count = buffer_.plan().buckets()[bucket].count;
  if (count == 0) return;
  if (!shard_) {
    data[0] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const auto& shards = buffer_.shards();
  for (int r = 0; r < shards.shards(); ++r) {  // each replica reads its own block's first
    data[static_cast<size_t>(r) * shards.block(bucket)] = std::numeric_limits<float>::quiet_NaN();
  }
}

size_t GradSync::gradient_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return buffer_.bytes() + (shard_ ? shard_->bytes() : 0);
}

void GradSync::share_parameters() {
  if (!shard_) return;
  comm::timeline::Span span("share parameters");
  torch::NoGradGuard no_grad;
  auto* sharing = strategy_->sharing();
  const auto& plan = buffer_.plan();
  const auto& buckets = plan.buckets();
  const auto& shards = buffer_.shards();
  // Stage 1: every bucket has its own place in the flat buffer, all in flight at once. Stage 2:
  // bucket b waits for bucket b - ring, whose ring buffer it takes.
  const size_t window = buffer_.ring() > 0 ? buffer_.ring() : buckets.size();
  std::vector<std::shared_ptr<comm::Work>> works(buckets.size());
  const auto unpack = [&](size_t k) {
    if (!works[k]) return;
    works[k]->wait();
    // In the device's queue, before the copies out of the slots below.
    if (buffer_.staged()) buffer_.device_part(k).copy_(buffer_.host_part(k), /*non_blocking=*/true);
    for (size_t i : buckets[k].params) params_[i].copy_(buffer_.slot(i));
  };
  for (size_t k = 0; k < buckets.size(); ++k) {  // packed and launched one by one: packing overlaps the gathers
    if (k >= window) unpack(k - window);
    if (shards.block(k) == 0) continue;
    shard_->pack(k, plan, params_);
    shard_->to_host(k);  // staged: a blocking copy (the packing kernels done first)
    works[k] = sharing->allgather_async(shard_->host_block(k), buffer_.host_data(k), shards.block(k));
  }
  for (size_t k = buckets.size() > window ? buckets.size() - window : 0; k < buckets.size(); ++k) unpack(k);
}

// ---- stage 2: the ring ----

torch::Tensor GradSync::on_grad_ring_locked(std::unique_lock<std::mutex>& lock, size_t param,
                                            const torch::Tensor& grad) {
  const size_t bucket = buffer_.plan().slot(param).bucket;
  params_[param].mutable_grad() = torch::Tensor();  // AccumulateGrad takes what this returns
  // The gradient times the weight where it goes; checked there. Every micro-batch is averaged.
  const auto fill = [&](torch::Tensor& dst) {
    if (!GradientBuffer::fill_checked(dst, grad, weight_)) bw_.ok[bucket] = false;
  };
  if (!claim_ring_locked(lock, bucket)) {  // an earlier bucket, not yet launched, holds it
    auto& aside = ring_.stash[param];
    aside = torch::empty_like(buffer_.slot(param));
    fill(aside);
    return aside.detach();
  }
  unstash_locked(bucket);
  fill(buffer_.slot(param));
  --bw_.missing[bucket];
  launch_ready_locked(false);
  return buffer_.slot(param).detach();
}

bool GradSync::claim_ring_locked(std::unique_lock<std::mutex>& lock, size_t bucket) {
  auto& holder = ring_.holder[bucket % buffer_.ring()];
  while (holder != static_cast<int64_t>(bucket)) {
    if (holder < 0) {
      holder = static_cast<int64_t>(bucket);
    } else if (static_cast<size_t>(holder) > bucket) {  // launched only after this one: never waited for
      evict_locked(static_cast<size_t>(holder));
    } else if (bw_.works[static_cast<size_t>(holder)]) {
      consume_locked(lock, static_cast<size_t>(holder));  // launched: its averages out, the buffer free
    } else {
      return false;  // an earlier bucket still filling
    }
  }
  return true;
}

void GradSync::consume_locked(std::unique_lock<std::mutex>& lock, size_t bucket) {
  auto work = std::move(bw_.works[bucket]);
  const auto t0 = std::chrono::steady_clock::now();
  lock.unlock();
  try {
    comm::timeline::Span span("wait", static_cast<int64_t>(bucket));
    work->wait();
  } catch (...) {
    lock.lock();
    throw;
  }
  lock.lock();
  waits_.count(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const size_t block = buffer_.shards().block(bucket);
  if (acc_.held) {  // the block holds the step's earlier micro-batches' averages: this one is added
    const float* average = reduce_out_locked(bucket);
    float* sum = shard_->host_block(bucket);
    ring_.finite = ring_.finite && (block == 0 || std::isfinite(average[0]));
    for (size_t j = 0; j < block; ++j) sum[j] += average[j];
  } else {
    ring_.finite = ring_.finite && shard_->block_ok(bucket);
  }
  ring_.consumed[bucket] = 1;
  ring_.holder[bucket % buffer_.ring()] = -1;
}

void GradSync::evict_locked(size_t bucket) {
  torch::NoGradGuard no_grad;
  for (size_t i : buffer_.plan().buckets()[bucket].params) {
    if (!bw_.got_grad[i] || ring_.stash[i].defined()) continue;
    ring_.stash[i] = buffer_.slot(i).clone();
    ++bw_.missing[bucket];
  }
  ring_.holder[bucket % buffer_.ring()] = -1;
}

void GradSync::unstash_locked(size_t bucket) {
  torch::NoGradGuard no_grad;
  for (size_t i : buffer_.plan().buckets()[bucket].params) {
    if (!ring_.stash[i].defined()) continue;
    buffer_.slot(i).copy_(ring_.stash[i]);
    ring_.stash[i] = torch::Tensor();
    --bw_.missing[bucket];
  }
}

void GradSync::finalize_ring() {
  std::unique_lock<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  const auto& buckets = buffer_.plan().buckets();
  std::exception_ptr error;
  try {
    for (size_t b = 0; b < buckets.size(); ++b) {  // the rest in launch order (index order here)
      if (b < bw_.next_launch) continue;               // launched already
      // Every earlier bucket is launched by now: its ring buffer can be waited for.
      if (!claim_ring_locked(lock, b)) {
        throw Error("GradSync: bucket " + std::to_string(b) + " found no ring buffer");
      }
      unstash_locked(b);
      for (size_t i : buckets[b].params) {  // parameters without a gradient give zeros
        if (bw_.got_grad[i]) continue;
        buffer_.slot(i).zero_();
        --bw_.missing[b];
      }
      launch_ready_locked(true);
    }
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (!ring_.consumed[b]) consume_locked(lock, b);
    }
  } catch (...) {
    error = std::current_exception();
    for (auto& w : bw_.works) {  // nothing may still write into the ring
      if (!w) continue;
      lock.unlock();
      try {
        w->wait();
      } catch (...) {
      }
      lock.lock();
      w.reset();
    }
  }
  std::fill(ring_.consumed.begin(), ring_.consumed.end(), 0);
  std::fill(ring_.holder.begin(), ring_.holder.end(), -1);
  for (auto& s : ring_.stash) s = torch::Tensor();
  reset_backward_locked();
  const bool held = acc_.hold && !error;
  acc_.held = held;  // a micro-batch before the step's last: the blocks keep the sum so far
  if (!held) {
    last_finite_ = ring_.finite;
    ring_.finite = true;
  }
  if (error) std::rethrow_exception(error);
  if (held) last_finite_ = true;  // said at the step's last micro-batch
}

}  // namespace dsgd::torch_glue
