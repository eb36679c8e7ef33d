// dsgd's one logger, for every layer: stderr (stdout belongs to the program; `dsgd train` prints
// JSON there), named "dsgd", level from $DSGD_LOG_LEVEL (trace, debug, info, warn, error;
// default info). Library code writes nothing to std::cout or std::cerr itself.
//
//   dsgd::log().warn("worker {}: {}", index, message);
#pragma once

#include <spdlog/spdlog.h>

namespace dsgd {

spdlog::logger& log();

}  // namespace dsgd
