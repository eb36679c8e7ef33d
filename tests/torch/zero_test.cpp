// ZeRO's optimizer side (torch/sync/zero.h) over a real group (3 ranks as threads on two
// pseudo-hosts): optimizers stepping their pieces (flat slices of the buckets, strategy::
// ShardLayout) step each element as the whole optimizer does, AdamW and SGD with momentum alike;
// the state gathered whole on one replica is the whole optimizer's, bit for bit; and sliced again
// it is each replica's share only.
#include "torch/sync/zero.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>

#include "dsgd/comm/hierarchical.h"
#include "dsgd/comm/store.h"
#include "strategy/bucket_plan.h"
#include "testing/ranks.h"
#include "testing/state_tensors.h"
#include "torch/state/optimizer_state.h"
#include "torch/state/replica_state.h"
#include "torch/sync/grad_sync.h"
#include "torch/sync/shard_buffer.h"

namespace dsgd::torch_glue {
namespace {

using std::chrono::milliseconds;

// A wide layer under AdamW (weight decay) and a small one under SGD with momentum.
class ZeroNet : public TrainingOperator {
 public:
  void setup(const nlohmann::json&) override {
    wide = register_model(torch::nn::Linear(64, 96));
    small = register_model(torch::nn::Linear(96, 5));
    register_optimizer(
        std::make_unique<torch::optim::AdamW>(wide->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1)));
    register_optimizer(
        std::make_unique<torch::optim::SGD>(small->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)));
  }
  torch::Tensor loss(const torch::Tensor& x) { return small(torch::relu(wide(x))).pow(2).mean(); }
  torch::nn::Linear wide{nullptr}, small{nullptr};
};

// Each model's parameters (as GradSync takes them) with their gradients of `x`.
std::vector<std::vector<torch::Tensor>> zero_grads_of(ZeroNet& net, const torch::Tensor& x) {
  for (auto& m : net.models()) {
    for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
  }
  net.loss(x).backward();
  std::vector<std::vector<torch::Tensor>> out;
  for (auto& m : net.models()) {
    out.emplace_back();
    for (auto& p : m->parameters()) out.back().push_back(p.grad().clone());
  }
  return out;
}

TEST(ZeroPieces, StepAsTheWholeOptimizerAndGatherItsStateBitForBit) {
  constexpr int kRanks = 3;
  auto store = comm::make_memory_store();
  std::mutex mutex;
  std::map<int, torch::Tensor> gathered;
  std::map<int, int64_t> share_bytes;
  torch::Tensor reference;
  int64_t whole_bytes = 0;
  testing::run_ranks(kRanks, [&](int rank) {
    comm::GroupOptions go;
    go.timeout = milliseconds(20000);
    go.host = rank < 2 ? "host0" : "host1";
    auto group = std::shared_ptr<comm::HierarchicalGroup>(
        comm::HierarchicalGroup::create(store, rank, kRanks, go, comm::ShmOptions{}));
    std::shared_ptr<strategy::GradientStrategy> strategy = strategy::make_allreduce_strategy(group);
    ZeroNet net, plain;
    net.setup({});
    plain.setup({});
    auto gen = at::detail::createCPUGenerator(5);  // the same weights and batches on every rank
    {
      torch::NoGradGuard no_grad;
      for (auto* n : {&net, &plain}) {
        auto g = at::detail::createCPUGenerator(1);
        for (auto& m : n->models()) {
          for (auto& p : m->parameters()) p.copy_(torch::randn(p.sizes(), g));
        }
      }
    }
    // Each model's pieces on this rank, as GradSync lays them out (256-byte buckets).
    Pieces pieces;
    std::vector<strategy::ShardLayout> layouts;
    std::vector<strategy::BucketPlan> plans;
    for (auto& m : net.models()) {
      std::vector<size_t> counts;
      for (auto& p : m->parameters()) counts.push_back(static_cast<size_t>(p.numel()));
      plans.emplace_back(counts, sizeof(float), 256);
    }
    for (size_t m = 0; m < plans.size(); ++m) {
      layouts.emplace_back(plans[m], kRanks, rank);
      const auto params = net.models()[m]->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& p = layouts[m].piece(i);
        pieces[params[i].unsafeGetTensorImpl()] = {
            p.count > 0 ? memory_view(params[i], p.begin, p.count) : torch::Tensor(), p.begin, p.count};
      }
    }
    const auto whole = optimizer_params(net);
    // The estimate a worker reports at its set-up, before any step (the optimizers whole).
    const auto need1 = memory_need(net, 256, 1, kRanks);
    check_shardable(net, pieces);
    to_pieces(net, pieces, whole);
    for (int step = 0; step < 4; ++step) {
      const auto x = torch::randn({8, 64}, gen);
      // Plain: every element stepped by the whole optimizers.
      zero_grads_of(plain, x);
      for (size_t k = 0; k < plain.num_optimizers(); ++k) plain.optimizer(k).step();
      // Sharded: each piece given its part of the same gradient, its optimizers step the pieces
      // alone, then every rank's pieces summed into every rank (an allgather's effect).
      const auto grads = zero_grads_of(net, x);
      for (size_t m = 0; m < grads.size(); ++m) {
        const auto params = net.models()[m]->parameters();
        for (size_t i = 0; i < params.size(); ++i) {
          params[i].mutable_grad() = torch::Tensor();
          const auto& piece = pieces.at(params[i].unsafeGetTensorImpl());
          if (piece.count > 0) piece.view.mutable_grad() = memory_view(grads[m][i], piece.begin, piece.count).clone();
        }
      }
      for (size_t k = 0; k < net.num_optimizers(); ++k) net.optimizer(k).step();
      torch::NoGradGuard no_grad;
      for (auto& m : net.models()) {
        for (auto& p : m->parameters()) {
          auto mine = torch::zeros_like(p);
          const auto& piece = pieces.at(p.unsafeGetTensorImpl());
          if (piece.count > 0) memory_view(mine, piece.begin, piece.count).copy_(piece.view);
          group->allreduce(mine.data_ptr<float>(), static_cast<size_t>(mine.numel()), comm::DataType::kFloat32,
                           comm::ReduceOp::kSum);
          p.copy_(mine);
        }
      }
    }
    const int64_t mine_bytes = optimizer_state_bytes(net);
    // The estimate against what is held: the state (this replica's blocks hold a third of the
    // elements to within 2 elements of padding in each of the 4 buckets, at 8 bytes an element
    // at most), and the GradSyncs' buffers (each model's estimate rounded up to 64 bytes).
    EXPECT_NEAR(static_cast<double>(need1.optimizer_state), static_cast<double>(mine_bytes), 4 * 2 * 8.0);
    EXPECT_EQ(memory_need(plain, 256, 0, kRanks).optimizer_state, optimizer_state_bytes(plain));
    for (int stage : {1, 2}) {
      std::vector<std::unique_ptr<GradSync>> syncs;
      size_t bytes = 0;
      for (auto& m : net.models()) {
        syncs.push_back(
            std::make_unique<GradSync>(m->parameters(), 256, strategy, true, 0, stage == 2 ? kRingBuckets : 0, kRanks));
        bytes += syncs.back()->gradient_bytes();
      }
      const auto need = memory_need(net, 256, stage, kRanks);
      EXPECT_NEAR(static_cast<double>(need.gradients), static_cast<double>(bytes), 64.0 * 2) << "stage " << stage;
    }
    gather_whole(net, pieces, whole, *strategy->sharing(), /*keep=*/rank == 1);
    std::lock_guard<std::mutex> lock(mutex);
    share_bytes[rank] = mine_bytes;
    if (rank == 1) {
      gathered[rank] = testing::state_tensors(net);
      reference = testing::state_tensors(plain);
      whole_bytes = optimizer_state_bytes(plain);
      to_pieces(net, pieces, whole);  // sliced again: the share it held
      EXPECT_EQ(optimizer_state_bytes(net), mine_bytes);
    } else {
      EXPECT_EQ(optimizer_state_bytes(net), mine_bytes) << "a replica that does not keep holds its pieces";
    }
  });
  ASSERT_TRUE(reference.defined());
  EXPECT_TRUE(torch::equal(gathered.at(1), reference))
      << "max difference " << (gathered.at(1) - reference).abs().max().item<double>();
  int64_t total = 0;
  for (const auto& [rank, bytes] : share_bytes) {
    total += bytes;
    EXPECT_LT(bytes, whole_bytes / kRanks * 1.2) << "rank " << rank << "'s state is not a share";
  }
  // The moments and momentum split exactly; AdamW's step count is a number in every piece's state.
  EXPECT_EQ(total, whole_bytes);
}

}  // namespace
}  // namespace dsgd::torch_glue
