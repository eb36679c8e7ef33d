// Tensors handed over in a torch.save file (dsgd/data/datasets.h: load_tensors_file).
#include <torch/serialize.h>

#include <fstream>
#include <iterator>
#include <sstream>

#include "dsgd/data/datasets.h"
#include "dsgd/common/error.h"

namespace dsgd::data {
namespace {

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// The dict entry `key` as a tensor; undefined when absent and !required.
torch::Tensor entry(const c10::Dict<c10::IValue, c10::IValue>& dict, const std::string& path, const std::string& key,
                    bool required) {
  const auto it = dict.find(key);
  if (it == dict.end()) {
    if (required) throw DataError(path, "no '" + key + "' tensor (torch.save a dict with train_x and train_y)");
    return {};
  }
  if (!it->value().isTensor()) {
    throw DataError(path, "'" + key + "' is a " + std::string(it->value().tagKind()) + ", not a tensor");
  }
  return it->value().toTensor();
}

torch::Tensor samples(const torch::Tensor& x, const std::string& path, const std::string& key) {
  if (!x.defined()) return x;
  if (!x.is_floating_point() || x.dim() < 1) {
    throw DataError(path, "'" + key + "' must be a floating-point tensor [N, ...], got " +
                              std::string(c10::toString(x.scalar_type())) + " " + shape_of(x));
  }
  return x.to(torch::kFloat32).contiguous();
}

torch::Tensor labels(const torch::Tensor& y, const torch::Tensor& x, const std::string& path, const std::string& key) {
  if (!y.defined()) return y;
  if (y.is_floating_point() || y.is_complex() || y.scalar_type() == torch::kBool || y.dim() != 1) {
    throw DataError(path, "'" + key + "' must be integer class labels [N], got " +
                              std::string(c10::toString(y.scalar_type())) + " " + shape_of(y));
  }
  if (y.size(0) != x.size(0)) {
    throw DataError(path, "'" + key + "' has " + std::to_string(y.size(0)) + " labels for " +
                              std::to_string(x.size(0)) + " samples");
  }
  if (y.numel() > 0 && y.min().item<int64_t>() < 0) throw DataError(path, "'" + key + "' holds a negative label");
  return y.to(torch::kInt64).contiguous();
}

}  // namespace

TensorData load_tensors_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "cannot open the tensors file");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw DataError(path, "cannot read it as a dict of tensors that torch.save wrote (" +
                              what.substr(0, what.find('\n')) + ")");
  }
  if (!value.isGenericDict()) {
    throw DataError(path, "holds a " + std::string(value.tagKind()) +
                              "; torch.save a dict {\"train_x\": x, \"train_y\": y, \"test_x\": ..., \"test_y\": ...}");
  }
  const auto dict = value.toGenericDict();
  TensorData d;
  d.train_x = samples(entry(dict, path, "train_x", true), path, "train_x");
  d.train_y = labels(entry(dict, path, "train_y", true), d.train_x, path, "train_y");
  d.test_x = samples(entry(dict, path, "test_x", false), path, "test_x");
  d.test_y = labels(entry(dict, path, "test_y", false), d.test_x, path, "test_y");
  if (d.test_x.defined() != d.test_y.defined()) throw DataError(path, "test_x and test_y come together, or neither");
  if (d.test_x.defined() && d.test_x.sizes().slice(1) != d.train_x.sizes().slice(1)) {
    throw DataError(path, "test_x's samples are " + shape_of(d.test_x) + ", train_x's " + shape_of(d.train_x));
  }
  if (d.train_x.size(0) == 0) throw DataError(path, "train_x holds no samples");
  int64_t largest = d.train_y.max().item<int64_t>();
  if (d.test_y.defined() && d.test_y.numel() > 0) largest = std::max(largest, d.test_y.max().item<int64_t>());
  d.num_classes = largest + 1;
  if (const auto it = dict.find("num_classes"); it != dict.end()) {
    if (!it->value().isInt() || it->value().toInt() <= largest) {
      throw DataError(path, "num_classes must be an int above the largest label (" + std::to_string(largest) + ")");
    }
    d.num_classes = it->value().toInt();
  }
  return d;
}

}  // namespace dsgd::data
