#include "strategy/powersgd.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "comm/reduce_kernels.h"
#include "dsgd/common/error.h"

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

void PowerSgd::validate(const Options& o) {
  if (o.rank < 1 || o.rank > 1024) {
    throw ConfigError("comm.powersgd_rank must be in 1..1024, got " + std::to_string(o.rank), "comm.powersgd_rank");
  }
  if (o.start_steps < 0) {
    throw ConfigError("comm.powersgd_start_steps must be >= 0, got " + std::to_string(o.start_steps),
                      "comm.powersgd_start_steps");
  }
}

PowerSgd::PowerSgd(Options options) : options_(options) { validate(options_); }

namespace {

// The first compressed call of a bucket: each matrix's Q (transposed, rank x cols) random, the
// same on every leader (seeded by the job's seed, the bucket and the matrix).
void initial_q(PowerSgdState& st, const std::vector<const MatrixSlot*>& comp, uint64_t seed, size_t bucket,
               size_t r) {
  st.q.assign(comp.size(), {});
  for (size_t i = 0; i < comp.size(); ++i) {
    std::mt19937_64 gen(seed * 0x9e3779b97f4a7c15ULL + bucket * 1000003ULL + i);
    std::normal_distribution<float> normal;
    st.q[i].resize(r * comp[i]->cols);
    for (float& x : st.q[i]) x = normal(gen);
  }
}

// The first round's message: this host's M (its sum plus its residual, made in place in
// `data`) projected on Q, every P first, then every value not compressed (as they are). Marks
// the compressed elements in `compressed`; `p_floats` gets the P's length.
std::vector<float> first_round(const PowerSgdBucket& bucket, const std::vector<const MatrixSlot*>& comp, float* data,
                               size_t count, size_t r, std::vector<char>* compressed, size_t* p_floats) {
  compressed->assign(count, 0);
  *p_floats = 0;
  for (const auto* m : comp) {
    const size_t n = m->rows * m->cols;
    for (size_t e = m->offset; e < m->offset + n; ++e) {
      data[e] += bucket.residual[e];
      (*compressed)[e] = 1;
    }
    *p_floats += m->rows * r;
  }
  std::vector<float> first(*p_floats);
  first.reserve(*p_floats + count);
  for (size_t e = 0; e < count; ++e) {
    if (!(*compressed)[e]) first.push_back(data[e]);
  }
  size_t at = 0;
  for (size_t i = 0; i < comp.size(); ++i) {
    project(data + comp[i]->offset, bucket.state->q[i].data(), first.data() + at, comp[i]->rows, comp[i]->cols, r);
    at += comp[i]->rows * r;
  }
  return first;
}

// The second round's message: each P (summed) made orthonormal in place, then Q = M^T P.
std::vector<float> second_round(const std::vector<const MatrixSlot*>& comp, const float* data, float* ps,
                                size_t r) {
  size_t q_floats = 0;
  for (const auto* m : comp) q_floats += m->cols * r;
  std::vector<float> second(q_floats);
  size_t at = 0, qat = 0;
  for (const auto* m : comp) {
    orthonormalize_columns(ps + at, m->rows, r);
    back_project(data + m->offset, ps + at, second.data() + qat, m->rows, m->cols, r);
    at += m->rows * r;
    qat += m->cols * r;
  }
  return second;
}

// Each matrix becomes P Q^T (the sum over hosts' approximation); where the step is `finite`,
// the residual keeps what it left out of this host's share and Q is kept for the next call.
void decompress(const PowerSgdBucket& bucket, const std::vector<const MatrixSlot*>& comp, const float* ps,
                const float* qs, float* data, size_t r, float share, bool finite) {
  size_t at = 0, qat = 0;
  for (size_t i = 0; i < comp.size(); ++i) {
    const auto& m = *comp[i];
    const float* p = ps + at;
    const float* q = qs + qat;
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
    if (finite) bucket.state->q[i].assign(q, q + r * m.cols);
    at += m.rows * r;
    qat += m.cols * r;
  }
}

}  // namespace

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
  if (st.q.size() != comp.size()) initial_q(st, comp, options_.seed, bucket.index, r);
  const auto deadline = std::chrono::steady_clock::now() + (timeout.count() > 0 ? timeout : group.timeout());
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
  };
  // First allreduce: every P, then every value not compressed.
  std::vector<char> compressed;
  size_t p_floats = 0;
  std::vector<float> first = first_round(bucket, comp, data, count, r, &compressed, &p_floats);
  group.allreduce(first.data(), first.size(), comm::DataType::kFloat32, comm::ReduceOp::kSum,
                  comm::AllreduceAlgorithm::kAuto, left());
  for (size_t e = 0, rest = p_floats; e < count; ++e) {
    if (!compressed[e]) data[e] = first[rest++];
  }
  // Second allreduce: Q = M^T P with P orthonormal (each Q transposed, R x cols).
  std::vector<float> second = second_round(comp, data, first.data(), r);
  group.allreduce(second.data(), second.size(), comm::DataType::kFloat32, comm::ReduceOp::kSum,
                  comm::AllreduceAlgorithm::kAuto, left());
  // A NaN or infinity (a replica's failed check) reaches every leader: the step is skipped
  // everywhere, and the residuals and Q stay as they were.
  const bool finite = comm::all_finite(second.data(), second.size()) && comm::all_finite(first.data(), p_floats);
  decompress(bucket, comp, first.data(), second.data(), data, r, 1.0f / static_cast<float>(h), finite);
  return ring_bytes(h, first.size()) + ring_bytes(h, second.size());
}

}  // namespace dsgd::strategy
