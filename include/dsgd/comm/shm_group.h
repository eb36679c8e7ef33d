// dsgd/comm/shm_group.h — allreduce among the ranks of one host through a POSIX shared-memory
// segment: the same-host fast path.
//
//   auto shm = dsgd::comm::ShmGroup::create(store, local_rank, local_size);   // collective
//   shm->allreduce(grads, n, DataType::kFloat32, ReduceOp::kAverage);          // copies in and out
//   float* bucket = static_cast<float*>(shm->buffer());                        // or: zero-copy
//   ... fill bucket ...;  shm->allreduce(bucket, n, ...);                       // nothing copied in
//
// Algorithm: every rank's data sits in its own slot of the segment; after a barrier each rank
// reduces its 1/n block across all slots (vectorised), and after a second barrier copies every
// block out. Buffers larger than a slot go in slot-sized pieces. Data already in this rank's
// slot (buffer()) is reduced in place: no copy in, and only the other ranks' blocks copied out.
// So is data that lives in this rank's shared region (shared_buffer(), ShmOptions::shared_bytes),
// which, unlike the slot, no other operation touches: gradients can stay there between steps
// (every rank must then pass the same offset of its region; ranks that do not fail the group).
//
// Reduce-scatter and allgather, ZeRO's two halves of an allreduce, go through the slots too: in a
// reduce-scatter each rank writes its whole input into its slot and reduces only its own block
// from every slot; in an allgather each rank writes its block and copies every other one out.
//
// Synchronisation: a barrier on shared atomics that spins briefly (ShmOptions::spin_us) and then
// sleeps on a futex, so a waiting rank does not burn a core another worker computes on. Every wait
// has a deadline; while waiting, peers' processes are checked, and a dead one fails the operation
// at once with dsgd::CommError naming it; a hung one gives dsgd::TimeoutError at the deadline,
// naming the ranks that did not arrive. Errors are sticky (the segment's state is unknown after
// one): re-form. The segment's name is unlinked as soon as every rank has mapped it, so nothing
// is left in /dev/shm whatever happens afterwards; before then, a creator killed while the others
// were still to come leaves it, and the next group created on the host (or the next driver)
// removes it: remove_orphaned_segments().
//
// Operations run one at a time, in submission order, on the group's own thread: the *_async
// forms return a Work at once (overlap them with computation), the plain forms wait for it.
// Thread-safe. Torch-free.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "dsgd/comm/store.h"
#include "dsgd/comm/types.h"
#include "dsgd/comm/work.h"

namespace dsgd::comm {

struct ShmOptions {
  size_t slot_bytes = 32 << 20;                     // per rank; larger buffers go in pieces
  std::chrono::milliseconds timeout{30000};         // deadline of creation and of each operation
  std::chrono::microseconds spin_us{50};            // busy-wait before sleeping in a barrier
  size_t shared_bytes = 0;                          // per rank: shared_buffer()'s size (0: none)
};

class ShmGroup {
 public:
  // Collective over the `size` ranks of this host, which meet through `store` (namespace it per
  // job, generation and host). Throws dsgd::TimeoutError naming ranks that did not arrive.
  static std::unique_ptr<ShmGroup> create(std::shared_ptr<Store> store, int rank, int size,
                                          const ShmOptions& options = {});
  virtual ~ShmGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place. `data` may be buffer() (zero-copy) or any memory of this process; it must stay
  // valid until the Work completes.
  virtual std::shared_ptr<Work> allreduce_async(void* data, size_t count, DataType type, ReduceOp op,
                                                std::chrono::milliseconds timeout = {}) = 0;
  // root's bytes at data reach every rank's data.
  virtual std::shared_ptr<Work> broadcast_async(void* data, size_t bytes, int root,
                                                std::chrono::milliseconds timeout = {}) = 0;
  virtual std::shared_ptr<Work> barrier_async(std::chrono::milliseconds timeout = {}) = 0;
  // `in` holds size() blocks of `count` elements; `out` (count elements; it may be block rank() of
  // `in`) receives the reduction of block rank() over every rank (kAverage: divided by size()).
  virtual std::shared_ptr<Work> reduce_scatter_async(const void* in, void* out, size_t count, DataType type,
                                                     ReduceOp op, std::chrono::milliseconds timeout = {}) = 0;
  // `out` (size() * bytes) receives every rank's `bytes` at `in`, in rank order. `in` is
  // block rank() of `out` (in place) or memory apart from it.
  virtual std::shared_ptr<Work> allgather_async(const void* in, void* out, size_t bytes,
                                                std::chrono::milliseconds timeout = {}) = 0;

  // Synchronous forms: in order with the queued ones; run on the caller's thread when nothing
  // is queued (a 4-byte allreduce then costs no thread hand-off).
  virtual void allreduce(void* data, size_t count, DataType type, ReduceOp op,
                         std::chrono::milliseconds timeout = {}) = 0;
  virtual void broadcast(void* data, size_t bytes, int root, std::chrono::milliseconds timeout = {}) = 0;
  virtual void barrier(std::chrono::milliseconds timeout = {}) = 0;

  // This rank's slot in the segment (slot_bytes, 64-byte aligned): data placed here is
  // allreduced without being copied in.
  virtual void* buffer() = 0;
  virtual size_t buffer_bytes() const = 0;

  // This rank's shared region (ShmOptions::shared_bytes, 4096-byte aligned; null when 0): memory
  // that only its owner writes, where data can live (a replica's gradients). An allreduce of
  // `count` elements at offset o of it, with every rank passing offset o of its own region, reads
  // the other ranks' regions in place: nothing copied in, (n-1)/n of the data copied out.
  virtual void* shared_buffer() = 0;
  virtual size_t shared_buffer_bytes() const = 0;

  // Fails the current and every later operation of every rank with dsgd::CommError(reason).
  // Thread-safe.
  virtual void abort(const std::string& reason) = 0;
};

// Removes this user's segments in `dir` ("dsgd-<pid>-<random>-<pid namespace>") whose creating
// process is dead: names left by a creator killed before every rank had mapped its segment.
// Only names from this PID namespace are judged (a pid from another one means nothing here).
// Returns how many it removed. Runs when a group is created and when a driver starts.
int remove_orphaned_segments(const std::string& dir = "/dev/shm");

}  // namespace dsgd::comm
