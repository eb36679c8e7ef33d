#include <ATen/ATen.h>
#include <torch/types.h>

#include <filesystem>

#include "data/idx.h"
#include "dsgd/data/datasets.h"
#include "dsgd/common/error.h"

namespace dsgd::data {
namespace {

constexpr int64_t kImageSide = 28;
constexpr int64_t kFashionMnistClasses = 10;
constexpr double kFashionMnistMean = 0.2860;
constexpr double kFashionMnistStd = 0.3530;

// Finds `stem` or `stem.gz` in `dir`.
std::string find_file(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw DataError(dir, "data directory not found; install dataset-fashion-mnist "
                         "(scripts/install-deps.sh) or pass --data-dir with the IDX files");
  }
  for (const auto& name : {stem + ".gz", stem}) {
    auto p = fs::path(dir) / name;
    if (fs::exists(p, ec)) return p.string();
  }
  throw DataError((fs::path(dir) / (stem + ".gz")).string(),
                  "file not found (nor " + stem + "); the directory must hold Fashion-MNIST's "
                  "four IDX files, as Debian's dataset-fashion-mnist installs them");
}

}  // namespace

ImageDataset::ImageDataset(torch::Tensor images, torch::Tensor labels, int64_t num_classes)
    : images_(std::move(images)), labels_(std::move(labels)), num_classes_(num_classes) {
  if (images_.dim() < 1 || labels_.dim() != 1 || images_.size(0) != labels_.size(0)) {
    throw ConfigError("ImageDataset: samples must be [N, ...] and labels [N]; got samples " +
                      std::to_string(images_.dim()) + "-d and labels " +
                      std::to_string(labels_.dim()) + "-d with different lengths");
  }
}

torch::data::Example<> ImageDataset::get(size_t index) {
  return {images_[static_cast<int64_t>(index)], labels_[static_cast<int64_t>(index)]};
}

torch::optional<size_t> ImageDataset::size() const { return static_cast<size_t>(length()); }

torch::data::Example<> ImageDataset::batch(const torch::Tensor& indices) const {
  return {images_.index_select(0, indices), labels_.index_select(0, indices)};
}

ImageDataset load_fashion_mnist(const std::string& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);

  if (images.dims.size() != 3 || images.dims[1] != kImageSide || images.dims[2] != kImageSide) {
    throw DataError(images_path, "wrong dimensions: expected N x 28 x 28 images, found " +
                                     images.shape_string() + " (is this a labels file?)");
  }
  if (labels.dims.size() != 1) {
    throw DataError(labels_path, "wrong dimensions: expected a 1-d array of labels, found " +
                                     labels.shape_string() + " (is this an images file?)");
  }
  if (images.count() != labels.count()) {
    throw DataError(labels_path, "image/label count mismatch: " + std::to_string(labels.count()) +
                                     " labels for " + std::to_string(images.count()) +
                                     " images in " + images_path);
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= kFashionMnistClasses) {
      throw DataError(labels_path, "label " + std::to_string(labels.data[i]) + " at index " +
                                       std::to_string(i) + " is outside 0..9");
    }
  }

  const int64_t n = images.count();
  auto pixels = torch::from_blob(images.data.data(), {n, 1, kImageSide, kImageSide}, torch::kUInt8);
  auto x = pixels.to(torch::kFloat32).div_(255.0).sub_(kFashionMnistMean).div_(kFashionMnistStd);
  auto y = torch::from_blob(labels.data.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return ImageDataset(std::move(x), std::move(y), kFashionMnistClasses);
}

ImageDataset make_synthetic(const SyntheticOptions& o) {
  if (o.num_samples < 1 || o.channels < 1 || o.image_size < 1 || o.num_classes < 2) {
    throw ConfigError("synthetic dataset: num_samples, channels and image_size must be >= 1 and "
                      "num_classes >= 2");
  }
  auto gen = at::detail::createCPUGenerator(o.seed);
  auto x = at::randn({o.num_samples, o.channels, o.image_size, o.image_size}, gen);
  const int64_t features = o.channels * o.image_size * o.image_size;
  auto teacher = at::randn({features, o.num_classes}, gen);
  auto y = x.reshape({o.num_samples, features}).matmul(teacher).argmax(1);
  return ImageDataset(std::move(x), std::move(y), o.num_classes);
}

}  // namespace dsgd::data
