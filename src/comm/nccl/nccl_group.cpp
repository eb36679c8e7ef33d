// The NCCL group (dsgd/comm/nccl_group.h): operations are enqueued on the group's stream by the
// submitting thread, in submission order (NCCL needs every rank to issue them in one order, which
// the Group contract already asks of callers); a watcher thread completes each Work when the
// GPU has passed the event recorded after it, and enforces the deadlines. The communicator is
// non-blocking (ncclConfig_t::blocking = 0), so no NCCL call can hold a thread past a deadline:
// every ncclInProgress is polled against one.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "dsgd/comm/nccl_group.h"
#include "comm/process.h"
#include "dsgd/common/error.h"

namespace dsgd::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string cuda_message(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw CommError(what + " failed (" + cuda_message(e) + ")", what);
}

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt64: return ncclInt64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
  }
  throw ConfigError("NCCL group: unsupported data type");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAverage: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  throw ConfigError("NCCL group: unsupported reduce op");
}

class NcclGroup final : public Group {
 public:
  NcclGroup(std::shared_ptr<Store> store, int rank, int size, const NcclOptions& o)
      : rank_(rank), size_(size), device_(o.device), timeout_(o.timeout),
        input_stream_(static_cast<cudaStream_t>(o.input_stream)) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw ConfigError("NCCL group: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                        " is out of range");
    }
    check_cuda(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) + ")");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&input_ready_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc (barrier scratch)");

    // Rendezvous: rank 0's unique id, every rank's host.
    const std::string host = o.host.empty() ? this_host() : o.host;
    store->set("nccl/host/" + std::to_string(rank), host);
    ncclUniqueId id;
    if (rank == 0) {
      check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
      store->set("nccl/id", std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    }
    std::vector<std::string> keys{"nccl/id"};
    for (int r = 0; r < size; ++r) keys.push_back("nccl/host/" + std::to_string(r));
    store->wait(keys, timeout_);  // TimeoutError names the missing ranks' keys
    const std::string bytes = store->get("nccl/id", timeout_);
    if (bytes.size() != sizeof(id)) throw CommError("NCCL group: the unique id in the store has the wrong size");
    std::memcpy(&id, bytes.data(), sizeof(id));
    for (int r = 0; r < size; ++r) hosts_.push_back(store->get("nccl/host/" + std::to_string(r), timeout_));

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto deadline = Clock::now() + timeout_;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    if (r == ncclInProgress) r = settle(deadline);
    if (r != ncclSuccess) {
      const std::string why = r == ncclInProgress ? "not formed within " + std::to_string(timeout_.count()) + " ms"
                                                  : std::string(ncclGetErrorString(r));
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
      throw (r == ncclInProgress ? TimeoutError("NCCL group: communicator " + why, "ncclCommInitRank")
                                 : CommError("NCCL group: communicator " + why, "ncclCommInitRank"));
    }
    watcher_ = std::thread([this] { watch(); });
  }

  ~NcclGroup() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    watcher_.join();  // returns once every pending operation completed or failed
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ != nullptr) {
      if (error_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    if (!error_) {  // after an abort the stream may hold killed work: leave its memory to the process
      cudaFree(scratch_);
      cudaEventDestroy(input_ready_);
      cudaStreamDestroy(stream_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host(int rank) const override { return hosts_.at(static_cast<size_t>(rank)); }
  std::vector<int> local_ranks() const override {
    std::vector<int> out;
    for (int r = 0; r < size_; ++r) {
      if (hosts_[static_cast<size_t>(r)] == hosts_[static_cast<size_t>(rank_)]) out.push_back(r);
    }
    return out;
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  std::shared_ptr<Work> allreduce_async(void* data, size_t count, DataType type, ReduceOp op,
                                        AllreduceAlgorithm, std::chrono::milliseconds timeout) override {
    return enqueue("allreduce", count, type, timeout, [=, this] {
      return ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), comm_, stream_);
    });
  }
  std::shared_ptr<Work> broadcast_async(void* data, size_t bytes, int root,
                                        std::chrono::milliseconds timeout) override {
    return enqueue("broadcast", bytes, DataType::kFloat32, timeout,
                   [=, this] { return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
  }
  std::shared_ptr<Work> allgather_async(const void* in, void* out, size_t bytes,
                                        std::chrono::milliseconds timeout) override {
    return enqueue("allgather", bytes, DataType::kFloat32, timeout,
                   [=, this] { return ncclAllGather(in, out, bytes, ncclUint8, comm_, stream_); });
  }
  std::shared_ptr<Work> reduce_scatter_async(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                                             std::chrono::milliseconds timeout) override {
    return enqueue("reduce_scatter", count, type, timeout, [=, this] {
      return ncclReduceScatter(in, out, count, nccl_type(type), nccl_op(op), comm_, stream_);
    });
  }
  std::shared_ptr<Work> barrier_async(std::chrono::milliseconds timeout) override {
    return enqueue("barrier", 1, DataType::kFloat32, timeout,
                   [this] { return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_); });
  }
  std::shared_ptr<Work> send_async(const void* data, size_t bytes, int peer, uint32_t,
                                   std::chrono::milliseconds timeout) override {
    return enqueue("send to " + std::to_string(peer), bytes, DataType::kFloat32, timeout,
                   [=, this] { return ncclSend(data, bytes, ncclUint8, peer, comm_, stream_); });
  }
  std::shared_ptr<Work> recv_async(void* data, size_t bytes, int peer, uint32_t,
                                   std::chrono::milliseconds timeout) override {
    return enqueue("recv from " + std::to_string(peer), bytes, DataType::kFloat32, timeout,
                   [=, this] { return ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_); });
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_locked(std::make_exception_ptr(CommError("NCCL group aborted: " + reason)));
  }

 private:
  struct Pending {
    std::shared_ptr<Work> work;
    cudaEvent_t done = nullptr;
    Clock::time_point deadline;
  };

  void check_nccl(ncclResult_t r, const std::string& what) {
    if (r != ncclSuccess) throw CommError(what + " failed: " + ncclGetErrorString(r), what);
  }

  // Polls a non-blocking communicator until its last call has settled or the deadline passes.
  ncclResult_t settle(Clock::time_point deadline) {
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return ncclInternalError;
      if (state != ncclInProgress) break;
      if (Clock::now() >= deadline) return ncclInProgress;
      std::this_thread::yield();
    }
    return state;
  }

  std::shared_ptr<Work> enqueue(const std::string& name, size_t count, DataType type,
                                std::chrono::milliseconds timeout, const std::function<ncclResult_t()>& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto work = std::make_shared<Work>(name + " #" + std::to_string(seq_++) + " (" + std::to_string(count) + " x " +
                                       to_string(type) + ", nccl)");
    if (error_) {
      work->complete(error_);
      return work;
    }
    const auto deadline = Clock::now() + (timeout.count() > 0 ? timeout : timeout_);
    try {
      check_cuda(cudaSetDevice(device_), "cudaSetDevice");
      check_cuda(cudaEventRecord(input_ready_, input_stream_), "cudaEventRecord");
      check_cuda(cudaStreamWaitEvent(stream_, input_ready_, 0), "cudaStreamWaitEvent");
      ncclResult_t r = op();
      if (r == ncclInProgress) r = settle(deadline);
      if (r == ncclInProgress) throw TimeoutError(work->description() + ": NCCL did not accept it by its deadline",
                                                  work->description());
      check_nccl(r, work->description());
      Pending p{work, nullptr, deadline};
      check_cuda(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming), "cudaEventCreate");
      check_cuda(cudaEventRecord(p.done, stream_), "cudaEventRecord");
      pending_.push_back(std::move(p));
    } catch (...) {
      fail_locked(std::current_exception());
      work->complete(error_);
      return work;
    }
    cv_.notify_all();
    return work;
  }

  // The first error: aborts the communicator (freeing peers blocked in it) and fails everything.
  void fail_locked(std::exception_ptr error) {
    if (!error_) {
      error_ = std::move(error);
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    for (auto& p : pending_) p.work->complete(error_);
    pending_.clear();  // their events are left to the process: the aborted stream may never pass them
  }

  void watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, nothing left
      Pending& p = pending_.front();
      const cudaError_t e = cudaEventQuery(p.done);
      if (e == cudaSuccess) {
        cudaEventDestroy(p.done);
        auto work = std::move(p.work);
        pending_.pop_front();
        lock.unlock();
        work->complete();
        lock.lock();
        continue;
      }
      ncclResult_t async = ncclSuccess;
      if (comm_ != nullptr) ncclCommGetAsyncError(comm_, &async);
      if (e != cudaErrorNotReady) {
        fail_locked(std::make_exception_ptr(CommError(p.work->description() + ": " + cuda_message(e),
                                                      p.work->description())));
      } else if (async != ncclSuccess && async != ncclInProgress) {
        fail_locked(std::make_exception_ptr(CommError(p.work->description() + ": NCCL reported " +
                                                      ncclGetErrorString(async), p.work->description())));
      } else if (Clock::now() >= p.deadline) {
        fail_locked(std::make_exception_ptr(TimeoutError(
            p.work->description() + ": not complete by its deadline; a peer is hung or gone", p.work->description())));
      } else if (stopping_) {
        // The group goes with work in flight: wait for it out to its deadline, as Gloo's does.
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        lock.lock();
      } else {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        lock.lock();
      }
    }
  }

  const int rank_, size_, device_;
  const std::chrono::milliseconds timeout_;
  cudaStream_t input_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t input_ready_ = nullptr;
  float* scratch_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::vector<std::string> hosts_;

  std::mutex mutex_;  // orders submissions; guards what follows
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::exception_ptr error_;
  uint64_t seq_ = 0;
  bool stopping_ = false;
  std::thread watcher_;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

bool cuda_memory_info(int device, size_t* free_bytes, size_t* total_bytes) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) return false;
  const bool ok = cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess;
  cudaSetDevice(previous);
  return ok;
}

bool nccl_available() { return cuda_device_count() > 0; }

std::unique_ptr<Group> make_nccl_group(std::shared_ptr<Store> store, int rank, int size, const NcclOptions& options) {
  return std::make_unique<NcclGroup>(std::move(store), rank, size, options);
}

}  // namespace dsgd::comm
