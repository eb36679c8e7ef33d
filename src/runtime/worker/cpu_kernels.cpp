#include "runtime/worker/cpu_kernels.h"

#include <cstdlib>
#include <cstring>

namespace dsgd::runtime {

bool cpu_has_avx512_kernels() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool choose_cpu_kernels() {
  if (std::getenv("ATEN_CPU_CAPABILITY") != nullptr) return false;
  const char* opt_out = std::getenv("DSGD_CPU_KERNELS");
  if (opt_out != nullptr && std::strcmp(opt_out, "default") == 0) return false;
  // Inherited by the processes this one starts (workers, shard servers).
  return cpu_has_avx512_kernels() && ::setenv("ATEN_CPU_CAPABILITY", "avx512", 0) == 0;
}

}  // namespace dsgd::runtime
