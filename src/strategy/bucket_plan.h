// How gradients are fused for communication: parameters packed into buckets of at most
// grad_shard_bytes, in reverse registration order (backward produces the last layers' gradients
// first), and a tracker that says when a bucket's last gradient has arrived, so the bucket can
// be handed to the communication thread while backward goes on.
//
//   BucketPlan plan({784 * 128, 128, 128 * 10, 10}, sizeof(float), 10 << 20);
//   ReadyTracker ready(plan);
//   // in each parameter's gradient hook:
//   if (auto b = ready.mark_ready(param_index)) comm->allreduce_async(flat + plan.buckets()[*b].offset, ...);
//
// Knows sizes and offsets only: torch-free, like the rest of src/strategy. BucketPlan is
// immutable; ReadyTracker is thread-safe (autograd may run hooks on several threads).
#pragma once

#include <cstddef>
#include <mutex>
#include <optional>
#include <vector>

namespace dsgd::strategy {

struct Bucket {
  size_t offset = 0;            // first element in the flat buffer
  size_t count = 0;             // elements
  std::vector<size_t> params;   // parameter indices, in the order they sit in the bucket
};

struct ParamSlot {
  size_t bucket = 0;
  size_t offset = 0;            // first element in the flat buffer
  size_t count = 0;
};

class BucketPlan {
 public:
  // counts[i]: elements of parameter i (registration order). A parameter larger than
  // grad_shard_bytes gets a bucket of its own. Throws dsgd::ConfigError for element_bytes or
  // grad_shard_bytes of 0.
  BucketPlan(const std::vector<size_t>& counts, size_t element_bytes, size_t grad_shard_bytes);

  // Bucket 0 holds the last-registered parameters and sits at the start of the flat buffer.
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ParamSlot& slot(size_t param) const { return slots_.at(param); }
  size_t num_params() const { return slots_.size(); }
  size_t total_elements() const { return total_; }

 private:
  std::vector<Bucket> buckets_;
  std::vector<ParamSlot> slots_;
  size_t total_ = 0;
};

// ZeRO's flat shards (StepConfig::zero_stage): each bucket padded to a multiple of `shards`
// elements and cut into `shards` equal blocks, block r replica r's. A reduce-scatter of the
// padded bucket leaves replica r the average of its block, an allgather of the blocks the whole
// bucket: together one allreduce's bytes. Balanced to within one element a bucket, whatever the
// tensors' sizes (one large embedding is split like any other run of elements).
//
//   ShardLayout shards(plan, /*shards=*/3, /*rank=*/1);
//   const auto& piece = shards.piece(i);   // parameter i's elements [begin, begin + count) here
class ShardLayout {
 public:
  struct Piece {
    size_t begin = 0;  // first element of the parameter (in its buffer order) in this replica's block
    size_t count = 0;  // 0: none of the parameter is this replica's
    size_t shard = 0;  // where it sits in this replica's shard (the blocks of every bucket, in order)
  };
  ShardLayout() = default;  // one replica: nothing cut
  ShardLayout(const BucketPlan& plan, int shards, int rank);

  bool sharded() const { return shards_ > 1; }
  int shards() const { return shards_; }
  int rank() const { return rank_; }
  // Elements of one block of `bucket` (its count, rounded up to a multiple of shards, / shards).
  size_t block(size_t bucket) const { return blocks_.at(bucket); }
  size_t padded(size_t bucket) const { return blocks_.at(bucket) * static_cast<size_t>(shards_); }
  size_t shard_offset(size_t bucket) const { return shard_offsets_.at(bucket); }  // this replica's block in its shard
  size_t shard_elements() const { return shard_elements_; }
  const Piece& piece(size_t param) const { return pieces_.at(param); }
  size_t num_params() const { return pieces_.size(); }

 private:
  int shards_ = 1, rank_ = 0;
  std::vector<size_t> blocks_, shard_offsets_;
  size_t shard_elements_ = 0;
  std::vector<Piece> pieces_;
};

// The forward overlap's schedule (Trainer's forward_overlap_buckets): which `deferred` of the
// `buckets` buckets travel after backward, while the next forward runs, and the order every
// replica launches them in. The deferred ones are spread evenly over buckets 1..n-1 (all n when
// deferred >= n), not the last ones: the next forward then waits for one now and then, at a layer
// whose bucket has just arrived, while the link carries the next deferred bucket, and the link
// stays busy until close to forward's end. Deferring the last buckets (the first layers') would
// leave it idle while forward runs through the layers sent during backward: on 2 to 8 hosts
// whose links are the limit, bench/overlap_model.py puts the step at 1.08-1.24x the bound that
// way, and at 1.04-1.09x spread.
struct OverlapSchedule {
  std::vector<bool> deferred;      // per bucket
  std::vector<size_t> launch_order;  // the others in index order, then the deferred by index descending
};
OverlapSchedule overlap_schedule(size_t buckets, size_t deferred);

class ReadyTracker {
 public:
  explicit ReadyTracker(const BucketPlan& plan);

  // Records that parameter `param`'s gradient is ready; returns its bucket's index when this
  // completed the bucket. Throws dsgd::Error if the parameter was already marked this step
  // (a gradient produced twice: the model reuses a parameter) or is out of range.
  std::optional<size_t> mark_ready(size_t param);

  // Starts a new step: nothing is ready.
  void reset();

  // Buckets not complete yet, ascending (for errors such as "bucket 3 never became ready:
  // parameters 5, 6 got no gradient; mark unused parameters or exclude them").
  std::vector<size_t> pending_buckets() const;

 private:
  const BucketPlan& plan_;
  mutable std::mutex mutex_;
  std::vector<bool> param_ready_;      // guarded by mutex_
  std::vector<size_t> bucket_missing_; // guarded by mutex_; parameters still missing per bucket
};

}  // namespace dsgd::strategy
