// SGD as torch::optim::SGD computes it, on flat float arrays: for strategies whose servers
// apply the optimizer (ps with update on shards, ps_async). Torch-free.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "strategy/strategy.h"

namespace dsgd::strategy {

// One pass of torch::optim::SGD's arithmetic over n elements: g holds the average gradient on
// entry and the new parameters on exit; p and m (momentum) are updated in place. The options'
// branches are template arguments, so each loop is branch-free and vectorises.
template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
inline void sgd_loop(const SgdOptions& o, float* __restrict g, float* __restrict p, float* __restrict m, size_t n) {
  const float keep = 1 - o.dampening, step = -o.lr;
  for (size_t i = 0; i < n; ++i) {
    float d = g[i];
    if constexpr (kDecay) d += o.weight_decay * p[i];
    if constexpr (kMomentum) {
      const float mi = kFirst ? d : m[i] * o.momentum + keep * d;  // torch: a clone of d at first
      m[i] = mi;
      d = kNesterov ? d + o.momentum * mi : mi;
    }
    p[i] += step * d;
    g[i] = p[i];
  }
}

inline void sgd_pass(const SgdOptions& o, bool first, float* g, float* p, float* m, size_t n) {
  const bool decay = o.weight_decay != 0;
  if (o.momentum == 0) {
    decay ? sgd_loop<true, false, false, false>(o, g, p, m, n) : sgd_loop<false, false, false, false>(o, g, p, m, n);
    return;
  }
  const int which = (decay ? 4 : 0) + (first ? 2 : 0) + (o.nesterov ? 1 : 0);
  switch (which) {
    case 0: sgd_loop<false, true, false, false>(o, g, p, m, n); break;
    case 1: sgd_loop<false, true, false, true>(o, g, p, m, n); break;
    case 2: sgd_loop<false, true, true, false>(o, g, p, m, n); break;
    case 3: sgd_loop<false, true, true, true>(o, g, p, m, n); break;
    case 4: sgd_loop<true, true, false, false>(o, g, p, m, n); break;
    case 5: sgd_loop<true, true, false, true>(o, g, p, m, n); break;
    case 6: sgd_loop<true, true, true, false>(o, g, p, m, n); break;
    default: sgd_loop<true, true, true, true>(o, g, p, m, n); break;
  }
}

// Scales g by `scale` and says whether every element is finite (non-finite: all exponent bits
// set). Branch-free, so it vectorises.
inline bool scale_and_check(float* g, size_t n, float scale) {
  uint32_t non_finite = 0;
  for (size_t i = 0; i < n; ++i) {
    g[i] *= scale;
    uint32_t bits;
    std::memcpy(&bits, &g[i], sizeof(bits));
    non_finite |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return non_finite == 0;
}

// What a server keeps of one shard of one bucket when it applies the optimizer itself.
struct ShardState {
  std::vector<float> params;
  std::vector<float> momentum;  // empty until the first step with momentum (torch's SGD alike)

  // (Re)starts from a replica's parameters and momentum (null: none yet), n floats each.
  void start(const float* p, const float* m, size_t n) {
    params.assign(p, p + n);
    if (m != nullptr) {
      momentum.assign(m, m + n);
    } else {
      momentum.clear();
    }
  }

  // One step: g (n floats) holds the sum of the replicas' gradients on entry and is scaled by
  // `scale` to their average; on exit it holds the shard's parameters, stepped, or as they were
  // when the average is not finite (then returns false and the momentum is left alone).
  bool step(const SgdOptions& o, float* g, size_t n, float scale) {
    const bool finite = scale_and_check(g, n, scale);
    if (finite) {
      const bool first = momentum.empty();
      if (o.momentum != 0 && first) momentum.resize(n);
      sgd_pass(o, first, g, params.data(), momentum.data(), n);
    } else {
      std::copy(params.begin(), params.end(), g);
    }
    return finite;
  }
};

}  // namespace dsgd::strategy
