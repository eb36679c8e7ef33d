// tune_malloc(): after it, a 16 MB block comes from the heap (not a fresh mmap, whose pages would
// fault in zeroed on every step) and stays in the process when freed.
#include "runtime/worker/malloc_tuning.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace dsgd::runtime {
namespace {

TEST(MallocTuning, BigBlocksComeFromTheHeapAndStay) {
  ::unsetenv("GLIBC_TUNABLES");
  ::setenv("DSGD_MALLOC_TUNING", "0", 1);
  EXPECT_FALSE(tune_malloc());  // opted out
  ::unsetenv("DSGD_MALLOC_TUNING");
  ASSERT_TRUE(tune_malloc());
  const size_t mapped_before = mallinfo2().hblkhd;
  void* p = std::malloc(16 << 20);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 16 << 20);
  EXPECT_EQ(mallinfo2().hblkhd, mapped_before) << "a 16 MB block was mmapped";
  std::free(p);
  EXPECT_GE(mallinfo2().fordblks, size_t{16} << 20) << "the freed block went back to the kernel";
}

}  // namespace
}  // namespace dsgd::runtime
