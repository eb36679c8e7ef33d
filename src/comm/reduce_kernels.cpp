#include "comm/reduce_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "dsgd/common/error.h"

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
      for (size_t i = 0; i < m; ++i)
        acc[i] = op == ReduceOp::kMax ? std::max(acc[i], ToFloat(s[i])) : acc[i] + ToFloat(s[i]);
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

namespace {

template <uint16_t (*Encode)(float), float (*Decode)(uint16_t)>
void encode_16_as(const float* in, float* residual, uint16_t* out, size_t count, float limit) {
  for (size_t i = 0; i < count; ++i) {
    const float x = residual != nullptr ? in[i] + residual[i] : in[i];
    const float v = std::isfinite(x) ? std::clamp(x, -limit, limit) : x;
    out[i] = Encode(v);
    if (residual != nullptr && std::isfinite(x)) residual[i] = x - Decode(out[i]);
  }
}

template <float (*Decode)(uint16_t)>
void decode_16_as(const uint16_t* src, float* dst, size_t count, bool accumulate) {
  if (accumulate) {
    for (size_t i = 0; i < count; ++i) dst[i] += Decode(src[i]);
  } else {
    for (size_t i = 0; i < count; ++i) dst[i] = Decode(src[i]);
  }
}

// float16 with the CPU's own conversions (F16C: 8 values an instruction, where _Float16 casts
// call libgcc one value at a time); the same rounding, so the same bits.
__attribute__((target("avx2,f16c"))) size_t encode_half_f16c(const float* in, float* residual, uint16_t* out,
                                                              size_t count) {
  const __m256 limit = _mm256_set1_ps(65504.0f), minus_limit = _mm256_set1_ps(-65504.0f);
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256 sign = _mm256_set1_ps(-0.0f);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 x = _mm256_loadu_ps(in + i);
    const __m256 old = residual != nullptr ? _mm256_loadu_ps(residual + i) : _mm256_setzero_ps();
    if (residual != nullptr) x = _mm256_add_ps(x, old);
    const __m256 finite = _mm256_cmp_ps(_mm256_andnot_ps(sign, x), inf, _CMP_LT_OQ);
    const __m256 clamped = _mm256_min_ps(_mm256_max_ps(x, minus_limit), limit);
    const __m128i h = _mm256_cvtps_ph(_mm256_blendv_ps(x, clamped, finite), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    if (residual != nullptr) {
      const __m256 fresh = _mm256_sub_ps(x, _mm256_cvtph_ps(h));
      _mm256_storeu_ps(residual + i, _mm256_blendv_ps(old, fresh, finite));
    }
  }
  return i;
}

__attribute__((target("avx2,f16c"))) size_t decode_half_f16c(const uint16_t* src, float* dst, size_t count,
                                                              bool accumulate) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, accumulate ? _mm256_add_ps(_mm256_loadu_ps(dst + i), v) : v);
  }
  return i;
}

const bool kHasF16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");

// bfloat16: the same as float_to_bfloat16 value by value, written so the compiler vectorises it.
DSGD_VECTORISED void encode_bfloat16(const float* in, float* residual, uint16_t* out, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const float x = residual != nullptr ? in[i] + residual[i] : in[i];
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint16_t b = static_cast<uint16_t>(nan ? ((bits >> 16) | 0x40u) : rounded);
    out[i] = b;
    if (residual != nullptr) {
      const uint32_t back_bits = static_cast<uint32_t>(b) << 16;
      float back;
      std::memcpy(&back, &back_bits, sizeof(back));
      // x not finite (the step is skipped), or so near the float range's end that it rounded
      // to infinity: the residual keeps its old value.
      const bool finite = (bits & 0x7f800000u) != 0x7f800000u && (back_bits & 0x7f800000u) != 0x7f800000u;
      residual[i] = finite ? x - back : residual[i];
    }
  }
}

DSGD_VECTORISED void decode_bfloat16(const uint16_t* src, float* dst, size_t count, bool accumulate) {
  for (size_t i = 0; i < count; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    float v;
    std::memcpy(&v, &bits, sizeof(v));
    dst[i] = accumulate ? dst[i] + v : v;
  }
}

void check_wire(DataType wire) {
  if (wire != DataType::kFloat16 && wire != DataType::kBFloat16) {
    throw Error("16-bit wire format: " + to_string(wire) + " is neither float16 nor bfloat16");
  }
}

}  // namespace

void encode_16(const float* in, float* residual, uint16_t* out, size_t count, DataType wire) {
  check_wire(wire);
  if (wire == DataType::kBFloat16) {
    encode_bfloat16(in, residual, out, count);
    return;
  }
  const size_t done = kHasF16c ? encode_half_f16c(in, residual, out, count) : 0;
  encode_16_as<float_to_half, half_to_float>(in + done, residual != nullptr ? residual + done : nullptr, out + done,
                                             count - done, 65504.0f);
}

void decode_16(const uint16_t* src, float* dst, size_t count, DataType wire, bool accumulate) {
  check_wire(wire);
  if (wire == DataType::kBFloat16) {
    decode_bfloat16(src, dst, count, accumulate);
    return;
  }
  const size_t done = kHasF16c ? decode_half_f16c(src, dst, count, accumulate) : 0;
  decode_16_as<half_to_float>(src + done, dst + done, count - done, accumulate);
}

}  // namespace dsgd::comm
