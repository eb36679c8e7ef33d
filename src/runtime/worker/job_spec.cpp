#include "runtime/worker/job_spec.h"

#include <algorithm>
#include <thread>

#include "dsgd/error.h"
#include "strategy/strategy.h"
#include "torch/device.h"
#include "torch/replica.h"

namespace dsgd::runtime {
namespace {

// dsgd's enums and the proto's share their numbers (1.. in the order of ChoiceTraits::names).
template <typename P, typename E>
P to_wire(E e) {
  return static_cast<P>(static_cast<int>(e));
}

template <typename E, typename P>
E from_wire(P p) {
  const int n = static_cast<int>(p);
  if (n <= 0 || n > static_cast<int>(ChoiceTraits<E>::names.size())) {
    throw ConfigError("the job spec's " + std::string(ChoiceTraits<E>::field) + " is " + std::to_string(n) +
                      ", which this build does not know: are the driver and this process from different dsgd "
                      "versions?");
  }
  return static_cast<E>(n);
}

static_assert(static_cast<int>(Strategy::kPsAsync) == proto::STRATEGY_PS_ASYNC);
static_assert(static_cast<int>(Strategy::kSimple) == proto::STRATEGY_SIMPLE);
static_assert(static_cast<int>(PsPlacement::kProcesses) == proto::PS_PLACEMENT_PROCESSES);
static_assert(static_cast<int>(AllreduceAlgo::kHalvingDoubling) == proto::ALLREDUCE_ALGO_HD);
static_assert(static_cast<int>(AllreduceAlgo::kRing) == proto::ALLREDUCE_ALGO_RING);
static_assert(static_cast<int>(Device::kCuda) == proto::DEVICE_CUDA);
static_assert(static_cast<int>(Device::kCpu) == proto::DEVICE_CPU);
static_assert(static_cast<int>(Compression::kBf16) == proto::COMPRESSION_BF16);
static_assert(static_cast<int>(Compression::kFp16) == proto::COMPRESSION_FP16);
static_assert(static_cast<int>(Compression::kPowerSgd) == proto::COMPRESSION_POWERSGD);

}  // namespace

proto::Strategy to_proto(Strategy s) { return to_wire<proto::Strategy>(s); }
proto::PsPlacement to_proto(PsPlacement p) { return to_wire<proto::PsPlacement>(p); }
proto::AllreduceAlgo to_proto(AllreduceAlgo a) { return to_wire<proto::AllreduceAlgo>(a); }
Strategy from_proto(proto::Strategy s) { return from_wire<Strategy>(s); }
PsPlacement from_proto(proto::PsPlacement p) { return from_wire<PsPlacement>(p); }
AllreduceAlgo from_proto(proto::AllreduceAlgo a) { return from_wire<AllreduceAlgo>(a); }
proto::Device to_proto(Device d) { return to_wire<proto::Device>(d); }
Device from_proto(proto::Device d) { return from_wire<Device>(d); }
proto::Compression to_proto(Compression c) { return to_wire<proto::Compression>(c); }
Compression from_proto(proto::Compression c) { return from_wire<Compression>(c); }

proto::JobSpec make_job_spec(const std::string& op, const TrainerConfig& c) {
  int threads = c.threads_per_worker;
  if (threads == 0 && c.launch.listen.empty()) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / c.num_workers);
  }
  proto::JobSpec s;
  s.set_operator_name(op);
  s.set_operator_config(c.config.dump());
  s.set_num_workers(c.num_workers);
  s.set_devices_per_worker(c.devices_per_worker);
  s.set_batch_size(c.batch_size);
  s.set_seed(c.seed);
  s.set_initialization_hook(c.initialization_hook);
  s.set_threads_per_worker(threads);
  s.set_strategy(to_proto(c.strategy.value()));
  s.set_allreduce_algo(to_proto(c.comm.allreduce_algo.value()));
  s.set_grad_shard_bytes(c.comm.grad_shard_bytes);
  s.set_overlap(c.comm.overlap);
  s.set_forward_overlap_buckets(c.comm.forward_overlap_buckets);
  const int shard_processes = ps_shard_processes(c);
  s.set_num_ps_shards(shard_processes > 0 ? shard_processes : c.ps.shards);
  s.set_ps_placement(to_proto(c.ps.placement.value()));
  s.set_ps_update_on_shards(c.ps.update_on_shards);
  s.set_max_staleness(c.ps.max_staleness);
  s.set_heartbeat_timeout_ms(c.recovery.heartbeat_timeout.count());
  s.set_comm_timeout_ms(c.comm.timeout.count());
  if (!c.recovery.driver_state_dir.empty()) s.set_driver_grace_ms(c.recovery.driver_grace.count());
  s.set_device(to_proto(c.device.value()));
  s.set_compression(to_proto(c.comm.compression.value()));
  s.set_powersgd_rank(c.comm.powersgd_rank);
  s.set_powersgd_start_steps(c.comm.powersgd_start_steps);
  StepConfig step = c.step;
  step.loss_scale = loss_scale_of(c);
  s.set_step(nlohmann::json(step).dump());
  return s;
}

torch_glue::ReplicaOptions replica_options(const proto::JobSpec& spec, const ReplicaInfo& info, int threads) {
  torch_glue::ReplicaOptions o;
  o.info = info;
  o.seed = spec.seed();
  o.global_batch = spec.batch_size();
  o.grad_shard_bytes = static_cast<size_t>(spec.grad_shard_bytes());
  try {
    o.step = nlohmann::json::parse(spec.step()).get<StepConfig>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("the job spec's step settings are not JSON of StepConfig (" + std::string(e.what()) +
                      "): are the driver and this process from different dsgd versions?");
  }
  o.threads = threads;
  o.overlap = spec.overlap();
  o.forward_overlap_buckets = spec.forward_overlap_buckets();
  o.info.device = torch_glue::replica_device(from_proto(spec.device()),
                                             info.worker * spec.devices_per_worker() + info.local_replica);
  return o;
}

strategy::StrategyOptions strategy_options(const proto::JobSpec& spec) {
  strategy::StrategyOptions o;
  o.kind = from_proto(spec.strategy());
  o.allreduce_algo = from_proto(spec.allreduce_algo());
  o.num_ps_shards = spec.num_ps_shards();
  o.ps_update_on_shards = spec.ps_update_on_shards();
  o.ps_placement = from_proto(spec.ps_placement());
  o.max_staleness = spec.max_staleness();
  o.compression = {.kind = from_proto(spec.compression()),
                   .powersgd_rank = spec.powersgd_rank(),
                   .powersgd_start_steps = spec.powersgd_start_steps(),
                   .seed = spec.seed()};
  return o;
}

}  // namespace dsgd::runtime
