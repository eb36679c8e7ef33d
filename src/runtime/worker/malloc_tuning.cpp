#include "runtime/worker/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace dsgd::runtime {

bool tune_malloc() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return false;
  const char* opt_out = std::getenv("DSGD_MALLOC_TUNING");
  if (opt_out != nullptr && std::strcmp(opt_out, "0") == 0) return false;
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return mmap_ok && trim_ok;
}

double peak_resident_mib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return static_cast<double>(std::atoll(line.c_str() + 6)) / 1024;  // in kB
  }
  return 0;
}

}  // namespace dsgd::runtime
