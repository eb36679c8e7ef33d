// The pieces of `dsgd train`'s JSON summary that stand on the library's types alone: one
// object per recovery.
#pragma once

#include <nlohmann/json.hpp>

#include "dsgd/trainer.h"

namespace dsgd::cli {

// One object per recovery and scale-up, in order: the JSON summary's "recoveries".
nlohmann::json recovery_json(const dsgd::RecoveryEvent& e);

}  // namespace dsgd::cli
