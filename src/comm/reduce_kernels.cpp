#include "comm/reduce_kernels.h"

#include <algorithm>
#include <cstdint>

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

template <typename T>
void divide_typed(void* dst, size_t n, int divisor) {
  T* p = static_cast<T*>(dst);
  for (size_t i = 0; i < n; ++i) p[i] /= static_cast<T>(divisor);
}

}  // namespace

void reduce_into(void* dst, const void* src, size_t count, DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat32: reduce_typed<float>(dst, src, count, op); break;
    case DataType::kFloat64: reduce_typed<double>(dst, src, count, op); break;
    case DataType::kInt64: reduce_typed<int64_t>(dst, src, count, op); break;
  }
}

void divide_by(void* dst, size_t count, DataType type, int divisor) {
  switch (type) {
    case DataType::kFloat32: divide_typed<float>(dst, count, divisor); break;
    case DataType::kFloat64: divide_typed<double>(dst, count, divisor); break;
    case DataType::kInt64: divide_typed<int64_t>(dst, count, divisor); break;
  }
}

}  // namespace dsgd::comm
