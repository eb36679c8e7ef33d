// dsgd/comm/hierarchical.h — allreduce across hosts in three stages: shared memory among the
// ranks of each host, Gloo among one leader per host, shared memory again to hand the result on.
//
//   auto h = dsgd::comm::HierarchicalGroup::create(store, rank, size, group_options);  // collective
//   h->allreduce(grads, n, DataType::kFloat32, ReduceOp::kAverage);
//
// Ranks name their host in GroupOptions::host (default: the machine's host name); ranks with
// the same host share a segment. Cross-host bytes fall from 2(n-1)/n * B per rank (flat ring
// over every rank) to 2(h-1)/h * B per leader for h hosts, and only leaders touch the network.
// Errors as in Group and ShmGroup: sticky, named, every wait bounded. An allreduce has one
// deadline (`timeout`, else the global group's) for its three stages together: each stage waits
// at most what the earlier ones left. allreduce_async queues the three stages on the group's own
// thread and returns a Work at once. Thread-safe. Torch-free.
//
// Compressed across hosts (CrossHostWire, TrainerConfig::comm.compression fp16 / bf16): a float32
// sum or average whose across-host stage sends 16 bits per value. Each leader rounds its host's
// sum (plus its error-feedback residual) to float16 or bfloat16, sends block j of it to leader j
// (Gloo's alltoall), sums the blocks it gets in float32 in leader order, rounds that sum once
// more and shares it (Gloo's allgather): 2(h-1)/h * B/2 bytes per leader against the float32
// ring's 2(h-1)/h * B, every leader ending with the same bits. Within a host all stays float32.
//
// ZeRO's two halves of an allreduce, hierarchical the same way. reduce_scatter_async: each host
// sums every block through shared memory, each leader sends leader j the blocks of host j's
// ranks (Gloo's alltoall) and sums the ones it gets in leader order, and hands its ranks their
// blocks; allgather_async: each host gathers its ranks' blocks through shared memory, the leaders
// gather the hosts' (Gloo's allgather) and hand the whole on. Across hosts each moves
// (h-1)/h * B per leader (B: the data of every rank; hosts with fewer ranks padded to the
// largest), half an allreduce's 2(h-1)/h * B: together, one allreduce.
//
// With one rank per host (no shared-memory stage), allreduce_async calls alternate between two
// lanes, each a Gloo group with a thread of its own, so two allreduces are in flight at once and
// one's transfer fills the other's gaps. Their Works may then complete out of call order, and
// calls on buffers that overlap must wait for each other. Every rank must make the same
// allreduce_async calls in the same order (so that they agree on the lanes).
//
// The global group (a Gloo full mesh of every rank: N(N-1)/2 connections) serves only flat
// algorithms, broadcasts and the parameter servers, so it is formed at the first call of
// global(), not with the rest: a job on the hierarchy never pays for it (at 64 ranks on one
// machine it was most of the 2.8 s a re-formation took). rank(), size() and hosts() need no group.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dsgd/comm/group.h"
#include "dsgd/comm/shm_group.h"
#include "dsgd/comm/work.h"

namespace dsgd::comm {

class OpQueue;

// How an allreduce's across-host stage travels (HierarchicalGroup::allreduce_async).
struct CrossHostWire {
  DataType type = DataType::kFloat32;  // kFloat16 or kBFloat16: 16 bits a value (float32 data only)
  // count floats of error feedback for this rank (used where it leads its host): what rounding
  // left out of its last sends, added to the next. Null: none kept.
  float* residual = nullptr;
  // Or a stage of the caller's own (PowerSGD, strategy/powersgd.h): called on each host's
  // leader with the leaders' group (or the lane's), the host's float32 sum in `data`, to leave
  // the sum over hosts there; returns the bytes it sent. `type` and `residual` unused then.
  std::function<uint64_t(Group& leaders, float* data, size_t count, std::chrono::milliseconds timeout)> stage = {};
};

class HierarchicalGroup {
 public:
  // Learns every rank's host (one key each in `store`), then forms this host's ShmGroup and (for
  // leaders) the leaders' Group, under sub-prefixes of `store`, which it keeps for global().
  static std::unique_ptr<HierarchicalGroup> create(std::shared_ptr<Store> store, int rank, int size,
                                                   const GroupOptions& options = {},
                                                   const ShmOptions& shm_options = {});

  ~HierarchicalGroup();

  std::shared_ptr<Work> allreduce_async(void* data, size_t count, DataType type, ReduceOp op,
                                        std::chrono::milliseconds timeout = {}, CrossHostWire wire = {});
  void allreduce(void* data, size_t count, DataType type, ReduceOp op, std::chrono::milliseconds timeout = {},
                 CrossHostWire wire = {});

  // `in` holds size() blocks of `count` elements; `out` (count elements) receives the reduction of
  // block rank() over every rank (kAverage: divided by size()); `out` may be that block of `in`.
  // Queued behind the allreduces on lane 0, with one deadline for its stages.
  std::shared_ptr<Work> reduce_scatter_async(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                                             std::chrono::milliseconds timeout = {});
  // `out` (size() * bytes) receives every rank's `bytes` at `in`, in rank order (`in` apart from
  // `out`). Queued as reduce_scatter_async.
  std::shared_ptr<Work> allgather_async(const void* in, void* out, size_t bytes,
                                        std::chrono::milliseconds timeout = {});

  // Rank `root`'s `bytes` at `data` into every rank's `data`: within root's host through shared
  // memory, across hosts between the leaders (Gloo), then within each other host from its
  // leader. Blocking, queued behind this group's allreduces; one deadline (`timeout`, else the
  // group's) for the stages together. Cheaper than global()'s broadcast wherever ranks share a
  // host, and forms no full mesh.
  void broadcast(void* data, size_t bytes, int root, std::chrono::milliseconds timeout = {});

  // Fails whatever is in flight or queued on all three groups, from any thread (as Group::abort:
  // sticky, every later operation fails naming `reason`).
  void abort(const std::string& reason);

  // `bytes` of this rank's shared-memory region (ShmOptions::shared_bytes) for data that lives
  // there, such as a replica's gradients: the shared-memory stage of an allreduce of it copies
  // nothing in. Handed out in call order, each 64-byte aligned, so the same calls on every rank of
  // a host give the same offsets, as that stage requires. Null when this host has one rank
  // (nothing to share) or the region has no room left: use memory of your own. Thread-safe.
  void* take_shared(size_t bytes);

  // Every rank's group, formed by the first call on each rank: a collective (every rank must call
  // it, as for any operation on it); CommError after abort(). Thread-safe.
  Group& global();
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(hosts_.size()); }
  const std::vector<std::string>& hosts() const { return hosts_; }  // by rank
  ShmGroup& local() { return *local_; }
  // The leaders' group; null on ranks that are not their host's leader (local rank 0).
  Group* leaders() { return leaders_.get(); }
  int num_hosts() const { return num_hosts_; }
  // Bytes this rank has sent to other hosts in allreduces (by each algorithm's count: the
  // float32 ring's 2(h-1)/h * B per leader, the compressed stage's half of it; none from ranks
  // that do not lead their host).
  uint64_t cross_host_bytes() const { return cross_host_bytes_.load(); }

 private:
  HierarchicalGroup();
  void run_allreduce(void* data, size_t count, DataType type, ReduceOp op, std::chrono::milliseconds timeout,
                     CrossHostWire wire);
  void run_broadcast(void* data, size_t bytes, int root, std::chrono::milliseconds timeout);
  void count_ring_bytes(int ranks, size_t bytes);  // a float32 ring allreduce of `bytes` among `ranks`
  // The across-host stage on `group` (the leaders', or a lane): `op` (not kAverage) in place.
  void across_hosts(Group& group, void* data, size_t count, DataType type, ReduceOp op,
                    std::chrono::milliseconds timeout, CrossHostWire wire);

  std::shared_ptr<Store> store_;  // global()'s rendezvous
  GroupOptions options_;
  int rank_ = 0;
  std::vector<std::string> hosts_;
  std::mutex global_mutex_;
  std::unique_ptr<Group> global_;  // formed by global(); guarded by global_mutex_
  std::string aborted_;            // abort()'s reason; guarded by global_mutex_
  std::unique_ptr<ShmGroup> local_;
  std::unique_ptr<Group> leaders_;
  int num_hosts_ = 0;
  std::vector<std::unique_ptr<Group>> lanes_;  // one rank per host: lanes 1.., each a group of its own
  std::atomic<uint64_t> next_async_{0};        // allreduce_async calls so far (their lanes)
  std::atomic<size_t> shared_taken_{0};        // bytes of local_'s shared region handed out
  std::atomic<uint64_t> cross_host_bytes_{0};
  std::unique_ptr<OpQueue> queue_;             // lane 0; destroyed first (see the destructor)
  std::vector<std::unique_ptr<OpQueue>> lane_queues_;
};

}  // namespace dsgd::comm
