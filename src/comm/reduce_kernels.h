// Element-wise reductions on raw buffers: dst[i] = dst[i] op src[i]. Vectorised (AVX2 where the
// CPU has it, chosen at load time), type-erased so callers need no templates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dsgd/comm/types.h"

namespace dsgd::comm {

// kAverage reduces as kSum; the caller divides.
void reduce_into(void* dst, const void* src, size_t count, DataType type, ReduceOp op);

// dst[i] /= divisor (integer division for kInt64).
void divide_by(void* dst, size_t count, DataType type, int divisor);

// dst[i] = op(dst[i], srcs[0][i], srcs[1][i], ...), then / divisor when divisor > 1. 16-bit types
// accumulate in float32 and round once at the end.
void reduce_many(void* dst, const void* const* srcs, int num_srcs, size_t count, DataType type, ReduceOp op,
                 int divisor);

// 16-bit conversions (round to nearest even).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

}  // namespace dsgd::comm
