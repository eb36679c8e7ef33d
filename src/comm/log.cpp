#include "dsgd/common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace dsgd {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("dsgd");
    const char* level = std::getenv("DSGD_LOG_LEVEL");
    l->set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::info);
    return l;
  }();
  return *logger;
}

}  // namespace dsgd
