// Where a replica stands in its epochs, and its next batch (torch/replica/batch_cursor.h).
#include "torch/replica/batch_cursor.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include "comm/timeline.h"
#include "dsgd/common/error.h"

namespace dsgd::torch_glue {
namespace {

// The seed's epoch permutation; apps/local_job.cpp draws the same one.
torch::Tensor epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  auto gen = at::detail::createCPUGenerator(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch + 1));
  return torch::randperm(n, gen);
}

}  // namespace

std::string BatchCursor::where() const {
  return "epoch " + std::to_string(position_.epoch + 1) + ", batch " + std::to_string(position_.batch + 1);
}

EpochSampler BatchCursor::sampler() const {
  return {op_.num_train_samples(), options_.global_batch / options_.step.accumulate_steps, options_.info.world_size,
          options_.info.rank};
}

int64_t BatchCursor::batches_per_epoch() const {
  const int64_t n = options_.step.accumulate_steps;
  return (sampler().batches_per_epoch() + n - 1) / n;
}

int64_t BatchCursor::micro_batches_in_step() const {
  const int64_t n = options_.step.accumulate_steps;
  return std::min(n, sampler().batches_per_epoch() - position_.batch * n);
}

void BatchCursor::start_epoch_order() {
  if (order_epoch_ == position_.epoch) return;
  order_ = epoch_order(op_.num_train_samples(), options_.seed, position_.epoch);
  const auto& data = op_.train_data();
  if (data.defined() && !data.device().is_cpu()) order_ = order_.to(data.device());  // batches cut there
  order_epoch_ = position_.epoch;
}

bool BatchCursor::next(Batch& batch, int64_t max_steps) {
  const auto& dataset = op_.train_dataset();
  if (!op_.train_data().defined() && dataset == nullptr) {
    throw ConfigError(
        "train_epoch needs training data: call register_data() or register_dataset() in setup(), or "
        "override train_epoch");
  }
  if (position_.batch >= batches_per_epoch()) return false;
  if (micro_ == 0 && max_steps > 0 && taken_ >= max_steps) return false;
  start_epoch_order();
  comm::timeline::Span span("next batch");
  const EpochSampler s = sampler();
  const int64_t n = options_.step.accumulate_steps, micro_batch = position_.batch * n + micro_;
  const auto [begin, end] = s.part(micro_batch);
  auto idx = order_.slice(0, begin, end);
  if (dataset != nullptr) {  // read now, this replica's samples only
    batch = dataset->get_batch(idx);
    const torch::Device device = options_.info.device;
    batch.data = batch.data.to(device);
    if (batch.target.defined()) batch.target = batch.target.to(device);
  } else {
    batch.data = gather(op_.train_data(), idx);
    batch.target = op_.train_targets().defined() ? gather(op_.train_targets(), idx) : torch::Tensor();
  }
  weight_ = s.weight(micro_batch);
  if (n > 1) {  // each micro-batch's mean loss weighs its share of the step's samples
    const int64_t count = micro_batches_in_step();
    int64_t step_samples = 0;
    for (int64_t j = 0; j < count; ++j) step_samples += s.batch_size(position_.batch * n + j);
    loss_factor_ = static_cast<double>(s.batch_size(micro_batch)) / static_cast<double>(step_samples);
  }
  if (micro_ == 0) ++taken_;
  return true;
}

bool BatchCursor::end_micro_batch() {
  if (++micro_ < micro_batches_in_step()) return true;
  micro_ = 0;
  return false;
}

bool BatchCursor::end_epoch() {
  if (position_.batch < batches_per_epoch()) return false;
  ++position_.epoch;
  position_.batch = 0;
  return true;
}

torch::Tensor BatchCursor::gather(const torch::Tensor& data, const torch::Tensor& idx) const {
  const torch::Device device = options_.info.device;
  if (data.device() == device) return data.index_select(0, data.device().is_cpu() ? idx : idx.to(device));
  // Pinned data for a GPU: gathered into pinned memory, whose copy is asynchronous (LibTorch's
  // pinned allocator keeps the block until the copy is done).
  auto sizes = data.sizes().vec();
  sizes[0] = idx.size(0);
  auto staged = torch::empty(sizes, data.options().pinned_memory(true));
  torch::index_select_out(staged, data, 0, idx);
  return staged.to(device, /*non_blocking=*/true);
}

}  // namespace dsgd::torch_glue
