#include "strategy/strategy.h"

#include <atomic>

#include "comm/op_queue.h"
#include "dsgd/error.h"

namespace dsgd::strategy {

std::shared_ptr<comm::Work> GradientStrategy::update_async(const ShardUpdate&, bool*) {
  throw Error("strategy '" + name() + "' averages gradients; it does not update parameters on servers");
}

std::shared_ptr<comm::Work> GradientStrategy::gather_state_async(uint64_t, float*, float*, size_t, bool*) {
  throw Error("strategy '" + name() + "' keeps no optimizer state on servers");
}

namespace {

class AllreduceStrategy final : public GradientStrategy {
 public:
  AllreduceStrategy(std::shared_ptr<comm::HierarchicalGroup> group, const std::string& algorithm)
      : group_(std::move(group)), algorithm_(comm::parse_allreduce_algorithm(algorithm)) {}
  std::string name() const override { return "allreduce"; }
  std::shared_ptr<comm::Work> average_async(float* data, size_t count) override {
    if (algorithm_ == comm::AllreduceAlgorithm::kAuto) {
      return group_->allreduce_async(data, count, comm::DataType::kFloat32, comm::ReduceOp::kAverage);
    }
    return group_->global().allreduce_async(data, count, comm::DataType::kFloat32, comm::ReduceOp::kAverage,
                                            algorithm_);
  }
  float* gradient_buffer(size_t count) override {  // the shared-memory stage then copies nothing in
    if (algorithm_ != comm::AllreduceAlgorithm::kAuto) return nullptr;
    return static_cast<float*>(group_->take_shared(count * sizeof(float)));
  }
  void abort(const std::string& reason) override {
    group_->abort(reason);
  }

 private:
  std::shared_ptr<comm::HierarchicalGroup> group_;
  const comm::AllreduceAlgorithm algorithm_;  // kAuto: the hierarchy; else one flat Gloo allreduce
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

std::unique_ptr<GradientStrategy> make_allreduce_strategy(std::shared_ptr<comm::HierarchicalGroup> group,
                                                          const std::string& algorithm) {
  return std::make_unique<AllreduceStrategy>(std::move(group), algorithm);
}

std::unique_ptr<GradientStrategy> make_simple_strategy(CentralAverage central_average) {
  return std::make_unique<SimpleStrategy>(std::move(central_average));
}

}  // namespace dsgd::strategy
