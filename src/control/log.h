// The runtime's name for dsgd's one logger (dsgd/common/log.h).
//
//   dsgd::control::log().warn("worker {}: {}", index, message);
#pragma once

#include "dsgd/common/log.h"

namespace dsgd::control {

inline spdlog::logger& log() { return dsgd::log(); }

}  // namespace dsgd::control
