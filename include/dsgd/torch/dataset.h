// dsgd/torch/dataset.h — what a replica trains on: a Batch, and a Dataset read by index.
//
//   class MyData : public dsgd::Dataset {               // e.g. records in a file
//     int64_t size() const override { return n_; }
//     dsgd::Batch get_batch(const torch::Tensor& indices) const override { ... read those ... }
//   };
//   register_dataset(std::make_shared<MyData>(...));    // in TrainingOperator::setup (operator.h)
//
// For data that is not (or should not be) a pair of tensors in memory: a file read as the batches
// are taken (dsgd/data/text.h's TokenDataset, memory-mapped), or any source of the user's. The runtime
// asks each replica's dataset for the samples its sampler gives that replica only, one batch at
// a time; a batch comes back on the CPU and the runtime moves it to the replica's device.
// get_batch must give the same samples for the same indices every time (a recovery replays
// steps), and may be called from several replicas' threads at once. Header only.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace dsgd {

struct Batch {
  torch::Tensor data;
  torch::Tensor target;
  int64_t size() const { return data.defined() ? data.size(0) : 0; }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;  // samples, indexed 0..size()-1
  // The samples at `indices` (int64 [B], any order), stacked along dimension 0.
  virtual Batch get_batch(const torch::Tensor& indices) const = 0;
};

}  // namespace dsgd
