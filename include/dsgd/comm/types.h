// dsgd/comm/types.h — what the communication layer knows of data: bytes, a dtype and a count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsgd::comm {

enum class DataType : uint8_t { kFloat32, kFloat64, kInt64 };

enum class ReduceOp : uint8_t {
  kSum,
  kAverage,  // sum, then divide by the group size (integer division for kInt64)
  kMax,
};

enum class AllreduceAlgorithm : uint8_t {
  kAuto,             // halving-doubling for power-of-two groups below 256 KiB, else ring
  kRing,             // chunked ring: reduce-scatter then allgather; bandwidth-optimal
  kHalvingDoubling,  // recursive halving-doubling (Gloo's BCube, base 2): log2(n) steps;
                     // power-of-two group sizes, others fall back to ring
};

size_t element_size(DataType type);
std::string to_string(DataType type);
std::string to_string(ReduceOp op);
std::string to_string(AllreduceAlgorithm algorithm);
// Parses "ring", "hd", "auto" (as the CLI spells them); throws dsgd::ConfigError otherwise.
AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name);

}  // namespace dsgd::comm
