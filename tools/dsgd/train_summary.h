// The pieces of `dsgd train`'s JSON summary that stand on the library's types alone: the
// phases --profile reports, their mean over a run, and one object per recovery.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsgd/local_job.h"
#include "dsgd/trainer.h"

namespace dsgd::cli {

// The phases --profile reports: TrainOptions::profile's metric, and its key in profile_ms.
struct Phase {
  const char* metric;
  const char* key;
};
inline constexpr Phase kPhases[] = {
    {"forward_s", "forward"}, {"backward_s", "backward"}, {"optimizer_s", "optimizer"}, {"comm_wait_s", "comm_wait"}};

// Milliseconds per step of each phase, over the epochs of a run, weighted by their steps.
std::map<std::string, double> mean_profile(const std::vector<dsgd::EpochSummary>& history,
                                           const std::vector<int64_t>& steps);

// One object per recovery and scale-up, in order: the JSON summary's "recoveries".
nlohmann::json recovery_json(const dsgd::RecoveryEvent& e);

}  // namespace dsgd::cli
