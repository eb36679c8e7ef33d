#include "train_summary.h"

#include <chrono>

namespace dsgd::cli {

nlohmann::json recovery_json(const dsgd::RecoveryEvent& e) {
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& [name, s] : e.phases) phases[name] = phases.value(name, 0.0) + s;
  // When training resumed, in seconds since the epoch: for scripts that time a fault themselves.
  const auto resumed = std::chrono::system_clock::now() - (std::chrono::steady_clock::now() - e.resumed_at);
  return {{"kind", e.kind},
          {"resumed_at_unix_s", std::chrono::duration<double>(resumed.time_since_epoch()).count()},
          {"failure", e.failure},
          {"lost", e.lost},
          {"at_step", e.at_step},
          {"rolled_back_steps", e.rolled_back_steps},
          {"detect_s", e.detect_s},
          {"recovery_s", e.recovery_s},
          {"workers_after", e.workers_after},
          {"standbys_used", e.standbys_used},
          {"phases_s", phases}};
}

}  // namespace dsgd::cli
