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

// Whether every data[i] is finite (no NaN, no infinity), in one read.
bool all_finite(const float* data, size_t count);

// dst[i] = src[i] * scale (in float32, as torch::mul rounds), returning whether every |dst[i]|
// is below `limit` (> 0; NaN never is): a gradient's copy into its bucket and its check in one
// pass (torch_glue::GradSync). dst == src is allowed.
bool copy_scaled_below(float* dst, const float* src, size_t count, float scale, float limit);

// dst[i] += src[i] (rounding as torch's add_ does), returning whether every new dst[i] is finite:
// a gradient's accumulation and its NaN check in one pass (torch_glue::GradCheck).
bool add_into_finite(float* dst, const float* src, size_t count);

// A float32 buffer in 16 bits for the wire (`wire` kFloat16 or kBFloat16), with error feedback:
// x = in[i] + residual[i]; out[i] = x rounded to nearest even (float16: finite values beyond its
// range saturate to +-65504); residual[i] = x - out[i], so what was sent plus the new residual
// is what there was to send. Where x is not finite the residual keeps its old value (the step
// that carries it is skipped everywhere). residual null: plain rounding, nothing kept.
void encode_16(const float* in, float* residual, uint16_t* out, size_t count, DataType wire);
// dst[i] += float(src[i]), or dst[i] = float(src[i]) when `accumulate` is false.
void decode_16(const uint16_t* src, float* dst, size_t count, DataType wire, bool accumulate);

// 16-bit conversions (round to nearest even).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

}  // namespace dsgd::comm
