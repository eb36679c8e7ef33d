// A replica's shard under ZeRO (torch/sync/shard_buffer.h).
#include "torch/sync/shard_buffer.h"

#include <cmath>

#include "dsgd/common/error.h"

namespace dsgd::torch_glue {

torch::Tensor memory_view(const torch::Tensor& t, size_t begin, size_t count) {
  require_checked(t.is_non_overlapping_and_dense(), "a sharded tensor is dense (ZeroShare checks its parameters)");
  return t.detach().as_strided({static_cast<int64_t>(count)}, {1}, t.storage_offset() + static_cast<int64_t>(begin));
}

ShardBuffer::ShardBuffer(const strategy::ShardLayout& layout, torch::Device device)
    : layout_(layout), staged_(device.is_cuda()) {
  const auto n = static_cast<int64_t>(layout.shard_elements());
  shard_ = torch::zeros({n}, torch::TensorOptions(torch::kFloat32).device(device));
  host_ = staged_ ? torch::zeros({n}, torch::TensorOptions(torch::kFloat32).pinned_memory(true)) : shard_;
  for (size_t i = 0; i < layout.num_params(); ++i) {
    const auto& p = layout.piece(i);
    grads_.push_back(p.count == 0 ? torch::Tensor()
                                  : shard_.narrow(0, static_cast<int64_t>(p.shard), static_cast<int64_t>(p.count)));
  }
}

float* ShardBuffer::host_block(size_t bucket) const { return host_.data_ptr<float>() + layout_.shard_offset(bucket); }

bool ShardBuffer::block_ok(size_t bucket) const {
  return layout_.block(bucket) == 0 || std::isfinite(*host_block(bucket));
}

torch::Tensor ShardBuffer::part(const torch::Tensor& t, size_t bucket) const {
  return t.narrow(0, static_cast<int64_t>(layout_.shard_offset(bucket)), static_cast<int64_t>(layout_.block(bucket)));
}

void ShardBuffer::to_device(size_t bucket) {
  if (staged_) part(shard_, bucket).copy_(part(host_, bucket), /*non_blocking=*/true);
}

void ShardBuffer::to_host(size_t bucket) {
  if (staged_) part(host_, bucket).copy_(part(shard_, bucket));  // blocking: the gather reads it next
}

void ShardBuffer::pack(size_t bucket, const strategy::BucketPlan& plan, const std::vector<torch::Tensor>& params) {
  for (size_t i : plan.buckets()[bucket].params) {
    const auto& p = layout_.piece(i);
    if (p.count > 0) grads_[i].copy_(memory_view(params[i], p.begin, p.count));
  }
}

size_t ShardBuffer::bytes() const {
  return static_cast<size_t>(shard_.nbytes()) + (staged_ ? static_cast<size_t>(host_.nbytes()) : 0);
}

}  // namespace dsgd::torch_glue
