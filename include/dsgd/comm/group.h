// dsgd/comm/group.h — a set of ranks that communicate: collectives and point-to-point on
// contiguous buffers, over Gloo's TCP transport.
//
//   auto store = dsgd::comm::make_file_store("/tmp/job");           // or the driver's store
//   auto group = dsgd::comm::Group::create(store, rank, size);       // collective: all ranks call it
//   group->allreduce(grads.data(), grads.size(), DataType::kFloat32, ReduceOp::kAverage);
//   auto w = group->allreduce_async(bucket, n, DataType::kFloat32, ReduceOp::kSum);  // overlap
//   w->wait();
//
// Ordering: each group runs its operations one at a time, in submission order, on its own
// communication thread; synchronous calls are queued the same way and waited for. Every rank
// must submit the same operations in the same order (each gets the next sequence number, which
// is its Gloo tag and appears in errors). All methods are thread-safe.
//
// Failure: every operation has a deadline (GroupOptions::timeout unless given per call). A dead
// peer fails the operation with dsgd::CommError naming the operation and, when it can be told,
// the peer's rank and host; a hung peer fails it with dsgd::TimeoutError at the deadline. The
// first error is sticky: it fails every queued and later operation, since a Gloo context that
// saw an I/O error is unusable. Re-form the group (a new Store prefix) to go on. abort() does
// the same from any thread, waking whatever is blocked. Torch-free.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsgd/comm/store.h"
#include "dsgd/comm/types.h"
#include "dsgd/comm/work.h"

namespace dsgd::comm {

// Default deadline of every operation: long enough for a slow step, short enough that a lost
// peer is noticed in seconds, not Gloo's 30 minutes.
inline constexpr std::chrono::milliseconds kDefaultTimeout{30000};

struct GroupOptions {
  // Address (or host name) of the interface to bind; loopback by default. Remote ranks must be
  // able to reach it.
  std::string bind_address = "127.0.0.1";
  // This rank's host identity, used to find ranks that share a host (shared memory); "" = this
  // machine's host name.
  std::string host;
  // Deadline of rendezvous and of every operation without its own.
  std::chrono::milliseconds timeout = kDefaultTimeout;
};

class Group {
 public:
  // Forms a group: rank `rank` of `size`, meeting the others through `store` (namespace it per
  // job and generation with PrefixStore). Blocks until all ranks have connected or throws
  // dsgd::TimeoutError naming the ranks that did not arrive. Sets SIGPIPE to be ignored if it
  // has its default action (which would kill the process when a peer dies mid-write).
  static std::unique_ptr<Group> create(std::shared_ptr<Store> store, int rank, int size,
                                       const GroupOptions& options = {});

  virtual ~Group() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Host identity of `rank`, as that rank declared it.
  virtual const std::string& host(int rank) const = 0;
  // The ranks that share this rank's host, ascending (includes this rank).
  virtual std::vector<int> local_ranks() const = 0;
  // The deadline of operations that give none.
  virtual std::chrono::milliseconds timeout() const = 0;

  // ---- asynchronous: queued, executed in order; `timeout` 0 means the group's default ----
  // In place: data holds count elements on entry and the reduction on exit.
  virtual std::shared_ptr<Work> allreduce_async(void* data, size_t count, DataType type, ReduceOp op,
                                                AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto,
                                                std::chrono::milliseconds timeout = {}) = 0;
  // root's `bytes` bytes at data are copied to every rank's data.
  virtual std::shared_ptr<Work> broadcast_async(void* data, size_t bytes, int root,
                                                std::chrono::milliseconds timeout = {}) = 0;
  // out (size() * bytes) receives every rank's `bytes` bytes of in, in rank order.
  virtual std::shared_ptr<Work> allgather_async(const void* in, void* out, size_t bytes,
                                                std::chrono::milliseconds timeout = {}) = 0;
  // in holds size() * count elements; out (count elements) receives the reduction of block rank().
  // out may be in's own block (in + rank() * count): in place.
  virtual std::shared_ptr<Work> reduce_scatter_async(const void* in, void* out, size_t count, DataType type,
                                                     ReduceOp op, std::chrono::milliseconds timeout = {}) = 0;
  virtual std::shared_ptr<Work> barrier_async(std::chrono::milliseconds timeout = {}) = 0;
  // in holds size() blocks of `bytes`: block j goes to rank j; out (size() * bytes) receives
  // block rank() of every rank, in rank order. Gloo groups only (others throw dsgd::Error).
  virtual std::shared_ptr<Work> alltoall_async(const void* in, void* out, size_t bytes,
                                               std::chrono::milliseconds timeout = {});
  // Point-to-point. A send matches the recv with the same (sender, receiver, tag); sizes must
  // agree. Not sequence-numbered: peers that are not involved need not call anything.
  virtual std::shared_ptr<Work> send_async(const void* data, size_t bytes, int peer, uint32_t tag,
                                           std::chrono::milliseconds timeout = {}) = 0;
  virtual std::shared_ptr<Work> recv_async(void* data, size_t bytes, int peer, uint32_t tag,
                                           std::chrono::milliseconds timeout = {}) = 0;

  // ---- synchronous forms: the async one, waited for ----
  void allreduce(void* data, size_t count, DataType type, ReduceOp op,
                 AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto, std::chrono::milliseconds timeout = {});
  void broadcast(void* data, size_t bytes, int root, std::chrono::milliseconds timeout = {});
  void allgather(const void* in, void* out, size_t bytes, std::chrono::milliseconds timeout = {});
  void reduce_scatter(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                      std::chrono::milliseconds timeout = {});
  void barrier(std::chrono::milliseconds timeout = {});
  void alltoall(const void* in, void* out, size_t bytes, std::chrono::milliseconds timeout = {});
  void send(const void* data, size_t bytes, int peer, uint32_t tag, std::chrono::milliseconds timeout = {});
  void recv(void* data, size_t bytes, int peer, uint32_t tag, std::chrono::milliseconds timeout = {});

  // Fails the operation in flight, everything queued and everything later with
  // dsgd::CommError(reason). Thread-safe; returns at once.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace dsgd::comm
