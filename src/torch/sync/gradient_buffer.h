// The memory a GradSync's gradients pass through, laid out by a strategy::BucketPlan (reverse
// registration order, buckets of grad_shard_bytes): a flat float32 buffer on the parameters'
// device with one slot per parameter, and its host side, which the strategy averages: the
// buffer itself on the CPU, a pinned copy on CUDA. The host side is the strategy's
// gradient_buffer where it offers one (a host's shared memory, which the allreduce then reads in
// place). A slot shares the buffer's storage, shaped and strided like its parameter (channels
// last stays so: the optimizer's multi-tensor kernels want gradients laid out as their
// parameters, as c10d's Reducer does it), or packed in logical order where the strategy's
// servers take the values as parameters.
//
// Under ZeRO (a ShardLayout over several replicas) each bucket's place is padded to its
// layout's padded size (zeros past its gradients: a reduce-scatter reads whole blocks). Under
// stage 2 (ring > 0) the buffer holds `ring` bucket-sized buffers instead of every gradient:
// bucket b in buffer b % ring, each as large as the largest of its buckets.
//
//   GradientBuffer buffer(params, 10 << 20, strategy, /*ring=*/0, /*param_layout=*/true);
//   ok = GradientBuffer::fill_checked(buffer.slot(i), grad, weight);   // in the hook
//   strategy->average_async(buffer.host_data(b), buffer.plan().buckets()[b].count);
//
// The check: NaN, infinity, or a magnitude of 2^111 or more (kGradLimit: below it a sum over up
// to 2^16 replicas cannot leave the float range, so an average can only be non-finite where some
// replica's part failed the check). A replica whose bucket fails it sets the bucket's first
// element to NaN before sending it, so average_ok reads one float per bucket and every replica
// gets the same answer.
#pragma once

#include <torch/types.h>

#include <memory>
#include <vector>

#include "strategy/bucket_plan.h"
#include "strategy/strategy.h"

namespace dsgd::torch_glue {

// Stage 2's layout. kRingBuckets: the ring buffers a GradSync takes unless told otherwise.
inline constexpr size_t kRingBuckets = 8;
// Where each ring buffer starts (and, last, the ring's size), in floats: buffer r is as large as
// the largest of the buckets it takes (r, r + ring, ...), so one large parameter costs once.
// Buckets padded for `shards` replicas (ShardLayout).
std::vector<size_t> ring_offsets(const strategy::BucketPlan& plan, size_t ring, int shards = 1);
// The floats of shared memory a buffer over parameters of these sizes asks for: every bucket
// (ring 0) or a stage-2 ring, padded for `shards` replicas.
size_t ring_elements(const std::vector<size_t>& counts, size_t grad_shard_bytes, size_t ring = kRingBuckets,
                     int shards = 1);

// The check's bound (header comment).
inline constexpr float kGradLimit = 0x1p111f;
// t's values (contiguous float on the CPU) against kGradLimit.
bool check_gradient(torch::Tensor& t);

class GradientBuffer {
 public:

  // Throws ConfigError unless every parameter is float32, all on the CPU or all on one CUDA device.
  // shards > 1: padded for a ShardLayout over that many replicas (rank: this one's).
  GradientBuffer(const std::vector<torch::Tensor>& params, size_t grad_shard_bytes,
                 const std::shared_ptr<strategy::GradientStrategy>& strategy, size_t ring, bool param_layout,
                 int shards = 1, int rank = 0);
  GradientBuffer(const GradientBuffer&) = delete;
  GradientBuffer& operator=(const GradientBuffer&) = delete;

  const strategy::BucketPlan& plan() const { return plan_; }
  const strategy::ShardLayout& shards() const { return shards_; }
  torch::Device device() const { return device_; }
  bool staged() const { return staged_; }  // on CUDA: the strategy averages a host copy
  size_t ring() const { return ring_; }
  torch::Tensor& slot(size_t param) { return slots_[param]; }
  const std::vector<torch::Tensor>& slots() const { return slots_; }
  // Where `bucket`'s floats are on the host side: what the strategy averages.
  float* host_data(size_t bucket) const;
  // Past `bucket`'s gradients, up to its padded size: back to zeros (after a marker or a gather).
  void zero_padding(size_t bucket);
  // `bucket`'s floats in the device buffer and on the host side (not under stage 2).
  torch::Tensor device_part(size_t bucket) const;
  torch::Tensor host_part(size_t bucket) const;
  // Staged: the host side's averages into the device buffer, queued before later kernels.
  void to_device();
  // After its wait: no replica's part of `bucket` failed the check (its first float is finite).
  bool average_ok(size_t bucket) const;
  size_t bytes() const;  // the host side, and the device buffer where staged
  // Before the buffer goes: each parameter's .grad that still shares the strategy's memory
  // becomes a copy (keep) or undefined (torn gradients: the step is redone).
  void release_grads(const std::vector<torch::Tensor>& params, bool keep) const;

  // dst = grad times weight, checked against kGradLimit: one pass over memory where grad is a
  // contiguous float tensor on the CPU (the usual case), else LibTorch's copy, then the check.
  // Returns whether every value passed.
  static bool fill_checked(torch::Tensor& dst, const torch::Tensor& grad, double weight);

 private:
  size_t base(size_t bucket) const;  // where its floats start in host_ (and flat_)

  strategy::BucketPlan plan_;
  strategy::ShardLayout shards_;
  const torch::Device device_;
  const bool staged_;
  const size_t ring_;                 // 0: one buffer for every gradient
  std::vector<size_t> offsets_;       // where each bucket starts (each ring buffer, under stage 2); last: the end
  bool shared_ = false;               // host_ is the strategy's gradient_buffer
  torch::Tensor host_;                // what the strategy averages
  torch::Tensor flat_;                // the gradients on device_ (host_ itself on the CPU)
  std::vector<torch::Tensor> slots_;  // flat_'s storage, one per parameter, shaped like it
};

}  // namespace dsgd::torch_glue
