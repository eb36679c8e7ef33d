// Which samples each replica trains on: the distributed sampler's arithmetic (torch-free).
//
//   EpochSampler s{.num_samples = 60000, .global_batch = 64, .world_size = 3, .rank = 1};
//   auto [begin, end] = s.part(b);     // this replica's slice of global batch b, in epoch order
//   double w = s.weight(b);            // its share of the batch, times world_size
//
// Each epoch's order is a permutation of the training set drawn from (seed, epoch) alone (the
// replica draws it: torch/replica/replica.cpp); global batch b is elements [b*B, (b+1)*B) of it, cut
// into world_size contiguous parts as even as possible, part r for rank r. Averaging each
// replica's mean gradient weighted by weight(b) gives exactly the single-process gradient of the
// global batch. A last partial batch smaller than world_size is dropped.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

namespace dsgd::torch_glue {

struct EpochSampler {
  int64_t num_samples = 0;
  int64_t global_batch = 1;
  int64_t world_size = 1;
  int64_t rank = 0;

  // Global batches in an epoch.
  int64_t batches_per_epoch() const {
    return num_samples / global_batch + ((num_samples % global_batch) >= world_size ? 1 : 0);
  }
  // Samples in global batch b (the last may be short).
  int64_t batch_size(int64_t b) const {
    return std::min(num_samples, (b + 1) * global_batch) - b * global_batch;
  }
  // [begin, end): this rank's positions in the epoch order for global batch b.
  std::pair<int64_t, int64_t> part(int64_t b) const {
    const int64_t start = b * global_batch;
    const int64_t size = batch_size(b);
    const int64_t base = size / world_size, extra = size % world_size;
    const int64_t begin = start + rank * base + std::min(rank, extra);
    return {begin, begin + base + (rank < extra ? 1 : 0)};
  }
  // This rank's share of batch b's samples times world_size: the weight of its mean gradient in
  // an average over replicas (1 when the batch divides evenly).
  double weight(int64_t b) const {
    const auto [begin, end] = part(b);
    return static_cast<double>(end - begin) * static_cast<double>(world_size) / static_cast<double>(batch_size(b));
  }
};

}  // namespace dsgd::torch_glue
