#include "strategy/strategy.h"

#include <atomic>

#include "comm/op_queue.h"
#include "dsgd/common/error.h"

namespace dsgd::strategy {

namespace {

class AllreduceStrategy final : public GradientStrategy, private ErrorFeedback, private Sharing {
 public:
  AllreduceStrategy(std::shared_ptr<comm::HierarchicalGroup> group, comm::AllreduceAlgorithm algorithm,
                    const CompressionOptions& compression)
      : group_(std::move(group)), algorithm_(algorithm) {
    const Compression kind = compression.kind;
    if (kind == Compression::kPowerSgd) {
      powersgd_ = std::make_shared<PowerSgd>(PowerSgd::Options{.rank = compression.powersgd_rank,
                                                               .start_steps = compression.powersgd_start_steps,
                                                               .seed = compression.seed});
    } else if (kind != Compression::kNone) {
      wire_ = kind == Compression::kFp16 ? comm::DataType::kFloat16 : comm::DataType::kBFloat16;
    }
  }
  std::string name() const override { return "allreduce"; }
  std::shared_ptr<comm::Work> average_async(float* data, size_t count) override {
    return average_with_feedback_async(data, count, {});
  }
  ErrorFeedback* error_feedback() override {
    return wire_ != comm::DataType::kFloat32 || powersgd_ != nullptr ? this : nullptr;
  }
  std::shared_ptr<comm::Work> average_with_feedback_async(float* data, size_t count, const Bucket& b) override {
    if (algorithm_ == comm::AllreduceAlgorithm::kAuto) {
      comm::CrossHostWire wire{.type = wire_, .residual = b.residual};
      if (powersgd_ && b.powersgd != nullptr) {
        // The stage runs on the group's thread: it holds the state it needs.
        std::shared_ptr<PowerSgd> psgd = powersgd_;
        const PowerSgdBucket bucket{
            .index = b.index, .state = b.powersgd, .residual = b.residual, .matrices = b.matrices};
        wire = {.stage = [psgd, bucket](comm::Group& leaders, float* d, size_t n, std::chrono::milliseconds t) {
          return psgd->reduce(leaders, bucket, d, n, t);
        }};
      }
      return group_->allreduce_async(data, count, comm::DataType::kFloat32, comm::ReduceOp::kAverage, {}, wire);
    }
    return group_->global().allreduce_async(data, count, comm::DataType::kFloat32, comm::ReduceOp::kAverage,
                                            algorithm_);
  }
  int64_t cross_host_bytes() const override {  // the hierarchy's; a flat algorithm's are not counted
    return algorithm_ == comm::AllreduceAlgorithm::kAuto ? static_cast<int64_t>(group_->cross_host_bytes()) : -1;
  }
  float* gradient_buffer(size_t count) override {  // the shared-memory stage then copies nothing in
    if (algorithm_ != comm::AllreduceAlgorithm::kAuto) return nullptr;
    return static_cast<float*>(group_->take_shared(count * sizeof(float)));
  }
  void abort(const std::string& reason) override {
    group_->abort(reason);
  }
  Sharing* sharing() override { return this; }
  std::shared_ptr<comm::Work> sum_async(float* data, size_t count) override {
    if (algorithm_ == comm::AllreduceAlgorithm::kAuto) {
      return group_->allreduce_async(data, count, comm::DataType::kFloat32, comm::ReduceOp::kSum);
    }
    return group_->global().allreduce_async(data, count, comm::DataType::kFloat32, comm::ReduceOp::kSum, algorithm_);
  }
  std::shared_ptr<comm::Work> reduce_scatter_async(const float* in, float* out, size_t block) override {
    constexpr auto kFloat = comm::DataType::kFloat32;
    if (algorithm_ == comm::AllreduceAlgorithm::kAuto) {
      return group_->reduce_scatter_async(in, out, block, kFloat, comm::ReduceOp::kAverage);
    }
    return group_->global().reduce_scatter_async(in, out, block, kFloat, comm::ReduceOp::kAverage);
  }
  std::shared_ptr<comm::Work> allgather_async(const float* in, float* out, size_t block) override {
    if (algorithm_ == comm::AllreduceAlgorithm::kAuto) return group_->allgather_async(in, out, block * sizeof(float));
    return group_->global().allgather_async(in, out, block * sizeof(float));
  }
  void broadcast(void* data, size_t bytes, int root) override { group_->broadcast(data, bytes, root); }
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }

 private:
  std::shared_ptr<comm::HierarchicalGroup> group_;
  const comm::AllreduceAlgorithm algorithm_;  // kAuto: the hierarchy; else one flat Gloo allreduce
  comm::DataType wire_ = comm::DataType::kFloat32;  // across hosts
  std::shared_ptr<PowerSgd> powersgd_;              // compression powersgd
};

class SimpleStrategy final : public GradientStrategy {
 public:
  explicit SimpleStrategy(CentralAverage average) : average_(std::move(average)), queue_("simple strategy") {}
  std::string name() const override { return "simple"; }
  std::shared_ptr<comm::Work> average_async(float* data, size_t count) override {
    const uint64_t seq = next_seq_++;
    return queue_.submit("central average #" + std::to_string(seq), [this, seq, data, count] {
      if (aborted_) throw CommError("simple strategy aborted: " + reason_, "central average");
      average_(seq, data, count);
    });
  }
  void abort(const std::string& reason) override {
    reason_ = reason;
    aborted_ = true;
  }

 private:
  CentralAverage average_;
  std::atomic<uint64_t> next_seq_{0};
  std::atomic<bool> aborted_{false};
  std::string reason_;
  comm::OpQueue queue_;  // last: its thread stops before the members it uses go
};

}  // namespace

void Sharing::broadcast_bytes(std::string* bytes, int root) {
  uint64_t n = bytes->size();
  broadcast(&n, sizeof n, root);
  bytes->resize(n);
  if (n > 0) broadcast(bytes->data(), n, root);
}

std::unique_ptr<GradientStrategy> make_allreduce_strategy(std::shared_ptr<comm::HierarchicalGroup> group,
                                                          comm::AllreduceAlgorithm algorithm,
                                                          const CompressionOptions& compression) {
  if (compression.kind != Compression::kNone && algorithm != comm::AllreduceAlgorithm::kAuto) {
    validate({.kind = Strategy::kAllreduce, .allreduce_algo = AllreduceAlgo::kRing, .compression = compression});
  }
  return std::make_unique<AllreduceStrategy>(std::move(group), algorithm, compression);
}

std::unique_ptr<GradientStrategy> make_simple_strategy(CentralAverage central_average) {
  return std::make_unique<SimpleStrategy>(std::move(central_average));
}

namespace {

void require(bool ok, const char* field, const std::string& what) {
  if (!ok) throw ConfigError(what, field);
}

// Whether ps sends gradients across hosts in the workers, which compression can shrink.
bool ps_averages_in_workers(const StrategyOptions& o) {
  return o.kind == Strategy::kPs && !o.ps_update_on_shards && o.ps_placement == PsPlacement::kWorkers;
}

comm::AllreduceAlgorithm comm_algorithm(AllreduceAlgo a) {
  switch (a) {
    case AllreduceAlgo::kAuto: return comm::AllreduceAlgorithm::kAuto;
    case AllreduceAlgo::kRing: return comm::AllreduceAlgorithm::kRing;
    case AllreduceAlgo::kHalvingDoubling: return comm::AllreduceAlgorithm::kHalvingDoubling;
  }
  throw ConfigError("unknown comm.allreduce_algo", "comm.allreduce_algo");
}

}  // namespace

void validate(const StrategyOptions& o) {
  const std::string strategy = Choice<Strategy>(o.kind).name();
  const CompressionOptions& c = o.compression;
  if (c.kind != Compression::kNone) {
    const std::string name = Choice<Compression>(c.kind).name();
    const bool allreduce = o.kind == Strategy::kAllreduce;
    require((allreduce && o.allreduce_algo == AllreduceAlgo::kAuto) || ps_averages_in_workers(o), "comm.compression",
            "compression " + name + " applies to strategy allreduce with comm.allreduce_algo auto (the hierarchy's "
            "across-host stage), and to strategy ps with its shards in the workers, without ps.update_on_shards "
            "(gradients, not parameters, cross hosts); strategy is '" + strategy + "'" +
                (allreduce ? ", comm.allreduce_algo '" +
                                 Choice<AllreduceAlgo>(o.allreduce_algo).name() + "'"
                           : "") +
                (o.kind == Strategy::kPs
                     ? std::string(o.ps_placement == PsPlacement::kProcesses ? ", ps.placement 'processes'" : "") +
                           (o.ps_update_on_shards ? ", ps.update_on_shards" : "")
                     : std::string()));
  }
  PowerSgd::validate({.rank = c.powersgd_rank, .start_steps = c.powersgd_start_steps});
  require(o.num_ps_shards >= 0 && o.num_ps_shards <= 64, "ps.shards",
          "ps.shards must be in 0..64 (0 = one per host), got " + std::to_string(o.num_ps_shards));
  require(o.max_staleness >= -1, "ps.max_staleness",
          "ps.max_staleness must be >= -1 (-1 = unbounded), got " + std::to_string(o.max_staleness));
  require(!o.ps_update_on_shards || o.kind == Strategy::kPs, "ps.update_on_shards",
          "ps.update_on_shards needs strategy ps, got '" + strategy + "'");
  require(o.ps_placement != PsPlacement::kProcesses || o.kind == Strategy::kPs, "ps.placement",
          "ps.placement processes needs strategy ps, got '" + strategy + "'");
}

std::unique_ptr<GradientStrategy> make_strategy(const StrategyOptions& o,
                                                std::shared_ptr<comm::HierarchicalGroup> group) {
  validate(o);
  const Strategy kind = o.kind;
  const Compression compression = o.compression.kind;
  const bool ps_compresses = ps_averages_in_workers(o) && compression != Compression::kNone;
  if (kind == Strategy::kSimple) {
    if (!o.central_average) throw ConfigError("strategy simple needs the driver's central average");
    return make_simple_strategy(o.central_average);
  }
  if (!group) throw ConfigError("strategy " + Choice<Strategy>(kind).name() + " needs a communication group");
  const int shards = o.num_ps_shards > 0 ? o.num_ps_shards : group->num_hosts();
  switch (kind) {
    case Strategy::kAllreduce:
      return make_allreduce_strategy(std::move(group), comm_algorithm(o.allreduce_algo), o.compression);
    case Strategy::kPsAsync:
      return make_ps_async_strategy(std::move(group), shards, o.max_staleness);
    case Strategy::kPs: {
      PsOptions po{.num_shards = shards,
                   .update_on_shards = o.ps_update_on_shards,
                   .shard_processes = o.ps_placement == PsPlacement::kProcesses,
                   .wire = !ps_compresses || compression == Compression::kPowerSgd ? comm::DataType::kFloat32
                           : compression == Compression::kFp16                         ? comm::DataType::kFloat16
                                                                                       : comm::DataType::kBFloat16};
      if (ps_compresses && compression == Compression::kPowerSgd) {
        po.powersgd = std::make_shared<PowerSgd>(PowerSgd::Options{.rank = o.compression.powersgd_rank,
                                                                   .start_steps = o.compression.powersgd_start_steps,
                                                                   .seed = o.compression.seed});
      }
      if (po.shard_processes && group->local().rank() == 0) {
        if (!o.join_ps_servers) throw ConfigError("ps.placement processes needs a way to join the shard processes");
        po.servers = o.join_ps_servers(shards);
      }
      return make_ps_strategy(std::move(group), po);
    }
    case Strategy::kSimple:
      break;
  }
  throw ConfigError("no strategy " + Choice<Strategy>(kind).name());
}

}  // namespace dsgd::strategy
