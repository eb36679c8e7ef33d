// The CPU tensor cache (torch/memory/cpu_allocator.h): a freed block serves the next tensor of its size
// class, so tensors of one size come and go without the process growing; the limit and the idle
// time give blocks back; small tensors, fork and the environment's settings.
#include "torch/memory/cpu_allocator.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>
#include <vector>

namespace dsgd::torch_glue {
namespace {

constexpr int64_t kFloats = 4'000'000;  // one Linear(2000, 2000) weight: 16 MB
constexpr size_t kMiB = size_t{1} << 20;

void install(size_t limit_bytes, std::chrono::milliseconds idle = std::chrono::seconds(60)) {
  install_cpu_cache({.min_bytes = kMiB, .limit_bytes = limit_bytes, .idle = idle});
  release_cpu_cache();
  ASSERT_TRUE(cpu_cache_installed());
}

TEST(CpuCache, AFreedBlockServesTheNextTensorOfItsClass) {
  install(256 * kMiB);
  const auto before = cpu_cache_stats();
  auto a = torch::ones({kFloats});
  const void* where = a.data_ptr();
  a = torch::Tensor();
  EXPECT_EQ(cpu_cache_stats().cached_bytes, cpu_cache_class_bytes(kFloats * 4));
  auto b = torch::zeros({kFloats - 1000});  // a little smaller: the same class
  EXPECT_EQ(b.data_ptr(), where);
  EXPECT_EQ(b.sum().item<float>(), 0.0f);
  const auto after = cpu_cache_stats();
  EXPECT_EQ(after.hits, before.hits + 1);
  EXPECT_EQ(after.misses, before.misses + 1);
  EXPECT_EQ(after.cached_bytes, 0u);
}

// What glibc did under tune_malloc: 20 weights kept, 20 records freed, then a step's worth of
// 16 MB tensors made and freed with small allocations between them, each mapping new heap.
TEST(CpuCache, TensorsOfOneSizeComeAndGoWithoutTheProcessGrowing) {
  install(1024 * kMiB);
  const size_t block = cpu_cache_class_bytes(kFloats * 4);
  const size_t mapped_before = cpu_cache_stats().mapped_bytes;
  std::vector<torch::Tensor> weights, records, small;
  for (int i = 0; i < 20; ++i) weights.push_back(torch::randn({kFloats}));
  for (int i = 0; i < 20; ++i) records.push_back(torch::empty({kFloats}));
  records.clear();
  for (int step = 0; step < 10; ++step) {
    for (int i = 0; i < 20; ++i) {
      auto grad = weights[static_cast<size_t>(i)] * 2;  // a new 16 MB tensor, freed at once
      small.push_back(torch::ones({16}));  // stays: the kind of allocation that split glibc's free blocks
    }
  }
  EXPECT_LE(cpu_cache_stats().mapped_bytes - mapped_before, 41 * block)
      << "20 weights, 20 records and one gradient at a time need 41 blocks";
}

TEST(CpuCache, KeepsNoMoreThanItsLimitOldestFirst) {
  install(32 * kMiB);
  const size_t block = cpu_cache_class_bytes(kFloats * 4);
  std::vector<torch::Tensor> ts;
  std::vector<const void*> where;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(torch::empty({kFloats}));
    where.push_back(ts.back().data_ptr());
  }
  const auto released_before = cpu_cache_stats().released;
  ts.clear();  // freed first to last
  const auto s = cpu_cache_stats();
  EXPECT_LE(s.cached_bytes, 32 * kMiB);
  EXPECT_EQ(s.cached_bytes, 2 * block);
  EXPECT_EQ(s.released, released_before + 2);
  auto again = torch::empty({kFloats});  // the newest kept: the last freed
  EXPECT_EQ(again.data_ptr(), where[3]);
}

TEST(CpuCache, BlocksUnusedForTheIdleTimeGoBack) {
  install(1024 * kMiB, std::chrono::milliseconds(50));
  auto a = torch::empty({kFloats});
  a = torch::Tensor();
  EXPECT_EQ(cpu_cache_stats().cached_bytes, cpu_cache_class_bytes(kFloats * 4));
  const auto released = cpu_cache_stats().released;
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  auto b = torch::empty({kFloats / 2});  // another class; the idle block goes as it is made
  EXPECT_EQ(cpu_cache_stats().released, released + 1);
  EXPECT_EQ(cpu_cache_stats().cached_bytes, 0u);
}

TEST(CpuCache, SmallTensorsGoToMallocAndForkedChildrenAllocate) {
  install(256 * kMiB);
  const auto before = cpu_cache_stats();
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(torch::full({100}, 2.0f).sum().item<float>(), 200.0f);
  EXPECT_EQ(cpu_cache_stats().hits + cpu_cache_stats().misses, before.hits + before.misses);
  auto kept = torch::ones({kFloats});
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the child inherits the cache and its lock, free
    auto t = torch::ones({kFloats}) + kept;
    ::_exit(t[0].item<float>() == 2.0f ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(CpuCache, TheEnvironmentTurnsItOffOrSetsItsLimit) {
  ::setenv("DSGD_CPU_ALLOCATOR", "default", 1);
  EXPECT_FALSE(install_cpu_cache_from_environment());
  ::unsetenv("DSGD_CPU_ALLOCATOR");
  ::setenv("DSGD_CPU_CACHE_MIB", "lots", 1);  // warned about; the default limit kept
  EXPECT_TRUE(install_cpu_cache_from_environment());
  release_cpu_cache();
  std::vector<torch::Tensor> many;
  for (int i = 0; i < 3; ++i) many.push_back(torch::empty({kFloats}));
  many.clear();
  EXPECT_EQ(cpu_cache_stats().cached_bytes, 3 * cpu_cache_class_bytes(kFloats * 4));
  ::setenv("DSGD_CPU_CACHE_MIB", "16", 1);
  EXPECT_TRUE(install_cpu_cache_from_environment());
  ::unsetenv("DSGD_CPU_CACHE_MIB");
  release_cpu_cache();
  std::vector<torch::Tensor> ts;
  for (int i = 0; i < 3; ++i) ts.push_back(torch::empty({kFloats}));
  ts.clear();
  EXPECT_LE(cpu_cache_stats().cached_bytes, 16 * kMiB);
}

}  // namespace
}  // namespace dsgd::torch_glue
