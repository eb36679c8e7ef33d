// dsgd/torch/metrics.h — named results of a batch, an epoch or a validation.
//
//   dsgd::Metrics m = trainer.train().metrics;   // {"loss": 0.41, "accuracy": 0.87, "num_samples": 60000, ...}
//
// "num_samples" weighs every average: over batches within a replica, then over replicas.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace dsgd {

using Metrics = std::map<std::string, double>;

// Every key averaged over `parts` weighted by their "num_samples" (1 where absent);
// "num_samples" itself is summed. How replicas' and workers' results are combined.
inline Metrics weighted_mean(const std::vector<Metrics>& parts) {
  Metrics out;
  double total = 0;
  for (const auto& m : parts) total += m.count("num_samples") ? m.at("num_samples") : 1.0;
  for (const auto& m : parts) {
    const double w = m.count("num_samples") ? m.at("num_samples") : 1.0;
    for (const auto& [k, v] : m) {
      if (k != "num_samples") out[k] += total > 0 ? v * w / total : 0;
    }
  }
  out["num_samples"] = total;
  return out;
}

}  // namespace dsgd
