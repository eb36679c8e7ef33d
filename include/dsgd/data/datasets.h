// dsgd/data/datasets.h — datasets: Fashion-MNIST from Debian's IDX files, synthetic images, and tensors
// handed over in a file (from Python).
//
//   auto train = dsgd::data::load_fashion_mnist(dsgd::data::kFashionMnistDir, dsgd::data::Split::kTrain);
//   auto b = train.batch(torch::arange(64));   // b.data: [64, 1, 28, 28] float, b.target: [64] int64
//
// Both are torch::data datasets held in memory (Fashion-MNIST: 60000 + 10000 images, 220 MB as
// float). Loading throws dsgd::DataError naming the file and the problem (missing, bad magic,
// truncated, wrong dimensions, image/label count mismatch, label out of range). After
// construction a dataset is immutable and safe to read from several threads.
#pragma once

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <cstdint>
#include <string>

namespace dsgd::data {

// Where Debian's dataset-fashion-mnist package puts the gzipped IDX files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

enum class Split { kTrain, kTest };

// An in-memory classification dataset: images, or samples of any other shape.
class ImageDataset : public torch::data::datasets::Dataset<ImageDataset> {
 public:
  // images: [N, C, H, W] float32 (or [N, ...]: any sample shape); labels: [N] int64 in
  // [0, num_classes).
  ImageDataset(torch::Tensor images, torch::Tensor labels, int64_t num_classes);

  torch::data::Example<> get(size_t index) override;
  torch::optional<size_t> size() const override;

  // The rows named by `indices` (int64, any order) as one stacked batch: much faster than get()
  // per example.
  torch::data::Example<> batch(const torch::Tensor& indices) const;

  const torch::Tensor& images() const { return images_; }
  const torch::Tensor& labels() const { return labels_; }
  int64_t num_classes() const { return num_classes_; }
  int64_t length() const { return labels_.size(0); }

 private:
  torch::Tensor images_;
  torch::Tensor labels_;
  int64_t num_classes_;
};

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir`, scales pixels to [0, 1] and
// normalizes them with the training set's mean (0.2860) and std (0.3530).
ImageDataset load_fashion_mnist(const std::string& dir, Split split);

struct SyntheticOptions {
  int64_t num_samples = 1024;
  int64_t channels = 1;
  int64_t image_size = 28;  // height = width
  int64_t num_classes = 10;
  uint64_t seed = 0;
};

// Random N(0,1) images for benchmarks. Labels come from a fixed random linear "teacher"
// (argmax of W·x), so the task is learnable and a loss that falls means training works.
ImageDataset make_synthetic(const SyntheticOptions& options);

// A classification dataset handed over as tensors, in a file written by Python's
//   torch.save({"train_x": x, "train_y": y, "test_x": xt, "test_y": yt}, path)
// (dsgd.Trainer(data=(x, y)) writes one). x: [N, ...] floating point, any sample shape (images
// [N, C, H, W], feature rows [N, D], ...), read as float32; y: [N] integer class labels, read as
// int64; the test pair may be left out. "num_classes" (an int) may say how many classes there
// are; otherwise the largest label + 1. DataError naming the file and the key for anything else.
struct TensorData {
  torch::Tensor train_x, train_y;
  torch::Tensor test_x, test_y;  // undefined when the file has none
  int64_t num_classes = 0;
};
TensorData load_tensors_file(const std::string& path);

}  // namespace dsgd::data
