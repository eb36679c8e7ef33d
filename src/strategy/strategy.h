// How each replica's gradients become the one averaged gradient every replica applies.
//
//   auto s = dsgd::strategy::make_allreduce_strategy(group);          // or make_simple_strategy(...)
//   auto w = s->average_async(bucket_data, count);                    // from a gradient hook
//   ... backward goes on ...
//   w->wait();                                                        // bucket_data holds the average
//
// A strategy works on flat float32 buckets and knows nothing of tensors (torch-free). Every
// replica must start the same averages in the same order (src/torch/sync/grad_sync.h launches
// buckets in one fixed order for that). Results are identical on every replica, so replicas stay
// bit-identical. Thread-safe. The parameter-server strategies implement this same interface;
// those that apply the optimizer on their servers (ps with update on shards, ps_async) take
// gradients and give back parameters through their ServerUpdates facet instead (see below); under
// ps_async each replica holds the parameters it last received, not the same ones as the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "dsgd/common/choice.h"
#include "dsgd/comm/hierarchical.h"
#include "dsgd/comm/work.h"
#include "strategy/powersgd.h"

namespace dsgd::strategy {

// SGD's hyper-parameters, as torch::optim::SGD applies them (weight decay, momentum with
// dampening, Nesterov), for strategies that update parameters on their servers.
struct SgdOptions {
  float lr = 0;
  float momentum = 0;
  float dampening = 0;
  float weight_decay = 0;
  bool nesterov = false;
};

// One bucket handed to the servers that update it (ps with update on shards).
struct ShardUpdate {
  uint64_t key = 0;        // the bucket's identity, the same on every replica
  float* data = nullptr;   // in: this replica's (weighted) gradient; out: the updated parameters
  size_t count = 0;
  SgdOptions sgd{};        // this step's (schedules move lr)
  // The servers keep the parameters and momentum of their slice between steps. With `init`,
  // they (re)start it from this replica's: `params` (count floats) and `momentum` (null: none
  // yet, as in a fresh torch::optim::SGD), both read only during the call.
  bool init = false;
  const float* params = nullptr;
  const float* momentum = nullptr;
};

class ErrorFeedback;
class ServerUpdates;
class Sharing;

// The core every strategy has: averaging buckets. What only some strategies do is a facet of its
// own, reached through an accessor that returns null where the strategy lacks it:
// error_feedback() (compression that keeps what it left out) and server_updates() (the optimizer
// applied on the servers).
class GradientStrategy {
 public:
  virtual ~GradientStrategy() = default;
  virtual std::string name() const = 0;
  // Starts averaging `count` floats at `data` over all replicas, in place. The returned Work
  // completes when `data` holds the average, or fails (CommError / TimeoutError).
  virtual std::shared_ptr<comm::Work> average_async(float* data, size_t count) = 0;
  // Fails whatever is in flight or queued, from any thread.
  virtual void abort(const std::string& reason) = 0;
  // Bytes this replica has sent to other hosts so far; -1 where the strategy does not count them.
  virtual int64_t cross_host_bytes() const { return -1; }
  // Memory for `count` floats of gradients that this strategy averages faster where they lie
  // (a host's shared memory: nothing copied in), or null: use memory of your own. It stays valid
  // while the strategy lives. Every replica must ask for the same sizes in the same order.
  virtual float* gradient_buffer(size_t /*count*/) { return nullptr; }

  // Non-null where this strategy compresses with error feedback: then buckets average through
  // it instead of average_async.
  virtual ErrorFeedback* error_feedback() { return nullptr; }
  // Non-null where this strategy applies the optimizer on its servers: then buckets go through
  // it (gradients in, parameters out) instead of average_async.
  virtual ServerUpdates* server_updates() { return nullptr; }
  // Non-null where replicas can hand each other their shares of the parameters and optimizer
  // state (ZeRO, StepConfig::zero_stage).
  virtual Sharing* sharing() { return nullptr; }
};

// Strategies over which each replica steps a share of the parameters (ZeRO stage 1: allreduce).
// Collective: every replica makes the same calls in the same order.
class Sharing {
 public:
  // Starts an exact float32 sum of `count` floats over all replicas, in place, in float32 at every
  // stage. Where each replica's buffer is zero outside its own share, the sum is every share:
  // an allgather through the allreduce's fast paths (a host's shared memory, Gloo across hosts),
  // bit-exact because adding zeros is.
  virtual std::shared_ptr<comm::Work> sum_async(float* data, size_t count) = 0;
  // ZeRO's halves of an allreduce (strategy::ShardLayout), float32, in order with the other
  // calls: `in` holds size() blocks of `block` floats and `out` receives the average of block
  // rank() over the replicas (`out` may be that block of `in`); or `out` (size() * block floats)
  // receives every replica's block
  // `in`, in rank order. Together they send what one allreduce of the blocks does.
  virtual std::shared_ptr<comm::Work> reduce_scatter_async(const float* in, float* out, size_t block) = 0;
  virtual std::shared_ptr<comm::Work> allgather_async(const float* in, float* out, size_t block) = 0;
  // Replica `root`'s `bytes` at `data` into every replica's `data` (each passes as many): within
  // a host through shared memory, across hosts Gloo. Blocking; for state moved outside steps.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Replica `root`'s *bytes (any length) into every replica's *bytes: its length, then broadcast.
  void broadcast_bytes(std::string* bytes, int root);
  virtual int rank() const = 0;
  virtual int size() const = 0;

 protected:
  ~Sharing() = default;
};

// Strategies that compress what crosses hosts with error feedback (allreduce and ps with
// compression fp16, bf16 or powersgd): b.residual is count floats of this replica's feedback for
// the bucket (zeros at first), which the call reads and updates, and b.powersgd its PowerSGD
// state; the caller keeps both (GradSync, with the replica's state). PowerSGD without a state
// (null) sends the bucket as float32. Same ordering contract as average_async.
class ErrorFeedback {
 public:
  struct Bucket {
    uint64_t index = 0;                                  // its position in the plan, the same on every replica
    float* residual = nullptr;
    const std::vector<MatrixSlot>* matrices = nullptr;  // its matrix-shaped gradients (PowerSGD)
    PowerSgdState* powersgd = nullptr;                   // PowerSGD's state of the bucket (kept with residual)
  };
  virtual std::shared_ptr<comm::Work> average_with_feedback_async(float* data, size_t count, const Bucket& b) = 0;

 protected:
  ~ErrorFeedback() = default;
};

// Strategies that apply the optimizer on their servers (ps with update on shards, ps_async):
// they take gradients and give back parameters, with average_async's ordering contract
// (gather_state_async included).
class ServerUpdates {
 public:
  // Starts one bucket's SGD step on its servers. The Work completes when u.data holds the new
  // parameters; *all_applied (written before completion) is false when a shard's averaged
  // gradient was not finite: that shard kept its parameters and momentum.
  virtual std::shared_ptr<comm::Work> update_async(const ShardUpdate& u, bool* all_applied) = 0;
  // Copies the momentum the servers hold for bucket `key` into `momentum` (count floats) on every
  // replica, for checkpoints; *has_momentum is false where they hold none (no step since they
  // started from the replicas, or no momentum configured): `momentum` is then left as it was.
  // `params` (null for ps, whose replicas hold the servers' parameters already) receives the
  // servers' parameters.
  virtual std::shared_ptr<comm::Work> gather_state_async(uint64_t key, float* params, float* momentum, size_t count,
                                                         bool* has_momentum) = 0;
  // Servers that must hold their state before any replica's first step (ps_async: any replica
  // may push first) are started here, by every replica, from its parameters and momentum (null:
  // none), after each state load; the others start from ShardUpdate::init.
  virtual bool starts_servers_eagerly() const { return false; }
  virtual void start_servers(uint64_t /*key*/, const float* /*params*/, const float* /*momentum*/, size_t /*count*/) {}
  // Staleness of this replica's updates since the last call: how many other updates its shards
  // had applied between the parameters it computed on and its own (0 where the servers are
  // synchronous).
  struct Staleness {
    int64_t updates = 0;
    int64_t sum = 0;
    int64_t max = 0;
  };
  virtual Staleness take_staleness() { return {}; }

 protected:
  ~ServerUpdates() = default;
};

// `allreduce`: the communication core's hierarchical allreduce (shared memory within a host,
// Gloo among host leaders). algorithm kAuto uses the hierarchy; kRing or kHalvingDoubling run one flat
// Gloo allreduce over every replica (for comparison). `compression` fp16 or bf16 sends the
// across-host stage in 16 bits with error feedback (comm::CrossHostWire), powersgd a rank-R
// approximation of each matrix (powersgd.h); kAuto only (validate). The strategy shares ownership of
// `group`.
struct CompressionOptions {
  Compression kind = Compression::kNone;
  int powersgd_rank = 4;
  int powersgd_start_steps = 10;
  uint64_t seed = 1;
};
std::unique_ptr<GradientStrategy> make_allreduce_strategy(
    std::shared_ptr<comm::HierarchicalGroup> group,
    comm::AllreduceAlgorithm algorithm = comm::AllreduceAlgorithm::kAuto, const CompressionOptions& compression = {});

// `ps`: synchronous parameter servers, sharded, the shards living in the worker processes (each
// host leader serves a share of every bucket: BytePS's and MXNet's arrangement, which spreads
// the servers' traffic over all hosts). Per bucket: a shared-memory sum within each host; each
// host leader pushes shard s (a contiguous 1/num_shards of the bucket) to its owner, leader
// s % hosts; the owner sums the pushes, divides by the number of replicas and sends the average
// back; leaders broadcast it within their host. Buckets run one after another on the strategy's
// own thread while backward computes the next (computation, transfer and summation pipelined, the
// Ray paper's point); all of a bucket's pushes, then all its pulls, are in flight at once.
// num_shards in 1..64; 1 is a single server on host 0.
//
// update_on_shards (MXNet's update_on_kvstore): the owners also apply SGD to their slices,
// keeping the parameters and the momentum of their slices (optimizer state sharded across the
// servers), and send back parameters instead of averages. On one host the leader owns every
// shard. A shard whose averaged gradient is not finite skips its step (the others take theirs).
//
// shard_processes (Ray's and TensorFlow's arrangement): shard s is a process of its own
// (PsServer, ps_server.h) instead of a host leader; leaders reach the shards through `servers`,
// the group of the host leaders (ranks 0..hosts-1, in leader order) and the shards (ranks
// hosts..hosts+num_shards-1), over Gloo also on one host. The sums, divisions and SGD are the
// same in the same order, so both placements give bit-identical results.
// `wire` kFloat16 or kBFloat16 (compression fp16, bf16; shards in the workers, averaging only):
// each leader rounds its host's sum plus its residual (error feedback) to 16 bits and pushes
// that, the owner sums the pushes in float32, in leader order, rounds the average once and
// sends it back in 16 bits: half the bytes of float32 both ways. `powersgd` (same conditions):
// the host sums cross hosts as PowerSGD's factors (powersgd.h), summed among the host leaders
// rather than through the shards (its second round needs the first's sum at once, which a
// push and a pull per round would only delay).
struct PsOptions {
  int num_shards = 1;
  bool update_on_shards = false;
  bool shard_processes = false;
  std::shared_ptr<comm::Group> servers = nullptr;  // shard_processes: set on host leaders, null elsewhere
  comm::DataType wire = comm::DataType::kFloat32;
  std::shared_ptr<PowerSgd> powersgd = nullptr;
};
std::unique_ptr<GradientStrategy> make_ps_strategy(std::shared_ptr<comm::HierarchicalGroup> group,
                                                   const PsOptions& options);
inline std::unique_ptr<GradientStrategy> make_ps_strategy(std::shared_ptr<comm::HierarchicalGroup> group,
                                                          int num_shards, bool update_on_shards = false) {
  return make_ps_strategy(std::move(group), PsOptions{.num_shards = num_shards, .update_on_shards = update_on_shards});
}

// `ps_async` (TensorFlow's ParameterServerStrategy): asynchronous parameter servers. Shard s of
// every bucket (a contiguous 1/num_shards) lives in replica owner(s) (the lowest rank of host
// s % hosts), which applies SGD to it the moment a replica's gradient arrives and answers with
// the parameters as they are then: replicas never wait for each other, except that a replica more
// than max_staleness updates ahead of the slowest on a shard waits for it there (stale
// synchronous parallel; max_staleness < 0: never). Each replica talks to each owner over Gloo
// point-to-point (a serving thread per client in every owner); its own shards it updates in
// place. Staleness is reported by take_staleness(). Servers start eagerly (start_servers).
std::unique_ptr<GradientStrategy> make_ps_async_strategy(std::shared_ptr<comm::HierarchicalGroup> group,
                                                         int num_shards, int max_staleness);

// `simple`: every replica sends its bucket to a central reducer (the driver) that averages and
// answers each replica with the average. `central_average(seq, data, count)` must block until
// data holds the average of the seq-th call on every replica, or throw. Calls run one at a time,
// in order, on the strategy's own thread, so backward overlaps them as with allreduce.
using CentralAverage = std::function<void(uint64_t seq, float* data, size_t count)>;
std::unique_ptr<GradientStrategy> make_simple_strategy(CentralAverage central_average);

// ---- the one factory the worker uses ----
// What a job says about its strategy (TrainerConfig's fields of the same names; the worker fills
// it from its JobSpec).
struct StrategyOptions {
  Strategy kind = Strategy::kAllreduce;
  AllreduceAlgo allreduce_algo = AllreduceAlgo::kAuto;
  int num_ps_shards = 0;                  // ps, ps_async: 0 = one per host
  bool ps_update_on_shards = false;
  PsPlacement ps_placement = PsPlacement::kWorkers;
  int max_staleness = -1;                 // ps_async
  CompressionOptions compression;         // allreduce, ps: across hosts
  CentralAverage central_average;         // simple: the driver's average
  // ps with ps_placement processes, called on host leaders: joins the shard processes' group
  // (PsOptions::servers) of this many shards.
  std::function<std::shared_ptr<comm::Group>(int num_shards)> join_ps_servers;
};

// The strategies' own rules, the one place each is checked: what combines with what
// (compression with allreduce's hierarchy or ps averaging in the workers; ps_update_on_shards
// and ps_placement processes with ps), and the ranges of their settings (num_ps_shards,
// max_staleness, powersgd_rank, powersgd_start_steps). The Trainer's validation calls it on
// the driver, before any process starts; make_strategy calls it too. ConfigError naming the
// TrainerConfig field (ConfigError::field()).
void validate(const StrategyOptions& options);

// The strategy `options.kind` over `group` (the replica's group; unused, and may be null, for
// simple). ConfigError for options validate() rejects, a simple strategy without its
// central_average, or a group-based one without its group.
std::unique_ptr<GradientStrategy> make_strategy(const StrategyOptions& options,
                                                std::shared_ptr<comm::HierarchicalGroup> group);

}  // namespace dsgd::strategy
