// The synchronous forms of Group's operations: queue, then wait for the Work. The wait needs no
// timer of its own: the operation and every one queued before it end by their own deadlines, and
// a timer here would fire spuriously on a call queued behind long (but healthy) operations.
#include "dsgd/comm/group.h"

#include "dsgd/common/error.h"

namespace dsgd::comm {

void Group::allreduce(void* data, size_t count, DataType type, ReduceOp op, AllreduceAlgorithm algorithm,
                      std::chrono::milliseconds timeout) {
  allreduce_async(data, count, type, op, algorithm, timeout)->wait();
}
void Group::broadcast(void* data, size_t bytes, int root, std::chrono::milliseconds timeout) {
  broadcast_async(data, bytes, root, timeout)->wait();
}
void Group::allgather(const void* in, void* out, size_t bytes, std::chrono::milliseconds timeout) {
  allgather_async(in, out, bytes, timeout)->wait();
}
void Group::reduce_scatter(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                           std::chrono::milliseconds timeout) {
  reduce_scatter_async(in, out, count, type, op, timeout)->wait();
}
void Group::barrier(std::chrono::milliseconds timeout) { barrier_async(timeout)->wait(); }
void Group::alltoall(const void* in, void* out, size_t bytes, std::chrono::milliseconds timeout) {
  alltoall_async(in, out, bytes, timeout)->wait();
}
std::shared_ptr<Work> Group::alltoall_async(const void*, void*, size_t, std::chrono::milliseconds) {
  throw Error("alltoall: this group does not offer it (Gloo groups do)");
}
void Group::send(const void* data, size_t bytes, int peer, uint32_t tag, std::chrono::milliseconds timeout) {
  send_async(data, bytes, peer, tag, timeout)->wait();
}
void Group::recv(void* data, size_t bytes, int peer, uint32_t tag, std::chrono::milliseconds timeout) {
  recv_async(data, bytes, peer, tag, timeout)->wait();
}

}  // namespace dsgd::comm
