// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019; PyTorch DDP's powerSGD_hook): the
// across-host stage of an allreduce that sends a rank-R approximation of each matrix-shaped
// gradient instead of the gradient.
//
//   PowerSgd psgd({.rank = 4, .start_steps = 10});
//   // on a host's leader, with the host's float32 sum of one bucket in `data`:
//   bytes += psgd.reduce(leaders, bucket, data, count, timeout);    // data: the sum over hosts
//
// Per bucket, each call: its first start_steps calls are a plain float32 allreduce (the
// gradients of the first steps change too fast for a warm start to help, as the paper and DDP
// do it). Then, for every matrix M (n x m, a parameter viewed as its first dimension by the
// rest) whose rank-R factors are at most half its size, this host's M plus its error-feedback
// residual: P = M Q with Q (m x R) the last step's (warm start; at first random, the same on
// every leader); P summed over hosts (one float32 allreduce, with every value that is not
// compressed: vectors, small matrices); P's columns orthonormalised (Gram-Schmidt, the same on
// every leader); Q = M^T P summed over hosts (a second allreduce); the sum over hosts
// approximated by P Q^T. Each leader's residual becomes its M less 1/h of that approximation,
// so the residuals of the h hosts add up to what the approximation left out of the sum. A
// matrix of rank <= R comes back exact (up to float rounding).
//
// Bytes per leader: 2(h-1)/h x 4 (R(n + m) per matrix + the rest) against 2(h-1)/h x 4 nm.
// Stateless but for its options (each bucket's state is the caller's): thread-safe, one call at
// a time per bucket (the strategy's ordering contract). Torch-free.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dsgd/comm/group.h"

namespace dsgd::strategy {

// A matrix-shaped gradient inside a bucket: `rows` x `cols` floats from `offset` (elements from
// the bucket's start), row-major.
struct MatrixSlot {
  size_t offset = 0;
  size_t rows = 0;
  size_t cols = 0;
};

// What PowerSGD carries from one call to the next for a bucket: the calls so far (the plain
// start) and each compressed matrix's Q (the warm start). The caller keeps it with the
// bucket's residual (GradSync), so both travel in snapshots and checkpoints.
struct PowerSgdState {
  int64_t calls = 0;
  std::vector<std::vector<float>> q;  // per compressed matrix, R x cols (Q transposed, row-major)
};

// One bucket as PowerSGD sees it.
struct PowerSgdBucket {
  uint64_t index = 0;       // its position in its model's plan: the same on every leader (seeds Q)
  PowerSgdState* state = nullptr;  // its state (never null)
  float* residual = nullptr;  // count floats of this host's error feedback
  const std::vector<MatrixSlot>* matrices = nullptr;  // null: none
};

class PowerSgd {
 public:
  struct Options {
    int rank = 4;          // R, 1..1024
    int start_steps = 10;  // plain float32 allreduces per bucket first
    uint64_t seed = 1;     // of the initial Q
  };
  // ConfigError (its field() naming the TrainerConfig field) for a rank outside 1..1024 or
  // start_steps < 0: the one check of these settings, made by strategy::validate and here.
  static void validate(const Options& options);
  explicit PowerSgd(Options options);

  // The across-host stage for one bucket: `data` holds this host's float32 sum (count values)
  // and receives the (approximated) sum over the hosts of `group`. Returns the bytes this leader
  // sent (by the ring's count).
  uint64_t reduce(comm::Group& group, const PowerSgdBucket& bucket, float* data, size_t count,
                  std::chrono::milliseconds timeout);

  // Whether an n x m matrix is compressed at rank `rank`: its factors at most half its size.
  static bool compresses(size_t rows, size_t cols, int rank);

 private:
  const Options options_;
};

// Gram-Schmidt on the `cols` columns of the row-major rows x cols matrix `a`, in place: each
// column made orthogonal to the ones before it and of unit length (a zero column stays zero).
void orthonormalize_columns(float* a, size_t rows, size_t cols);

}  // namespace dsgd::strategy
