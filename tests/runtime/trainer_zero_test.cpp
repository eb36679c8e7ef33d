// ZeRO stages 1, 2 and 3 equal plain allreduce, their checkpoints move between stages and worker
// counts, and a standby takes a killed worker's share.
#include <torch/serialize.h>

#include "runtime/trainer_testing.h"

namespace dsgd {
namespace {

using namespace trainer_testing;

TEST(TrainerZero, StagesOneToThreeEqualPlainAllreduceWithSgdMomentumOnTwoWorkers) {
  expect_zero_equals_plain(base_config(2, "allreduce", 64), dsgd::kImageClassifier, 20);
}

TEST(TrainerZero, StagesOneToThreeEqualPlainAllreduceWithSgdMomentumOnThreeWorkersOverTwoHosts) {
  auto c = base_config(3, "allreduce", 66);
  c.launch.local_hosts = 2;  // shared memory within a pseudo-host, Gloo between them
  expect_zero_equals_plain(c, dsgd::kImageClassifier, 20);
}

TEST(TrainerZero, StagesOneToThreeEqualPlainAllreduceWithAdamWClippingAndAccumulation) {
  testing::TempDir dir;
  TrainerConfig c = language_model_job(dir, 800, 20);
  c.step.max_grad_norm = 1.0;
  c.step.accumulate_steps = 2;
  // 1.1e-6 at every stage on 2 workers on an AMD EPYC (AVX2, 2026-12-07), alike at stages 1 to 3:
  // AdamW's elementwise kernels round a flat piece's elements otherwise than its parameters'.
  expect_zero_equals_plain(c, kLanguageModel, 20, 1.5e-6, /*balanced=*/true);
  c.num_workers = 3;
  c.batch_size = 18;
  c.launch.local_hosts = 2;
  expect_zero_equals_plain(c, kLanguageModel, 20, 1e-6, /*balanced=*/true);
  c.step.accumulate_steps = 1;  // stage 2 then sums as plain does: within 1e-6 too
  expect_zero_equals_plain(c, kLanguageModel, 20, 1e-6, /*balanced=*/true);
}

// Activation checkpointing (step.activation_checkpointing) recomputes each GPT block in backward,
// its dropout replayed: the same parameters as without it, bit for bit, plainly and at stage 3
// (whose gathers then also serve the recompute), on 2 workers. Fails if the recompute draws other
// dropout masks, if a block's parameters miss a gradient or get two, or if stage 3 recomputes a
// block it has released.
TEST(TrainerZero, ActivationCheckpointingChangesNoParameterPlainlyOrAtStageThree) {
  testing::TempDir dir;
  TrainerConfig c = language_model_job(dir, 800, 20);
  c.config["dropout"] = 0.1;
  c.comm.grad_shard_bytes = 64 << 10;
  const auto run = [&](int stage, bool checkpointing) {
    c.step.zero_stage = stage;
    c.step.activation_checkpointing = checkpointing;
    Trainer t(kLanguageModel, c);
    const auto r = t.train({.num_steps = 10});
    EXPECT_EQ(r.batch, 10);
    // gpt-tiny's 4 blocks checkpointed each step, or none
    EXPECT_EQ(r.metrics.count("checkpointed_units") ? r.metrics.at("checkpointed_units") : 0.0, checkpointing ? 4 : 0);
    return params_of(*t.get_model());
  };
  const auto plain = run(0, false);
  EXPECT_EQ(max_difference(plain, run(0, true)), 0.0);
  const auto stage3 = run(3, false);
  EXPECT_EQ(max_difference(stage3, run(3, true)), 0.0);
  EXPECT_LT(max_difference(plain, stage3), 1e-6);
}

// Stage 3 under bf16 autocast, with activation checkpointing: the gathered weights are cast as
// plain ones are, so the parameters equal stage 2's under bf16 bit for bit (gpt-tiny, 2 workers).
TEST(TrainerZero, StageThreeUnderBf16EqualsStageTwo) {
  testing::TempDir dir;
  TrainerConfig c = language_model_job(dir, 800, 20);
  c.step.precision = Precision::kBf16;
  c.comm.grad_shard_bytes = 64 << 10;
  const auto run = [&](int stage, bool checkpointing) {
    c.step.zero_stage = stage;
    c.step.activation_checkpointing = checkpointing;
    Trainer t(kLanguageModel, c);
    EXPECT_EQ(t.train({.num_steps = 10}).batch, 10);
    return params_of(*t.get_model());
  };
  const auto stage2 = run(2, false);
  EXPECT_EQ(max_difference(stage2, run(3, false)), 0.0);
  EXPECT_EQ(max_difference(stage2, run(3, true)), 0.0);
  c.step.precision = Precision::kFp32;  // (bf16 is on: float32 ends elsewhere)
  EXPECT_GT(max_difference(stage2, run(2, false)), 1e-6);
}

// Any LibTorch optimizer steps its share: a third kind, RMSprop with momentum (its state a square
// average and a momentum buffer a parameter, neither SGD's nor Adam's), on 2 workers and on 3
// over two pseudo-hosts.
TEST(TrainerZero, StagesOneToThreeEqualPlainAllreduceWithRmsprop) {
  auto c = base_config(2, "allreduce", 64);
  c.config["optimizer"] = "rmsprop";
  c.config["lr"] = 1e-3;
  expect_zero_equals_plain(c, dsgd::kImageClassifier, 20);
  c.num_workers = 3;
  c.batch_size = 66;
  c.launch.local_hosts = 2;
  expect_zero_equals_plain(c, dsgd::kImageClassifier, 20);
}

// A checkpoint holds the whole optimizer state whatever the stage: saved under zero 1, 2 or 3 by 3
// workers it continues identically without zero on 2, and the reverse (the momentum must come
// whole: with only one replica's share the two runs part at once).
TEST(TrainerZero, CheckpointsMoveBetweenStagesAndWorkerCounts) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto zero3 = base_config(3, "allreduce", 60);
    zero3.step.zero_stage = stage;
    zero3.comm.grad_shard_bytes = 64 << 10;  // stage 2's ring turns over
    expect_checkpoint_moves(zero3, base_config(2, "allreduce", 60));
    expect_checkpoint_moves(base_config(2, "allreduce", 60), zero3);
  }
}

// Under zero 1 to 3 a snapshot holds every replica's share of the optimizer state (and at stage
// 3 of the parameters): the standby takes the lost share from it (and, at stages 2 and 3, the
// place in the ring of a replica whose gradients it must not keep).
TEST(TrainerZero, AStandbyTakesAKilledWorkersShareAndTheResultEqualsAFaultFreeRun) {
  for (int stage : {1, 2, 3}) {
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

// Stage 3's model.pt (the pickle Python reads) and get_model are the whole model, gathered from
// every replica's shard: equal to plain allreduce's after the same steps. Without the gather the
// pickle would hold the released parameters' empty memory (or one replica's block).
TEST(TrainerZero, StageThreeSavesTheWholeModelForPython) {
  testing::TempDir dir;
  auto c = base_config(2, "allreduce", 64);
  c.comm.grad_shard_bytes = 64 << 10;
  Trainer plain(dsgd::kImageClassifier, c);
  plain.train({.num_steps = 6});
  c.step.zero_stage = 3;
  Trainer t(dsgd::kImageClassifier, c);
  t.train({.num_steps = 6});
  t.save(dir.file("ckpt"));
  std::ifstream in(dir.file("ckpt") + "/model.pt", std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto dict = torch::pickle_load(bytes).toGenericDict();
  const auto expected = plain.get_model()->named_parameters();
  ASSERT_GT(expected.size(), 0u);
  for (const auto& p : expected) {
    ASSERT_TRUE(dict.contains(p.key())) << p.key();
    EXPECT_TRUE(torch::equal(dict.at(p.key()).toTensor(), p.value())) << p.key();
  }
  EXPECT_EQ(max_difference(params_of(*t.get_model()), params_of(*plain.get_model())), 0.0);
  t.train({.num_steps = 2});  // sharded again after the save: training goes on
}

// Stage 3 gathers a layer when forward names it (dsgd::wait_for_parameters). The regression
// operator's Linear never does: its first step fails with a ConfigError that says what to do,
// not with a read of released memory a step later.
TEST(TrainerZero, StageThreeRefusesAForwardThatDoesNotNameItsLayers) {
  auto c = base_config(2, "allreduce", 64);
  c.step.zero_stage = 3;
  try {
    Trainer t("AdamOperator", c);
    t.train({.num_steps = 2});
    FAIL() << "a model whose forward names no layer trained under stage 3";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("forward never named it: call wait_for_parameters"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dsgd
