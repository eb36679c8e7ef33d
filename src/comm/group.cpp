// The synchronous forms of Group's operations: queue, then wait. Waiting a little longer than
// the operation's own deadline lets the operation report its own (more precise) timeout.
#include "dsgd/comm/group.h"

namespace dsgd::comm {
namespace {

constexpr std::chrono::milliseconds kWaitSlack{5000};

void finish(const std::shared_ptr<Work>& work, std::chrono::milliseconds timeout, std::chrono::milliseconds group_timeout) {
  work->wait((timeout.count() > 0 ? timeout : group_timeout) + kWaitSlack);
}

}  // namespace

// Every synchronous call waits for its Work; the Work's own deadline is the operation's.
void Group::allreduce(void* data, size_t count, DataType type, ReduceOp op, AllreduceAlgorithm algorithm,
                      std::chrono::milliseconds timeout) {
  finish(allreduce_async(data, count, type, op, algorithm, timeout), timeout, this->timeout());
}
void Group::broadcast(void* data, size_t bytes, int root, std::chrono::milliseconds timeout) {
  finish(broadcast_async(data, bytes, root, timeout), timeout, this->timeout());
}
void Group::allgather(const void* in, void* out, size_t bytes, std::chrono::milliseconds timeout) {
  finish(allgather_async(in, out, bytes, timeout), timeout, this->timeout());
}
void Group::reduce_scatter(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                           std::chrono::milliseconds timeout) {
  finish(reduce_scatter_async(in, out, count, type, op, timeout), timeout, this->timeout());
}
void Group::barrier(std::chrono::milliseconds timeout) {
  finish(barrier_async(timeout), timeout, this->timeout());
}
void Group::send(const void* data, size_t bytes, int peer, uint32_t tag, std::chrono::milliseconds timeout) {
  finish(send_async(data, bytes, peer, tag, timeout), timeout, this->timeout());
}
void Group::recv(void* data, size_t bytes, int peer, uint32_t tag, std::chrono::milliseconds timeout) {
  finish(recv_async(data, bytes, peer, tag, timeout), timeout, this->timeout());
}

}  // namespace dsgd::comm
