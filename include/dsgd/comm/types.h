// dsgd/comm/types.h — what the communication layer knows of data: bytes, a dtype and a count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsgd::comm {

// kFloat16 (IEEE half) and kBFloat16 are reduced in float32: the shared-memory path
// accumulates all ranks' values in float32 and rounds once; a Gloo ring rounds after each step.
enum class DataType : uint8_t { kFloat32, kFloat64, kInt64, kFloat16, kBFloat16 };

enum class ReduceOp : uint8_t {
  kSum,
  kAverage,  // sum, then divide by the group size (integer division for kInt64)
  kMax,
};

enum class AllreduceAlgorithm : uint8_t {
  kAuto,             // resolve_allreduce_algorithm: halving-doubling for power-of-two groups up
                     // to a size that grows with the steps it saves, else ring
  kRing,             // chunked ring: reduce-scatter then allgather; bandwidth-optimal
  kHalvingDoubling,  // recursive halving-doubling (Gloo's BCube, base 2): log2(n) steps;
                     // power-of-two group sizes, others fall back to ring
};

size_t element_size(DataType type);
std::string to_string(DataType type);
std::string to_string(ReduceOp op);
std::string to_string(AllreduceAlgorithm algorithm);
// What a group of `ranks` runs when asked for `requested` on `bytes`; never kAuto. kAuto: on
// power-of-two groups halving-doubling, which moves the ring's bytes in 2 log2(n) dependent steps
// where the ring takes 2(n-1), up to 256 KiB, or 128 KiB per step it saves if that is more (8
// ranks: 8 steps saved, up to 1 MiB); else the ring, whose pipelined chunks do as well or better
// past that. kHalvingDoubling on a group that is not a power of two becomes kRing.
AllreduceAlgorithm resolve_allreduce_algorithm(AllreduceAlgorithm requested, int ranks, size_t bytes);
// Parses "ring", "hd", "auto" (as the CLI spells them); throws dsgd::ConfigError otherwise.
AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name);

}  // namespace dsgd::comm
