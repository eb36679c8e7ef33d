// choose_cpu_kernels(): ATEN_CPU_CAPABILITY=avx512 where the CPU has AVX-512 VL, BW, DQ and FMA,
// never over the user's own setting or with DSGD_CPU_KERNELS=default.
#include "runtime/worker/cpu_kernels.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace dsgd::runtime {
namespace {

struct SavedEnv {
  explicit SavedEnv(const char* name) : name(name) {
    if (const char* v = std::getenv(name)) value = v, set = true;
  }
  ~SavedEnv() { set ? ::setenv(name, value.c_str(), 1) : ::unsetenv(name); }
  const char* name;
  std::string value;
  bool set = false;
};

TEST(CpuKernels, Avx512WhereTheCpuHasItAndNobodyChoseOtherwise) {
  SavedEnv capability("ATEN_CPU_CAPABILITY"), opt_out("DSGD_CPU_KERNELS");
  ::setenv("ATEN_CPU_CAPABILITY", "avx2", 1);
  EXPECT_FALSE(choose_cpu_kernels());
  EXPECT_STREQ(std::getenv("ATEN_CPU_CAPABILITY"), "avx2");  // the user's choice stands
  ::unsetenv("ATEN_CPU_CAPABILITY");
  ::setenv("DSGD_CPU_KERNELS", "default", 1);
  EXPECT_FALSE(choose_cpu_kernels());
  EXPECT_EQ(std::getenv("ATEN_CPU_CAPABILITY"), nullptr);
  ::unsetenv("DSGD_CPU_KERNELS");
  const bool avx512 = cpu_has_avx512_kernels();
  EXPECT_EQ(choose_cpu_kernels(), avx512);
  const char* now = std::getenv("ATEN_CPU_CAPABILITY");
  EXPECT_EQ(now != nullptr && std::string(now) == "avx512", avx512);
}

}  // namespace
}  // namespace dsgd::runtime
