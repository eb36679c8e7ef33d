// dsgd's logger: stderr (stdout belongs to the program; `dsgd train` prints JSON there), named
// "dsgd", level from $DSGD_LOG_LEVEL (trace, debug, info, warn, error; default info).
//
//   dsgd::control::log().warn("worker {}: {}", index, message);
#pragma once

#include <spdlog/spdlog.h>

namespace dsgd::control {

spdlog::logger& log();

}  // namespace dsgd::control
