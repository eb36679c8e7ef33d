#include "runtime/worker/cpu_kernels.h"

#include <cstdlib>
#include <cstring>

namespace dsgd::runtime {

bool choose_cpu_kernels() {
  if (std::getenv("ATEN_CPU_CAPABILITY") != nullptr) return false;
  const char* opt_out = std::getenv("DSGD_CPU_KERNELS");
  if (opt_out != nullptr && std::strcmp(opt_out, "default") == 0) return false;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
  // Inherited by the processes this one starts (workers, shard servers).
  return avx512 && ::setenv("ATEN_CPU_CAPABILITY", "avx512", 0) == 0;
#else
  return false;
#endif
}

}  // namespace dsgd::runtime
