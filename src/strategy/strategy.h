// How each replica's gradients become the one averaged gradient every replica applies.
//
//   auto s = dsgd::strategy::make_allreduce_strategy(group);          // or make_simple_strategy(...)
//   auto w = s->average_async(bucket_data, count);                    // from a gradient hook
//   ... backward goes on ...
//   w->wait();                                                        // bucket_data holds the average
//
// A strategy works on flat float32 buckets and knows nothing of tensors (torch-free). Every
// replica must start the same averages in the same order (src/torch/grad_sync.h launches
// buckets in index order for that). Results are identical on every replica, so replicas stay
// bit-identical. Thread-safe. The parameter-server strategies implement this same interface.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "dsgd/comm/hierarchical.h"
#include "dsgd/comm/work.h"

namespace dsgd::strategy {

class GradientStrategy {
 public:
  virtual ~GradientStrategy() = default;
  virtual std::string name() const = 0;
  // Starts averaging `count` floats at `data` over all replicas, in place. The returned Work
  // completes when `data` holds the average, or fails (CommError / TimeoutError).
  virtual std::shared_ptr<comm::Work> average_async(float* data, size_t count) = 0;
  // Fails whatever is in flight or queued, from any thread.
  virtual void abort(const std::string& reason) = 0;
};

// `allreduce`: the communication core's hierarchical allreduce (shared memory within a host,
// Gloo among host leaders). algorithm "auto" uses the hierarchy; "ring" or "hd" run one flat
// Gloo allreduce over every replica (for comparison). The strategy shares ownership of `group`.
std::unique_ptr<GradientStrategy> make_allreduce_strategy(std::shared_ptr<comm::HierarchicalGroup> group,
                                                          const std::string& algorithm = "auto");

// `ps`: synchronous parameter servers, sharded, the shards living in the worker processes (each
// host leader serves a share of every bucket: BytePS's and MXNet's arrangement, which spreads
// the servers' traffic over all hosts). Per bucket: a shared-memory sum within each host; each
// host leader pushes shard s (a contiguous 1/num_shards of the bucket) to its owner, leader
// s % hosts; the owner sums the pushes, divides by the number of replicas and sends the average
// back; leaders broadcast it within their host. Buckets run one after another on the strategy's
// own thread while backward computes the next (computation, transfer and summation pipelined, the
// Ray paper's point); all of a bucket's pushes, then all its pulls, are in flight at once.
// num_shards in 1..64; 1 is a single server on host 0.
std::unique_ptr<GradientStrategy> make_ps_strategy(std::shared_ptr<comm::HierarchicalGroup> group, int num_shards);

// `simple`: every replica sends its bucket to a central reducer (the driver) that averages and
// answers each replica with the average. `central_average(seq, data, count)` must block until
// data holds the average of the seq-th call on every replica, or throw. Calls run one at a time,
// in order, on the strategy's own thread, so backward overlaps them as with allreduce.
using CentralAverage = std::function<void(uint64_t seq, float* data, size_t count)>;
std::unique_ptr<GradientStrategy> make_simple_strategy(CentralAverage central_average);

}  // namespace dsgd::strategy
