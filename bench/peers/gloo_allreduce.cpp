// The plain-Gloo peer for `dsgd bench allreduce`: Gloo's own allreduce classes, no dsgd code.
// Ranks meet through Gloo's FileStore; each size gets its algorithm object (bound buffers), run
// after 3 warm-up runs ITERS times between barriers; the slowest rank's median is reported.
//   gloo_allreduce RANK SIZE STORE_DIR ALGO ITERS BYTES...      ALGO: ring | chunked | hd
// Rank 0 prints one line per size: "bytes latency_us algbw_GBps busbw_GBps". Verifies results.
// Built by CMake as dsgd_gloo_peer; bench/allreduce.sh starts SIZE of them.
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s RANK SIZE STORE_DIR ring|chunked|hd ITERS BYTES...\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]);
  const std::string algo = argv[4];
  const int iters = std::atoi(argv[5]);
  gloo::rendezvous::FileStore store(argv[3]);
  auto device = gloo::transport::tcp::CreateDevice("127.0.0.1");
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->connectFullMesh(store, device);
  gloo::BarrierAllToAll barrier(context);
  for (int a = 6; a < argc; ++a) {
    const int count = std::max(1, static_cast<int>(std::strtoull(argv[a], nullptr, 10) / sizeof(float)));
    std::vector<float> buf(static_cast<size_t>(count));
    std::vector<float*> ptrs = {buf.data()};
    std::unique_ptr<gloo::Algorithm> allreduce;
    if (algo == "ring") allreduce = std::make_unique<gloo::AllreduceRing<float>>(context, ptrs, count);
    if (algo == "chunked") allreduce = std::make_unique<gloo::AllreduceRingChunked<float>>(context, ptrs, count);
    if (algo == "hd") allreduce = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context, ptrs, count);
    if (!allreduce) return 2;
    std::vector<double> times;
    for (int it = 0; it < iters + 3; ++it) {
      std::fill(buf.begin(), buf.end(), static_cast<float>(rank + 1));
      barrier.run();
      const auto t0 = std::chrono::steady_clock::now();
      allreduce->run();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (it >= 3) times.push_back(s);
      if (buf[0] != static_cast<float>(size * (size + 1) / 2) || buf.back() != buf[0]) {
        std::fprintf(stderr, "rank %d: wrong result %f\n", rank, buf[0]);
        return 1;
      }
    }
    std::sort(times.begin(), times.end());
    std::vector<double> median = {times[times.size() / 2]};
    std::vector<double*> mptrs = {median.data()};
    gloo::AllreduceRing<double> max(context, mptrs, 1, gloo::ReductionFunction<double>::max);
    max.run();
    if (rank == 0) {
      const double bytes = static_cast<double>(count) * sizeof(float), algbw = bytes / median[0] / 1e9;
      std::printf("%.0f %.2f %.3f %.3f\n", bytes, median[0] * 1e6, algbw, algbw * 2.0 * (size - 1) / size);
      std::fflush(stdout);
    }
  }
  return 0;
}
