// dsgd/comm/nccl_group.h — a Group whose buffers are CUDA device memory, reduced by NCCL.
//
//   if (dsgd::comm::nccl_available()) {
//     auto g = dsgd::comm::make_nccl_group(store, rank, size, {.device = local_rank});
//     g->allreduce(device_ptr, n, DataType::kFloat32, ReduceOp::kAverage);
//   }
//
// The Group contract holds (group.h) with device pointers in place of host ones: operations run
// in submission order, every one has a deadline, the first error is sticky, abort() wakes every
// waiter. Each operation is enqueued on the group's own CUDA stream after the work already
// queued on `input_stream` (the legacy default stream unless given), so a buffer written by
// kernels there is read when they are done; a Work completes once the GPU has finished the
// operation. A deadline that passes, an NCCL asynchronous error or abort() aborts the
// communicator (ncclCommAbort), which frees every rank blocked in it: the recovery path then
// re-forms the group, as with Gloo. The communicator's unique id travels through `store`
// (namespace it per job and generation with PrefixStore): one communicator per group
// generation. send/recv ignore the tag: NCCL matches point-to-point operations in order.
//
// Torch-free: the CUDA runtime and NCCL only. Built when CMake finds both (DSGD_CUDA); in a
// build without them nccl_available() is false and make_nccl_group throws dsgd::ConfigError
// saying so.
#pragma once

#include <chrono>
#include <memory>

#include "dsgd/comm/cuda.h"
#include "dsgd/comm/group.h"
#include "dsgd/comm/store.h"

namespace dsgd::comm {

struct NcclOptions {
  int device = 0;                     // CUDA device ordinal of this rank
  void* input_stream = nullptr;       // cudaStream_t whose work each operation waits for; null: the default stream
  std::string host;                   // this rank's host identity; "" = this machine's host name
  std::chrono::milliseconds timeout = kDefaultTimeout;  // rendezvous and operations without their own
};

// True when this build has NCCL and the CUDA runtime sees at least one device.
bool nccl_available();

// Forms a group of `size` ranks, each on its own GPU (NCCL refuses two ranks on one device).
// Collective: every rank calls it. Throws TimeoutError naming the ranks that did not arrive,
// CommError when NCCL fails to form the communicator, ConfigError in a build without NCCL.
std::unique_ptr<Group> make_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                                       const NcclOptions& options = {});

}  // namespace dsgd::comm
