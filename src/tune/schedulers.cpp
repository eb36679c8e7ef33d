#include "tune/schedulers.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dsgd/common/error.h"

namespace dsgd::tune {

Asha::Asha(Options o) : o_(o) {
  if (o.grace_period < 1) throw ConfigError("asha grace_period must be >= 1, got " + std::to_string(o.grace_period));
  if (o.reduction_factor < 2) {
    throw ConfigError("asha reduction_factor must be >= 2, got " + std::to_string(o.reduction_factor));
  }
  for (int64_t r = o.grace_period; r < o.max_iterations; r *= o.reduction_factor) rungs_.push_back(static_cast<int>(r));
}

bool Asha::report(int trial, int iteration, double metric) {
  if (std::find(rungs_.begin(), rungs_.end(), iteration) == rungs_.end()) return true;
  if (!seen_.insert({iteration, trial}).second) return true;  // a rung is decided once per trial
  auto& recorded = recorded_[iteration];
  const double mine = o_.maximize ? metric : -metric;
  bool go_on = true;
  if (!recorded.empty()) go_on = std::isfinite(mine) && mine >= quantile(recorded, 1.0 - 1.0 / o_.reduction_factor);
  recorded.push_back(std::isfinite(mine) ? mine : -INFINITY);
  return go_on;
}

void Asha::record(int trial, int iteration, double metric) {
  if (std::find(rungs_.begin(), rungs_.end(), iteration) == rungs_.end()) return;
  if (!seen_.insert({iteration, trial}).second) return;
  const double mine = o_.maximize ? metric : -metric;
  recorded_[iteration].push_back(std::isfinite(mine) ? mine : -INFINITY);
}

double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const double at = q * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(at));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  if (!std::isfinite(values[lo]) || !std::isfinite(values[hi])) return values[at - lo < 0.5 ? lo : hi];
  return values[lo] + (values[hi] - values[lo]) * (at - static_cast<double>(lo));
}

std::vector<std::pair<size_t, size_t>> pbt_exploits(const std::vector<double>& scores, bool maximize, double q,
                                                    std::mt19937_64& gen) {
  std::vector<size_t> ranked;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (std::isfinite(scores[i])) ranked.push_back(i);
  }
  // Best first.
  std::stable_sort(ranked.begin(), ranked.end(), [&](size_t a, size_t b) {
    return maximize ? scores[a] > scores[b] : scores[a] < scores[b];
  });
  const size_t n = ranked.size();
  size_t k = static_cast<size_t>(std::ceil(static_cast<double>(n) * q));
  k = std::min(k, n / 2);
  std::vector<std::pair<size_t, size_t>> out;
  if (k == 0) return out;
  std::uniform_int_distribution<size_t> pick(0, k - 1);
  for (size_t j = 0; j < k; ++j) out.emplace_back(ranked[n - 1 - j], ranked[pick(gen)]);
  return out;
}

}  // namespace dsgd::tune
