// dsgd/metrics.h — named results of a batch, an epoch or a validation.
//
//   dsgd::Metrics m = trainer.train().metrics;   // {"loss": 0.41, "accuracy": 0.87, "num_samples": 60000, ...}
//
// "num_samples" weighs every average: over batches within a replica, then over replicas.
#pragma once

#include <map>
#include <string>

namespace dsgd {

using Metrics = std::map<std::string, double>;

}  // namespace dsgd
