#include "dsgd/comm/types.h"

#include <algorithm>

#include "dsgd/common/error.h"

namespace dsgd::comm {

size_t element_size(DataType type) {
  switch (type) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kInt64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
  }
  return 0;
}

std::string to_string(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
  }
  return "?";
}

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

std::string to_string(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kAuto: return "auto";
    case AllreduceAlgorithm::kRing: return "ring";
    case AllreduceAlgorithm::kHalvingDoubling: return "hd";
  }
  return "?";
}

AllreduceAlgorithm resolve_allreduce_algorithm(AllreduceAlgorithm requested, int ranks, size_t bytes) {
  const bool power_of_two = ranks > 0 && (ranks & (ranks - 1)) == 0;
  if (requested == AllreduceAlgorithm::kHalvingDoubling && !power_of_two) return AllreduceAlgorithm::kRing;
  if (requested != AllreduceAlgorithm::kAuto) return requested;
  if (ranks < 2 || !power_of_two) return AllreduceAlgorithm::kRing;
  size_t log2n = 0;
  while ((1 << (log2n + 1)) <= ranks) ++log2n;
  const size_t saved_steps = 2 * static_cast<size_t>(ranks - 1) - 2 * log2n;
  const size_t max_bytes = std::max<size_t>(256 * 1024, saved_steps * 128 * 1024);
  return bytes <= max_bytes ? AllreduceAlgorithm::kHalvingDoubling : AllreduceAlgorithm::kRing;
}

AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name) {
  if (name == "auto") return AllreduceAlgorithm::kAuto;
  if (name == "ring") return AllreduceAlgorithm::kRing;
  if (name == "hd") return AllreduceAlgorithm::kHalvingDoubling;
  throw ConfigError("unknown allreduce algorithm '" + name + "'; known: auto, ring, hd");
}

}  // namespace dsgd::comm
