// ZeRO stages 1 and 2 equal plain allreduce, their checkpoints move between stages and worker
// counts, and a standby takes a killed worker's share.
#include "runtime/trainer_testing.h"

namespace dsgd {
namespace {

using namespace trainer_testing;

TEST(TrainerZero, StagesOneAndTwoEqualPlainAllreduceWithSgdMomentumOnTwoWorkers) {
  expect_zero_equals_plain(base_config(2, "allreduce", 64), dsgd::kImageClassifier, 20);
}

TEST(TrainerZero, StagesOneAndTwoEqualPlainAllreduceWithSgdMomentumOnThreeWorkersOverTwoHosts) {
  auto c = base_config(3, "allreduce", 66);
  c.launch.local_hosts = 2;  // shared memory within a pseudo-host, Gloo between them
  expect_zero_equals_plain(c, dsgd::kImageClassifier, 20);
}

TEST(TrainerZero, StagesOneAndTwoEqualPlainAllreduceWithAdamWClippingAndAccumulation) {
  testing::TempDir dir;
  TrainerConfig c = language_model_job(dir, 800, 20);
  c.step.max_grad_norm = 1.0;
  c.step.accumulate_steps = 2;
  expect_zero_equals_plain(c, kLanguageModel, 20, 1e-6, /*balanced=*/true);
  c.num_workers = 3;
  c.batch_size = 18;
  c.launch.local_hosts = 2;
  expect_zero_equals_plain(c, kLanguageModel, 20, 1e-6, /*balanced=*/true);
  c.step.accumulate_steps = 1;  // stage 2 then sums as plain does: within 1e-6 too
  expect_zero_equals_plain(c, kLanguageModel, 20, 1e-6, /*balanced=*/true);
}

// Any LibTorch optimizer steps its share: a third kind, RMSprop with momentum (its state a square
// average and a momentum buffer a parameter, neither SGD's nor Adam's), on 2 workers and on 3
// over two pseudo-hosts.
TEST(TrainerZero, StagesOneAndTwoEqualPlainAllreduceWithRmsprop) {
  auto c = base_config(2, "allreduce", 64);
  c.config["optimizer"] = "rmsprop";
  c.config["lr"] = 1e-3;
  expect_zero_equals_plain(c, dsgd::kImageClassifier, 20);
  c.num_workers = 3;
  c.batch_size = 66;
  c.launch.local_hosts = 2;
  expect_zero_equals_plain(c, dsgd::kImageClassifier, 20);
}

// A checkpoint holds the whole optimizer state whatever the stage: saved under zero 1 or 2 by 3
// workers it continues identically without zero on 2, and the reverse (the momentum must come
// whole: with only one replica's share the two runs part at once).
TEST(TrainerZero, CheckpointsMoveBetweenStagesAndWorkerCounts) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto zero3 = base_config(3, "allreduce", 60);
    zero3.step.zero_stage = stage;
    zero3.comm.grad_shard_bytes = 64 << 10;  // stage 2's ring turns over
    expect_checkpoint_moves(zero3, base_config(2, "allreduce", 60));
    expect_checkpoint_moves(base_config(2, "allreduce", 60), zero3);
  }
}

// Under zero 1 and 2 a snapshot holds every replica's share of the optimizer state: the standby
// takes the lost share from it (and, at stage 2, the place in the ring of a replica whose
// gradients it must not keep).
TEST(TrainerZero, AStandbyTakesAKilledWorkersShareAndTheResultEqualsAFaultFreeRun) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto c = base_config(3, "allreduce", 66);
    c.launch.local_hosts = 2;
    c.recovery.standby_workers = 1;
    c.step.zero_stage = stage;
    c.comm.grad_shard_bytes = 64 << 10;
    auto r = train_through_fault(c, SIGKILL);
    ASSERT_EQ(r.recoveries.size(), 1u);
    EXPECT_EQ(r.recoveries[0].standbys_used, 1);
  }
}

}  // namespace
}  // namespace dsgd
