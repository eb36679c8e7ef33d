// A replica's shard under ZeRO (strategy::ShardLayout, StepConfig::zero_stage): its block of
// every bucket, on the parameters' device, and where gradients are staged (CUDA) a pinned host
// copy, which the strategy reduces into and gathers from. Between backward's end and the step
// it holds the averages of this replica's pieces of the parameters (grad(i), a view, is piece
// i's .grad); after the step, packed, the pieces' new values on their way to every replica.
//
//   ShardBuffer shard(buffer.shards(), device);
//   sharing->reduce_scatter_async(buffer.host_data(b), shard.host_block(b), layout.block(b));
//   piece.mutable_grad() = shard.grad(i);
//   shard.pack(b, params); sharing->allgather_async(shard.host_block(b), buffer.host_data(b), ...);
#pragma once

#include <torch/types.h>

#include <vector>

#include "strategy/bucket_plan.h"

namespace dsgd::torch_glue {

// Elements [begin, begin + count) of `t` in the order they sit in memory, as a 1-D view (t
// non-overlapping and dense, as GradientBuffer lays out a parameter's slot).
torch::Tensor memory_view(const torch::Tensor& t, size_t begin, size_t count);

class ShardBuffer {
 public:
  ShardBuffer(const strategy::ShardLayout& layout, torch::Device device);
  ShardBuffer(const ShardBuffer&) = delete;
  ShardBuffer& operator=(const ShardBuffer&) = delete;

  // This replica's block of `bucket`, where the strategy writes its averages and reads what it
  // gathers (host memory).
  float* host_block(size_t bucket) const;
  // Piece `param`'s averaged gradient: a view of the shard on the device (undefined: no piece).
  const torch::Tensor& grad(size_t param) const { return grads_[param]; }
  // The block's averages were finite (its first float: where a replica whose gradients failed
  // the check put a NaN).
  bool block_ok(size_t bucket) const;
  // Staged: the host copy into the device shard (after a reduction), or the reverse (before a
  // gather), queued in the device's stream.
  void to_device(size_t bucket);
  void to_host(size_t bucket);
  // The new values of this replica's pieces of `params` (the GradSync's, in plan order) into
  // `bucket`'s block.
  void pack(size_t bucket, const strategy::BucketPlan& plan, const std::vector<torch::Tensor>& params);
  size_t bytes() const;

 private:
  torch::Tensor part(const torch::Tensor& t, size_t bucket) const;

  const strategy::ShardLayout& layout_;
  const bool staged_;
  torch::Tensor shard_;  // on the device
  torch::Tensor host_;   // shard_ itself on the CPU; pinned on CUDA
  std::vector<torch::Tensor> grads_;
};

}  // namespace dsgd::torch_glue
