#include "strategy/powersgd.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "comm/reduce_kernels.h"
#include "dsgd/error.h"

namespace dsgd::strategy {
namespace {

// Bytes a float32 ring allreduce of `floats` values sends per rank among `ranks`.
uint64_t ring_bytes(int ranks, size_t floats) {
  return 2 * static_cast<uint64_t>(ranks - 1) * floats * sizeof(float) / static_cast<uint64_t>(ranks);
}

// The three products below as dot products and axpys over contiguous rows, which vectorise
// (target_clones: AVX2 where the CPU has it); Q is kept transposed (R x cols) for that.
#define DSGD_VECTORISED __attribute__((target_clones("avx2", "default"), optimize("O3")))

DSGD_VECTORISED float dot(const float* __restrict a, const float* __restrict b, size_t n) {
  float acc[16] = {};
  size_t k = 0;
  for (; k + 16 <= n; k += 16) {
    for (size_t l = 0; l < 16; ++l) acc[l] += a[k + l] * b[k + l];
  }
  float sum = 0;
  for (float x : acc) sum += x;
  for (; k < n; ++k) sum += a[k] * b[k];
  return sum;
}

DSGD_VECTORISED void axpy(float* __restrict y, const float* __restrict x, float a, size_t n) {
  for (size_t k = 0; k < n; ++k) y[k] += a * x[k];
}

// p (rows x r) = m (rows x cols) qt^T, qt being r x cols
void project(const float* m, const float* qt, float* p, size_t rows, size_t cols, size_t r) {
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < r; ++j) p[i * r + j] = dot(m + i * cols, qt + j * cols, cols);
  }
}

// qt (r x cols) = p^T m: row j of it sums row i of m times p[i][j]
void back_project(const float* m, const float* p, float* qt, size_t rows, size_t cols, size_t r) {
  std::fill(qt, qt + r * cols, 0.0f);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < r; ++j) axpy(qt + j * cols, m + i * cols, p[i * r + j], cols);
  }
}

}  // namespace

void orthonormalize_columns(float* a, size_t rows, size_t cols) {
  for (size_t j = 0; j < cols; ++j) {
    for (size_t k = 0; k < j; ++k) {
      double dot = 0;
      for (size_t i = 0; i < rows; ++i) dot += static_cast<double>(a[i * cols + j]) * a[i * cols + k];
      for (size_t i = 0; i < rows; ++i) a[i * cols + j] -= static_cast<float>(dot) * a[i * cols + k];
    }
    double norm = 0;
    for (size_t i = 0; i < rows; ++i) norm += static_cast<double>(a[i * cols + j]) * a[i * cols + j];
    norm = std::sqrt(norm);
    if (norm > 0) {
      for (size_t i = 0; i < rows; ++i) a[i * cols + j] = static_cast<float>(a[i * cols + j] / norm);
    }
  }
}

bool PowerSgd::compresses(size_t rows, size_t cols, int rank) {
  const size_t r = static_cast<size_t>(rank);
  return rows > 1 && cols > 1 && 2 * r * (rows + cols) <= rows * cols;
}

PowerSgd::PowerSgd(Options options) : options_(options) {
  if (options_.rank < 1 || options_.rank > 1024) {
    throw ConfigError("powersgd rank must be in 1..1024, got " + std::to_string(options_.rank));
  }
  if (options_.start_steps < 0) {
    throw ConfigError("powersgd start steps must be >= 0, got " + std::to_string(options_.start_steps));
  }
}

uint64_t PowerSgd::reduce(comm::Group& group, const PowerSgdBucket& bucket, float* data, size_t count,
                          std::chrono::milliseconds timeout) {
  const int h = group.size();
  PowerSgdState& st = *bucket.state;
  ++st.calls;
  std::vector<const MatrixSlot*> comp;
  if (bucket.matrices != nullptr && bucket.residual != nullptr && st.calls > options_.start_steps) {
    for (const auto& m : *bucket.matrices) {
      if (compresses(m.rows, m.cols, options_.rank)) comp.push_back(&m);
    }
  }
  if (comp.empty()) {
    group.allreduce(data, count, comm::DataType::kFloat32, comm::ReduceOp::kSum, comm::AllreduceAlgorithm::kAuto,
                    timeout);
    return ring_bytes(h, count);
  }
  const size_t r = static_cast<size_t>(options_.rank);
  if (st.q.size() != comp.size()) {  // the first compressed call: Q random, the same on every leader
    st.q.assign(comp.size(), {});
    for (size_t i = 0; i < comp.size(); ++i) {
      std::mt19937_64 gen(options_.seed * 0x9e3779b97f4a7c15ULL + bucket.index * 1000003ULL + i);
      std::normal_distribution<float> normal;
      st.q[i].resize(r * comp[i]->cols);  // transposed: R x cols
      for (float& x : st.q[i]) x = normal(gen);
    }
  }
  // This host's M: its sum plus its residual, in place.
  std::vector<char> compressed(count, 0);
  size_t p_floats = 0, q_floats = 0;
  for (const auto* m : comp) {
    const size_t n = m->rows * m->cols;
    for (size_t e = m->offset; e < m->offset + n; ++e) {
      data[e] += bucket.residual[e];
      compressed[e] = 1;
    }
    p_floats += m->rows * r;
    q_floats += m->cols * r;
  }
  // First allreduce: every P, then every value not compressed.
  std::vector<float> first(p_floats);
  first.reserve(p_floats + count);
  for (size_t e = 0; e < count; ++e) {
    if (!compressed[e]) first.push_back(data[e]);
  }
  size_t at = 0;
  for (size_t i = 0; i < comp.size(); ++i) {
    project(data + comp[i]->offset, st.q[i].data(), first.data() + at, comp[i]->rows, comp[i]->cols, r);
    at += comp[i]->rows * r;
  }
  const auto deadline = std::chrono::steady_clock::now() + (timeout.count() > 0 ? timeout : group.timeout());
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
  };
  group.allreduce(first.data(), first.size(), comm::DataType::kFloat32, comm::ReduceOp::kSum,
                  comm::AllreduceAlgorithm::kAuto, left());
  for (size_t e = 0, rest = p_floats; e < count; ++e) {
    if (!compressed[e]) data[e] = first[rest++];
  }
  // Second allreduce: Q = M^T P with P orthonormal (each Q transposed, R x cols).
  std::vector<float> second(q_floats);
  at = 0;
  size_t qat = 0;
  for (size_t i = 0; i < comp.size(); ++i) {
    float* p = first.data() + at;
    orthonormalize_columns(p, comp[i]->rows, r);
    back_project(data + comp[i]->offset, p, second.data() + qat, comp[i]->rows, comp[i]->cols, r);
    at += comp[i]->rows * r;
    qat += comp[i]->cols * r;
  }
  group.allreduce(second.data(), second.size(), comm::DataType::kFloat32, comm::ReduceOp::kSum,
                  comm::AllreduceAlgorithm::kAuto, left());
  // A NaN or infinity (a replica's failed check) reaches every leader: the step is skipped
  // everywhere, and the residuals and Q stay as they were.
  const bool finite = comm::all_finite(second.data(), second.size()) && comm::all_finite(first.data(), p_floats);
  at = 0;
  qat = 0;
  const float share = 1.0f / static_cast<float>(h);
  for (size_t i = 0; i < comp.size(); ++i) {
    const auto& m = *comp[i];
    const float* p = first.data() + at;
    const float* q = second.data() + qat;
    std::vector<float> approx(m.cols);
    for (size_t row = 0; row < m.rows; ++row) {
      float* di = data + m.offset + row * m.cols;
      float* ri = bucket.residual + m.offset + row * m.cols;
      std::fill(approx.begin(), approx.end(), 0.0f);
      for (size_t j = 0; j < r; ++j) axpy(approx.data(), q + j * m.cols, p[row * r + j], m.cols);
      for (size_t k = 0; k < m.cols; ++k) {
        if (finite) ri[k] = di[k] - share * approx[k];
        di[k] = approx[k];
      }
    }
    if (finite) st.q[i].assign(q, q + r * m.cols);
    at += m.rows * r;
    qat += m.cols * r;
  }
  return ring_bytes(h, first.size()) + ring_bytes(h, second.size());
}

}  // namespace dsgd::strategy
