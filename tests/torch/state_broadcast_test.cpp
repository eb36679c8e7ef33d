// broadcast_replica_state over a real group (ranks as threads on two pseudo-hosts, the
// allreduce strategy's Sharing): a receiver ends with root's parameters, buffers and optimizer
// state bit for bit (so its next step is root's), a replica that only takes part keeps its own,
// and an optimizer of a kind not known here goes as the archive, with the same result.
#include "torch/state/broadcast.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <set>

#include "dsgd/comm/hierarchical.h"
#include "dsgd/comm/store.h"
#include "testing/ranks.h"
#include "testing/state_tensors.h"
#include "torch/state/optimizer_state.h"

namespace dsgd::torch_glue {
namespace {

using std::chrono::milliseconds;

// An optimizer of a user's own, with a state kind of its own: p -= lr * mean of its gradients so far.
struct SummingParamState : torch::optim::OptimizerCloneableParamState<SummingParamState> {
  TORCH_ARG(int64_t, steps) = 0;
  TORCH_ARG(torch::Tensor, sum);

 public:
  void serialize(torch::serialize::OutputArchive& archive) const override {
    archive.write("steps", torch::tensor(steps()));
    archive.write("sum", sum());
  }
  void serialize(torch::serialize::InputArchive& archive) override {
    torch::Tensor t;
    archive.read("steps", t);
    steps(t.item<int64_t>());
    archive.read("sum", sum_);
  }
};

class Summing : public torch::optim::Optimizer {
 public:
  explicit Summing(std::vector<torch::Tensor> params)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                  std::make_unique<torch::optim::SGDOptions>(0.5)) {}
  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss = closure ? closure() : torch::Tensor();
    for (auto& p : param_groups()[0].params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state()[optimizer_state_key(*this, p)];
      if (!slot) {
        auto s = std::make_unique<SummingParamState>();
        s->sum(torch::zeros_like(p));
        slot = std::move(s);
      }
      auto& s = static_cast<SummingParamState&>(*slot);
      s.sum().add_(p.grad());
      s.steps(s.steps() + 1);
      p.sub_(s.sum() * (0.5 / static_cast<double>(s.steps())));
    }
    return loss;
  }
  void save(torch::serialize::OutputArchive& archive) const override {
    torch::optim::serialize<SummingParamState, torch::optim::SGDOptions>(archive, *this);
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<SummingParamState, torch::optim::SGDOptions>(archive, *this);
  }
};

// Two models: a wide one under AdamW (a 2 MB weight that travels on its own; amsgrad off, so one
// of its state tensors is absent) and one with BatchNorm buffers under SGD with momentum; or,
// with `own`, one model under Summing (a state kind broadcast_replica_state does not know).
class Net : public TrainingOperator {
 public:
  explicit Net(bool own = false, int64_t width = 1024) : own_(own), width_(width) {}
  void setup(const nlohmann::json&) override {
    wide = register_model(torch::nn::Linear(512, width_));
    if (own_) {
      register_optimizer(std::make_unique<Summing>(wide->parameters()));
      return;
    }
    norm = register_model(torch::nn::Sequential(torch::nn::Linear(width_, 8), torch::nn::BatchNorm1d(8)));
    register_optimizer(
        std::make_unique<torch::optim::AdamW>(wide->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.1)));
    register_optimizer(std::make_unique<torch::optim::SGD>(norm->parameters(),
                                                           torch::optim::SGDOptions(0.1).momentum(0.9)));
  }
  torch::Tensor loss(const torch::Tensor& x) {
    if (own_) return wide(x).pow(2).mean();
    return norm->forward(torch::relu(wide(x))).pow(2).mean();
  }
  void step(const torch::Tensor& x) {
    for (size_t k = 0; k < num_optimizers(); ++k) optimizer(k).zero_grad();
    loss(x).backward();
    for (size_t k = 0; k < num_optimizers(); ++k) optimizer(k).step();
  }
  torch::nn::Linear wide{nullptr};
  torch::nn::Sequential norm{nullptr};

 private:
  bool own_;
  int64_t width_;
};

// Every parameter, buffer and optimizer-state tensor (testing/state_tensors.h), Summing's too;
// AdamW's amsgrad is off, so one of its state tensors is absent.
torch::Tensor everything(Net& net) {
  return testing::state_tensors(net, [](const torch::optim::OptimizerParamState& state,
                                        std::vector<torch::Tensor>* parts) {
    const auto* o = dynamic_cast<const SummingParamState*>(&state);
    ASSERT_NE(o, nullptr) << "a state of an unknown kind";
    parts->push_back(torch::tensor({static_cast<double>(o->steps())}, torch::kFloat64));
    parts->push_back(o->sum().flatten().to(torch::kFloat64));
  });
}

struct Seen {
  std::mutex mutex;
  std::map<int, torch::Tensor> before, after, stepped;
  std::map<int, ReplicaState> state;
  std::map<int, size_t> bytes;
};

// Ranks 0 and 1 on host0, 2 on host1; root 1 (not its host's leader) has trained 3 steps, the
// others 1 from other weights. Rank 2 loads, rank 0 only takes part. Then every rank steps once
// on the same batch.
void run(bool own, Seen* seen, int64_t receivers_width = 1024) {
  auto store = comm::make_memory_store();
  testing::run_ranks(3, [&](int rank) {
    comm::GroupOptions go;
    go.timeout = milliseconds(20000);
    go.host = rank < 2 ? "host0" : "host1";
    comm::ShmOptions so;
    so.slot_bytes = 256 << 10;  // a weight in several pieces
    auto group = std::shared_ptr<comm::HierarchicalGroup>(comm::HierarchicalGroup::create(store, rank, 3, go, so));
    auto strategy = strategy::make_allreduce_strategy(group);
    Net net(own, rank == 2 ? receivers_width : 1024);
    net.setup({});
    auto gen = at::detail::createCPUGenerator(100 + rank);  // the threads share the global one
    {
      torch::NoGradGuard no_grad;
      for (auto& [name, t] : named_tensors(net)) {
        if (t.is_floating_point()) t.copy_(torch::randn(t.sizes(), gen));
      }
    }
    for (int s = 0; s < (rank == 1 ? 3 : 1); ++s) net.step(torch::randn({16, 512}, gen));
    const auto before = everything(net);
    const ReplicaState mine{{rank, 10 * rank}, 7 * rank};
    // The receiver, a fresh standby: no optimizer state, its tensors made ahead instead.
    SpareTensors spares;
    std::set<const void*> made;
    if (rank == 2) {
      for (size_t k = 0; k < net.num_optimizers(); ++k) net.optimizer(k).state().clear();
      spares = make_spare_state(net);
      for (const auto& [key, t] : spares) made.insert(t.data_ptr());
    }
    const auto shared =
        broadcast_replica_state(net, mine, *strategy->sharing(), /*root=*/1, /*load=*/rank == 2, &spares);
    const auto after = everything(net);
    if (rank == 2 && !own) {
      // AdamW's two moments per wide parameter and SGD's momentum per norm parameter: each taken.
      EXPECT_EQ(made.size(), 2 * 2 + 4u);
      EXPECT_TRUE(spares.empty()) << spares.size() << " spare tensors left";
      for (size_t k = 0; k < net.num_optimizers(); ++k) {
        for (const auto& [key, state] : net.optimizer(k).state()) {
          const auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(state.get());
          const auto* m = dynamic_cast<const torch::optim::SGDParamState*>(state.get());
          const auto t = a != nullptr ? a->exp_avg() : m->momentum_buffer();
          EXPECT_EQ(made.count(t.data_ptr()), 1u) << "a state tensor was allocated, not taken from the spares";
        }
      }
    }
    auto same = at::detail::createCPUGenerator(7);
    net.step(torch::randn({16, 512}, same));
    std::lock_guard<std::mutex> lock(seen->mutex);
    seen->before[rank] = before;
    seen->after[rank] = after;
    seen->stepped[rank] = everything(net);
    seen->state[rank] = shared.state;
    seen->bytes[rank] = shared.bytes;
    EXPECT_EQ(shared.archive, own) << "rank " << rank;
  });
}

TEST(StateBroadcast, AReceiverHoldsRootsStateBitForBitAndOthersKeepTheirs) {
  Seen seen;
  run(false, &seen);
  EXPECT_FALSE(torch::equal(seen.before[2], seen.before[1]));
  EXPECT_TRUE(torch::equal(seen.after[2], seen.before[1])) << "the receiver's state is not root's";
  EXPECT_TRUE(torch::equal(seen.after[1], seen.before[1])) << "root's state changed";
  EXPECT_TRUE(torch::equal(seen.after[0], seen.before[0])) << "a replica that did not load changed";
  EXPECT_TRUE(torch::equal(seen.stepped[2], seen.stepped[1])) << "the next step differs (the state is incomplete)";
  EXPECT_EQ(seen.state[2].position.epoch, 1);  // root's
  EXPECT_EQ(seen.state[2].position.batch, 10);
  EXPECT_EQ(seen.state[2].schedule_t, 7);
  EXPECT_EQ(seen.state[0].position.epoch, 0);  // its own
  // Parameters and buffers, AdamW's two moments and SGD's momentum: every tensor once.
  EXPECT_GT(seen.bytes[2], (512 * 1024 + 1024) * 3 * 4);
  EXPECT_EQ(seen.bytes[2], seen.bytes[0]);
}

// A receiver whose models differ (another width) takes part with root's sizes, so nobody waits
// for it, and then throws, naming why; the replica that only takes part is not held up.
TEST(StateBroadcast, AReceiverWithOtherModelsThrowsAndNobodyWaits) {
  Seen seen;
  try {
    run(false, &seen, /*receivers_width=*/1000);
    ADD_FAILURE() << "a receiver loaded another model's state";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("different models"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(seen.after[0], seen.before[0]));
  EXPECT_TRUE(torch::equal(seen.after[1], seen.before[1]));
}

TEST(StateBroadcast, AnOptimizerOfAnotherKindGoesAsTheArchive) {
  Seen seen;
  run(true, &seen);
  EXPECT_FALSE(torch::equal(seen.before[2], seen.before[1]));
  EXPECT_TRUE(torch::equal(seen.after[2], seen.before[1]));
  EXPECT_TRUE(torch::equal(seen.after[0], seen.before[0]));
  EXPECT_TRUE(torch::equal(seen.stepped[2], seen.stepped[1]));
  EXPECT_EQ(seen.state[2].schedule_t, 7);
}

}  // namespace
}  // namespace dsgd::torch_glue
