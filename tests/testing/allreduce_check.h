// Closed-form checks shared by the Group and ShmGroup tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comm/reduce_kernels.h"
#include "dsgd/comm/types.h"

namespace dsgd::comm {

// 16-bit values through their float32 converters: small integers and halves are exact in both.
template <typename Reduce>
inline void check_allreduce_16(int rank, int n, DataType type, Reduce&& allreduce) {
  const bool half = type == DataType::kFloat16;
  auto to16 = [&](float f) { return half ? float_to_half(f) : float_to_bfloat16(f); };
  auto to32 = [&](uint16_t h) { return half ? half_to_float(h) : bfloat16_to_float(h); };
  for (auto op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
      std::vector<uint16_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = to16(static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1)));
      allreduce(v.data(), count, op);
      for (size_t i = 0; i < count; ++i) {
        const float base = static_cast<float>(i % 7 + 1), sum = base * static_cast<float>(n * (n + 1) / 2);
        const float expected = op == ReduceOp::kSum   ? sum
                               : op == ReduceOp::kMax ? base * static_cast<float>(n)
                                                      : sum / static_cast<float>(n);
        ASSERT_EQ(to32(v[i]), expected) << to_string(type) << " " << to_string(op) << " count " << count << " at " << i;
      }
    }
  }
}

}  // namespace dsgd::comm
