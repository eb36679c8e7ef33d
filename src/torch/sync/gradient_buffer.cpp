#include "torch/sync/gradient_buffer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "comm/reduce_kernels.h"
#include "dsgd/common/error.h"

namespace dsgd::torch_glue {
namespace {

std::vector<size_t> element_counts(const std::vector<torch::Tensor>& params) {
  std::vector<size_t> counts;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (p.scalar_type() != torch::kFloat32 || !(p.device().is_cpu() || p.device().is_cuda())) {
      throw ConfigError("parameter " + std::to_string(i) + " is " + std::string(c10::toString(p.scalar_type())) +
                        " on " + p.device().str() + "; dsgd averages float32 parameters on the CPU or CUDA (convert " +
                        "the model with ->to(torch::kFloat32))");
    }
    if (p.device() != params[0].device()) {
      throw ConfigError("parameter " + std::to_string(i) + " is on " + p.device().str() + ", parameter 0 on " +
                        params[0].device().str() + "; a model's parameters must share one device");
    }
    counts.push_back(static_cast<size_t>(p.numel()));
  }
  return counts;
}

torch::Device device_of(const std::vector<torch::Tensor>& params) {
  return params.empty() ? torch::Device(torch::kCPU) : params[0].device();
}

// The host side: the strategy's memory for gradients where it has some (zeroed, and keeping the
// strategy, whose memory it is, alive), else a tensor of its own (pinned when it stages a GPU's
// gradients, so copies to and from the device are asynchronous).
torch::Tensor host_buffer(const std::shared_ptr<strategy::GradientStrategy>& strategy, size_t count, bool pinned,
                          bool* shared) {
  float* p = strategy ? strategy->gradient_buffer(count) : nullptr;
  *shared = p != nullptr;
  if (p == nullptr) {
    return torch::zeros({static_cast<int64_t>(count)}, torch::TensorOptions(torch::kFloat32).pinned_memory(pinned));
  }
  std::fill_n(p, count, 0.0f);
  return torch::from_blob(p, {static_cast<int64_t>(count)}, [keep = strategy](void*) {}, torch::kFloat32);
}

}  // namespace

GradientBuffer::GradientBuffer(const std::vector<torch::Tensor>& params, size_t grad_shard_bytes,
                               const std::shared_ptr<strategy::GradientStrategy>& strategy, size_t ring,
                               bool param_layout, int shards, int rank)
    : plan_(element_counts(params), sizeof(float), grad_shard_bytes),
      shards_(shards > 1 ? strategy::ShardLayout(plan_, shards, rank) : strategy::ShardLayout()),
      device_(device_of(params)),
      staged_(device_.is_cuda()),
      ring_(std::min(ring, plan_.buckets().size())) {
  if (ring_ > 0) {
    offsets_ = ring_offsets(plan_, ring_, shards);
  } else {  // every bucket in a place of its own
    offsets_.assign(1, 0);
    for (size_t b = 0; b < plan_.buckets().size(); ++b) {
      offsets_.push_back(offsets_.back() + (shards_.sharded() ? shards_.padded(b) : plan_.buckets()[b].count));
    }
  }
  host_ = host_buffer(strategy, offsets_.back(), staged_, &shared_);
  flat_ = staged_ ? torch::zeros({static_cast<int64_t>(offsets_.back())},
                                 torch::TensorOptions(torch::kFloat32).device(device_))
                  : host_;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& s = plan_.slot(i);
    const auto& p = params[i];
    const bool own = param_layout && p.is_non_overlapping_and_dense();
    // set_ rather than narrow(): the slot shares flat_'s storage without being an autograd view,
    // so Optimizer::zero_grad() may detach_() it once it is the parameter's .grad.
    slots_.push_back(torch::empty({0}, torch::TensorOptions(torch::kFloat32).device(device_))
                         .set_(flat_.storage(),
                               static_cast<int64_t>(base(s.bucket) + s.offset - plan_.buckets()[s.bucket].offset),
                               p.sizes(), own ? p.strides() : p.contiguous().strides()));
  }
}

size_t GradientBuffer::base(size_t bucket) const { return offsets_[ring_ > 0 ? bucket % ring_ : bucket]; }

void GradientBuffer::zero_padding(size_t bucket) {
  if (!shards_.sharded()) return;
  const size_t count = plan_.buckets()[bucket].count;
  std::fill(host_data(bucket) + count, host_data(bucket) + shards_.padded(bucket), 0.0f);
}

float* GradientBuffer::host_data(size_t bucket) const { return host_.data_ptr<float>() + base(bucket); }

torch::Tensor GradientBuffer::device_part(size_t bucket) const {
  return flat_.narrow(0, static_cast<int64_t>(base(bucket)), static_cast<int64_t>(plan_.buckets()[bucket].count));
}

torch::Tensor GradientBuffer::host_part(size_t bucket) const {
  return host_.narrow(0, static_cast<int64_t>(base(bucket)), static_cast<int64_t>(plan_.buckets()[bucket].count));
}

void GradientBuffer::to_device() {
  if (staged_) flat_.copy_(host_, /*non_blocking=*/true);
}

bool GradientBuffer::average_ok(size_t bucket) const {
  return plan_.buckets()[bucket].count == 0 || std::isfinite(*host_data(bucket));
}

size_t GradientBuffer::bytes() const {
  return static_cast<size_t>(host_.nbytes()) + (staged_ ? static_cast<size_t>(flat_.nbytes()) : 0);
}

void GradientBuffer::release_grads(const std::vector<torch::Tensor>& params, bool keep) const {
  if (!shared_ || staged_) return;
  for (const auto& p : params) {
    auto& g = p.mutable_grad();
    if (g.defined() && g.storage().is_alias_of(flat_.storage())) g = keep ? g.detach().clone() : torch::Tensor();
  }
}

bool GradientBuffer::fill_checked(torch::Tensor& dst, const torch::Tensor& grad, double weight) {
  float* out = dst.data_ptr<float>();
  const size_t n = static_cast<size_t>(dst.numel());
  if (grad.scalar_type() == torch::kFloat32 && grad.device().is_cpu() && grad.layout() == torch::kStrided &&
      grad.is_contiguous() && dst.is_contiguous() && grad.numel() == dst.numel()) {
    return comm::copy_scaled_below(out, grad.data_ptr<float>(), n, static_cast<float>(weight), kGradLimit);
  }
  torch::mul_out(dst, grad, weight);
  return comm::copy_scaled_below(out, out, n, 1.0f, kGradLimit);
}

bool check_gradient(torch::Tensor& t) {
  float* p = t.data_ptr<float>();
  return comm::copy_scaled_below(p, p, static_cast<size_t>(t.numel()), 1.0f, kGradLimit);
}

std::vector<size_t> ring_offsets(const strategy::BucketPlan& plan, size_t ring, int shards) {
  ring = std::min(ring, plan.buckets().size());
  const auto n = static_cast<size_t>(std::max(1, shards));
  std::vector<size_t> largest(ring, 0);  // buffer r holds buckets r, r + ring, ...: sized for the largest
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const size_t padded = (plan.buckets()[b].count + n - 1) / n * n;
    largest[b % ring] = std::max(largest[b % ring], padded);
  }
  std::vector<size_t> offsets(ring + 1, 0);
  for (size_t r = 0; r < ring; ++r) offsets[r + 1] = offsets[r] + largest[r];
  return offsets;
}

size_t ring_elements(const std::vector<size_t>& counts, size_t grad_shard_bytes, size_t ring, int shards) {
  const strategy::BucketPlan plan(counts, sizeof(float), grad_shard_bytes);
  if (ring > 0) return ring_offsets(plan, ring, shards).back();
  const auto n = static_cast<size_t>(std::max(1, shards));
  size_t floats = 0;
  for (const auto& b : plan.buckets()) floats += (b.count + n - 1) / n * n;
  return floats;
}

}  // namespace dsgd::torch_glue
