// The NCCL group on real GPUs. Each test skips, saying why, where the CUDA runtime sees no
// device (this machine, CI); bench/gpu/run.sh runs them on a GPU machine.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "dsgd/comm/nccl_group.h"
#include "dsgd/common/error.h"

namespace dsgd::comm {
namespace {

#define SKIP_WITHOUT_GPUS(n)                                                                              \
  if (cuda_device_count() < (n)) {                                                                        \
    GTEST_SKIP() << "needs " << (n) << " CUDA device(s), the runtime sees " << cuda_device_count()     \
                 << ": run on a GPU machine (bench/gpu/run.sh)";                                        \
  }

// count floats on device `device`, filled from `host`.
struct DeviceBuffer {
  float* p = nullptr;
  size_t n = 0;
  DeviceBuffer(int device, const std::vector<float>& host) : n(host.size()) {
    cudaSetDevice(device);
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p); }
  std::vector<float> read() const {
    std::vector<float> out(n);
    EXPECT_EQ(cudaMemcpy(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

TEST(NcclGroup, WithoutADeviceFormingAGroupFailsNamingTheCudaError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device: the error path is not reachable";
  try {
    make_nccl_group(make_memory_store(), 0, 1);
    FAIL() << "formed an NCCL group without a device";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("cudaSetDevice(0)"), std::string::npos) << e.what();
  }
}

TEST(NcclGroup, OneRankRunsEveryCollectiveOnDeviceMemory) {
  SKIP_WITHOUT_GPUS(1);
  auto g = make_nccl_group(make_memory_store(), 0, 1);
  EXPECT_EQ(g->local_ranks(), std::vector<int>{0});
  DeviceBuffer a(0, {1, 2, 3, 4});
  g->allreduce(a.p, a.n, DataType::kFloat32, ReduceOp::kAverage);
  EXPECT_EQ(a.read(), (std::vector<float>{1, 2, 3, 4}));
  DeviceBuffer out(0, {0, 0, 0, 0});
  g->allgather(a.p, out.p, a.n * sizeof(float));
  EXPECT_EQ(out.read(), (std::vector<float>{1, 2, 3, 4}));
  g->broadcast(a.p, a.n * sizeof(float), 0);
  g->barrier();
  EXPECT_EQ(a.read(), (std::vector<float>{1, 2, 3, 4}));
}

TEST(NcclGroup, TwoRanksOnTwoGpusAverageAndKnowTheirHosts) {
  SKIP_WITHOUT_GPUS(2);
  auto store = make_memory_store();
  std::vector<std::vector<float>> results(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto g = make_nccl_group(store, r, 2, {.device = r, .host = "h"});
      DeviceBuffer b(r, {float(r), float(10 * r)});
      g->allreduce(b.p, b.n, DataType::kFloat32, ReduceOp::kAverage);
      results[r] = b.read();
      EXPECT_EQ(g->local_ranks(), (std::vector<int>{0, 1}));
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(results[0], (std::vector<float>{0.5f, 5.0f}));
  EXPECT_EQ(results[1], results[0]);
}

TEST(NcclGroup, AMissingRankTimesOutAtRendezvous) {
  SKIP_WITHOUT_GPUS(1);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(
      make_nccl_group(
          make_memory_store(), 0, 2,
          NcclOptions{.device = 0, .input_stream = nullptr, .host = "", .timeout = std::chrono::milliseconds(300)}),
      TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(NcclGroup, AbortFailsEveryLaterOperation) {
  SKIP_WITHOUT_GPUS(1);
  auto g = make_nccl_group(make_memory_store(), 0, 1);
  DeviceBuffer a(0, {1, 2});
  g->allreduce(a.p, a.n, DataType::kFloat32, ReduceOp::kSum);
  g->abort("test");
  auto w = g->allreduce_async(a.p, a.n, DataType::kFloat32, ReduceOp::kSum);
  try {
    w->wait();
    FAIL() << "an aborted group ran an operation";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("aborted: test"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsgd::comm
