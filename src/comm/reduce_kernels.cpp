#include "comm/reduce_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace dsgd::comm {
namespace {

// target_clones compiles each loop twice (AVX2 and baseline x86-64) and picks at load time.
#define DSGD_VECTORISED __attribute__((target_clones("avx2", "default"), optimize("O3")))

template <typename T>
DSGD_VECTORISED void sum_into(T* __restrict dst, const T* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

template <typename T>
DSGD_VECTORISED void max_into(T* __restrict dst, const T* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
}

template <typename T>
void reduce_typed(void* dst, const void* src, size_t n, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    max_into(static_cast<T*>(dst), static_cast<const T*>(src), n);
  } else {
    sum_into(static_cast<T*>(dst), static_cast<const T*>(src), n);
  }
}

// A true division, vectorised: vdivps rounds exactly as divss does, so results do not depend on
// the clone picked (a multiply by the reciprocal would, for divisors that are not powers of 2).
template <typename T>
DSGD_VECTORISED void divide_into(T* __restrict p, size_t n, T divisor) {
  for (size_t i = 0; i < n; ++i) p[i] /= divisor;
}

template <typename T>
void divide_typed(void* dst, size_t n, int divisor) {
  divide_into(static_cast<T*>(dst), n, static_cast<T>(divisor));
}

// The largest magnitude's bits: at or above an infinity's (0x7f800000), some value is not finite.
// A max of integers vectorises where a float compare with an early exit would not.
DSGD_VECTORISED uint32_t max_magnitude_bits(const float* data, size_t n) {
  uint32_t worst = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &data[i], sizeof(bits));
    worst = std::max(worst, bits & 0x7fffffffu);
  }
  return worst;
}

DSGD_VECTORISED uint32_t scale_max_magnitude_bits(float* dst, const float* src, size_t n, float scale) {
  uint32_t worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = src[i] * scale;
    dst[i] = v;
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    worst = std::max(worst, bits & 0x7fffffffu);
  }
  return worst;
}

DSGD_VECTORISED uint32_t add_max_magnitude_bits(float* __restrict dst, const float* __restrict src, size_t n) {
  uint32_t worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = dst[i] + src[i];
    dst[i] = v;
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    worst = std::max(worst, bits & 0x7fffffffu);
  }
  return worst;
}

// 16-bit values: converted to float32, combined, rounded back.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce_16(void* dst, const void* src, size_t n, ReduceOp op) {
  auto* d = static_cast<uint16_t*>(dst);
  const auto* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) {
    const float a = ToFloat(d[i]), b = ToFloat(s[i]);
    d[i] = FromFloat(op == ReduceOp::kMax ? std::max(a, b) : a + b);
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce_many_16(void* dst, const void* const* srcs, int num_srcs, size_t count, ReduceOp op, int divisor) {
  constexpr size_t kChunk = 1024;
  float acc[kChunk];
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t start = 0; start < count; start += kChunk) {
    const size_t m = std::min(kChunk, count - start);
    for (size_t i = 0; i < m; ++i) acc[i] = ToFloat(d[start + i]);
    for (int k = 0; k < num_srcs; ++k) {
      const auto* s = static_cast<const uint16_t*>(srcs[k]) + start;
      for (size_t i = 0; i < m; ++i) acc[i] = op == ReduceOp::kMax ? std::max(acc[i], ToFloat(s[i])) : acc[i] + ToFloat(s[i]);
    }
    const float scale = divisor > 1 ? 1.0f / static_cast<float>(divisor) : 1.0f;
    for (size_t i = 0; i < m; ++i) d[start + i] = FromFloat(divisor > 1 ? acc[i] * scale : acc[i]);
  }
}

}  // namespace

bool all_finite(const float* data, size_t count) { return max_magnitude_bits(data, count) < 0x7f800000u; }

// For positive floats (and NaN, above every one) the order of the bits is the order of the values.
bool copy_scaled_below(float* dst, const float* src, size_t count, float scale, float limit) {
  uint32_t limit_bits;
  std::memcpy(&limit_bits, &limit, sizeof(limit_bits));
  return scale_max_magnitude_bits(dst, src, count, scale) < limit_bits;
}

bool add_into_finite(float* dst, const float* src, size_t count) {
  return add_max_magnitude_bits(dst, src, count) < 0x7f800000u;
}

float half_to_float(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, sizeof(v));
  return static_cast<float>(v);
}

uint16_t float_to_half(float f) {
  const _Float16 v = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &v, sizeof(h));
  return h;
}

float bfloat16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t float_to_bfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN stays NaN
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

void reduce_into(void* dst, const void* src, size_t count, DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat32: reduce_typed<float>(dst, src, count, op); break;
    case DataType::kFloat64: reduce_typed<double>(dst, src, count, op); break;
    case DataType::kInt64: reduce_typed<int64_t>(dst, src, count, op); break;
    case DataType::kFloat16: reduce_16<half_to_float, float_to_half>(dst, src, count, op); break;
    case DataType::kBFloat16: reduce_16<bfloat16_to_float, float_to_bfloat16>(dst, src, count, op); break;
  }
}

void divide_by(void* dst, size_t count, DataType type, int divisor) {
  if (divisor == 1) return;
  switch (type) {
    case DataType::kFloat32: divide_typed<float>(dst, count, divisor); break;
    case DataType::kFloat64: divide_typed<double>(dst, count, divisor); break;
    case DataType::kInt64: divide_typed<int64_t>(dst, count, divisor); break;
    case DataType::kFloat16:
    case DataType::kBFloat16: reduce_many(dst, nullptr, 0, count, type, ReduceOp::kSum, divisor); break;
  }
}

void reduce_many(void* dst, const void* const* srcs, int num_srcs, size_t count, DataType type, ReduceOp op,
                 int divisor) {
  if (type == DataType::kFloat16) {
    reduce_many_16<half_to_float, float_to_half>(dst, srcs, num_srcs, count, op, divisor);
  } else if (type == DataType::kBFloat16) {
    reduce_many_16<bfloat16_to_float, float_to_bfloat16>(dst, srcs, num_srcs, count, op, divisor);
  } else {
    for (int k = 0; k < num_srcs; ++k) reduce_into(dst, srcs[k], count, type, op);
    if (divisor > 1) divide_by(dst, count, type, divisor);
  }
}

}  // namespace dsgd::comm
