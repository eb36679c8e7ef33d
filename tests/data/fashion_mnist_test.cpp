// Fashion-MNIST loading: crafted directories (good and damaged) and, when installed, the real one.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <filesystem>

#include "dsgd/data/datasets.h"
#include "dsgd/common/error.h"
#include "testing/idx_writer.h"
#include "testing/temp_dir.h"

namespace dsgd::data {
namespace {

using testing::counting_bytes;
using testing::idx_bytes;

// Writes a test split of `n` images (side x side) and `labels` labels into `dir`.
void write_split(const testing::TempDir& dir, uint32_t n, uint32_t side = 28, int labels = -1,
                 int first_label = 0) {
  const uint32_t num_labels = labels < 0 ? n : static_cast<uint32_t>(labels);
  testing::write_gzip(dir.file("t10k-images-idx3-ubyte.gz"),
                      idx_bytes({n, side, side}, counting_bytes(n * side * side)));
  std::string l(num_labels, '\0');
  for (uint32_t i = 0; i < num_labels; ++i) l[i] = static_cast<char>((first_label + i) % 10);
  testing::write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"), idx_bytes({num_labels}, l));
}

template <typename Fn>
std::string data_error_message(Fn fn) {
  try {
    fn();
  } catch (const DataError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a DataError";
  return "";
}

TEST(FashionMnist, LoadsCraftedSplitNormalized) {
  testing::TempDir dir;
  write_split(dir, 5);
  ImageDataset ds = load_fashion_mnist(dir.path().string(), Split::kTest);
  ASSERT_EQ(ds.length(), 5);
  EXPECT_EQ(*ds.size(), 5u);
  EXPECT_EQ(ds.images().sizes(), (std::vector<int64_t>{5, 1, 28, 28}));
  EXPECT_EQ(ds.images().dtype(), torch::kFloat32);
  EXPECT_EQ(ds.labels().dtype(), torch::kInt64);
  EXPECT_EQ(ds.labels()[3].item<int64_t>(), 3);
  // Pixel (image 0, row 0, col 2) is byte 2: (2/255 - 0.2860) / 0.3530.
  EXPECT_NEAR(ds.images()[0][0][0][2].item<float>(), (2.0 / 255 - 0.2860) / 0.3530, 1e-6);
  auto b = ds.batch(torch::tensor({4, 1}, torch::kInt64));
  EXPECT_EQ(b.data.size(0), 2);
  EXPECT_EQ(b.target[0].item<int64_t>(), 4);
  auto one = ds.get(2);
  EXPECT_EQ(one.target.item<int64_t>(), 2);
}

TEST(FashionMnist, PlainFilesWorkToo) {
  testing::TempDir dir;
  testing::write_plain(dir.file("t10k-images-idx3-ubyte"), idx_bytes({2, 28, 28}, counting_bytes(2 * 28 * 28)));
  testing::write_plain(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({2}, std::string("\x01\x02", 2)));
  EXPECT_EQ(load_fashion_mnist(dir.path().string(), Split::kTest).length(), 2);
}

TEST(FashionMnist, MissingDirectoryNamesIt) {
  const std::string msg = data_error_message([] { load_fashion_mnist("/nonexistent/fmnist", Split::kTrain); });
  EXPECT_NE(msg.find("/nonexistent/fmnist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--data-dir"), std::string::npos) << msg;
}

TEST(FashionMnist, MissingLabelsFileNamesIt) {
  testing::TempDir dir;
  write_split(dir, 3);
  std::filesystem::remove(dir.file("t10k-labels-idx1-ubyte.gz"));
  const std::string msg = data_error_message([&] { load_fashion_mnist(dir.path().string(), Split::kTest); });
  EXPECT_NE(msg.find("t10k-labels-idx1-ubyte.gz: file not found"), std::string::npos) << msg;
}

TEST(FashionMnist, WrongImageDimensions) {
  testing::TempDir dir;
  write_split(dir, 3, /*side=*/27);
  const std::string msg = data_error_message([&] { load_fashion_mnist(dir.path().string(), Split::kTest); });
  EXPECT_NE(msg.find("t10k-images-idx3-ubyte.gz: wrong dimensions: expected N x 28 x 28 images, found 3 x 27 x 27"),
            std::string::npos)
      << msg;
}

TEST(FashionMnist, LabelsFileWithImageShape) {
  testing::TempDir dir;
  write_split(dir, 2);
  testing::write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"), idx_bytes({2, 28, 28}, counting_bytes(2 * 28 * 28)));
  const std::string msg = data_error_message([&] { load_fashion_mnist(dir.path().string(), Split::kTest); });
  EXPECT_NE(msg.find("expected a 1-d array of labels, found 2 x 28 x 28"), std::string::npos) << msg;
}

TEST(FashionMnist, ImageLabelCountMismatch) {
  testing::TempDir dir;
  write_split(dir, 4, 28, /*labels=*/3);
  const std::string msg = data_error_message([&] { load_fashion_mnist(dir.path().string(), Split::kTest); });
  EXPECT_NE(msg.find("image/label count mismatch: 3 labels for 4 images"), std::string::npos) << msg;
}

TEST(FashionMnist, LabelOutOfRange) {
  testing::TempDir dir;
  write_split(dir, 3);
  testing::write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"), idx_bytes({3}, std::string("\x01\x0c\x02", 3)));
  const std::string msg = data_error_message([&] { load_fashion_mnist(dir.path().string(), Split::kTest); });
  EXPECT_NE(msg.find("label 12 at index 1 is outside 0..9"), std::string::npos) << msg;
}

TEST(FashionMnist, RealDatasetWhenInstalled) {
  if (!std::filesystem::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << kFashionMnistDir
                 << "; run scripts/install-deps.sh (package dataset-fashion-mnist)";
  }
  ImageDataset train = load_fashion_mnist(kFashionMnistDir, Split::kTrain);
  ImageDataset test = load_fashion_mnist(kFashionMnistDir, Split::kTest);
  EXPECT_EQ(train.length(), 60000);
  EXPECT_EQ(test.length(), 10000);
  // Fashion-MNIST is balanced: 6000 training images per class.
  auto counts = torch::bincount(train.labels());
  for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[c].item<int64_t>(), 6000) << "class " << c;
  // Normalized with the training set's statistics: mean ~0, std ~1.
  EXPECT_NEAR(train.images().mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(train.images().std().item<double>(), 1.0, 0.01);
}

TEST(Synthetic, ShapesAndLearnableDeterministicLabels) {
  ImageDataset a = make_synthetic({.num_samples = 64, .channels = 3, .image_size = 8, .num_classes = 5, .seed = 9});
  ImageDataset b = make_synthetic({.num_samples = 64, .channels = 3, .image_size = 8, .num_classes = 5, .seed = 9});
  EXPECT_EQ(a.images().sizes(), (std::vector<int64_t>{64, 3, 8, 8}));
  EXPECT_TRUE(a.images().equal(b.images()));
  EXPECT_TRUE(a.labels().equal(b.labels()));
  EXPECT_GE(a.labels().min().item<int64_t>(), 0);
  EXPECT_LT(a.labels().max().item<int64_t>(), 5);
  EXPECT_GT(std::get<0>(at::_unique(a.labels())).numel(), 1);  // not all one class
  EXPECT_THROW(make_synthetic({.num_samples = 0}), ConfigError);
}

}  // namespace
}  // namespace dsgd::data
