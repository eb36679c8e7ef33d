// Bad input fails before anything is spawned, naming its field; non-finite losses and loss
// scaling skip a step on every replica alike.
#include "runtime/trainer_testing.h"

namespace dsgd {
namespace {

using namespace trainer_testing;

TEST(TrainerBadInput, ClearErrorsBeforeAnyProcessIsSpawned) {
  auto c = base_config(2, "allreduce", 64);
  auto bad = c;
  bad.strategy = "parameter-magic";
  expect_config_error(dsgd::kImageClassifier, bad, "unknown strategy 'parameter-magic'");
  bad = c;
  bad.num_workers = 0;
  expect_config_error(dsgd::kImageClassifier, bad, "num_workers must be in 1..4096, got 0");
  bad = c;
  bad.comm.grad_shard_bytes = -5;
  expect_config_error(dsgd::kImageClassifier, bad, "grad_shard_bytes must be > 0, got -5");
  bad = c;
  bad.batch_size = 1;
  expect_config_error(dsgd::kImageClassifier, bad, "at least the number of replicas (2)");
  bad = c;
  bad.initialization_hook = "missing_hook";
  expect_config_error(dsgd::kImageClassifier, bad, "missing_hook");
  expect_config_error("NoSuchOperator", c, "unknown operator 'NoSuchOperator'");
  bad = c;
  bad.ps.update_on_shards = true;
  expect_config_error(dsgd::kImageClassifier, bad, "ps.update_on_shards needs strategy ps, got 'allreduce'");
  bad = c;
  bad.ps.placement = "elsewhere";
  expect_config_error(dsgd::kImageClassifier, bad, "unknown ps.placement 'elsewhere'; use workers or processes");
  bad = c;
  bad.ps.placement = "processes";
  expect_config_error(dsgd::kImageClassifier, bad, "ps.placement processes needs strategy ps, got 'allreduce'");
  bad.strategy = "ps";
  bad.launch.listen = "127.0.0.1:0";
  expect_config_error(dsgd::kImageClassifier, bad, "ps.placement processes in remote mode needs ps.shards > 0");
  bad = c;
  bad.comm.forward_overlap_buckets = -2;
  expect_config_error(dsgd::kImageClassifier, bad,
                      "forward_overlap_buckets must be >= 0 (0 = off) or -1 (auto), got -2");
  bad.comm.forward_overlap_buckets = 2;
  bad.strategy = "ps_async";
  expect_config_error(dsgd::kImageClassifier, bad, "forward_overlap_buckets needs averaged gradients");
  bad.comm.forward_overlap_buckets = -1;  // auto as well
  expect_config_error(dsgd::kImageClassifier, bad, "forward_overlap_buckets needs averaged gradients");
  bad = c;
  bad.device = "tpu";
  expect_config_error(dsgd::kImageClassifier, bad, "unknown device 'tpu'; use auto, cpu or cuda");
  bad = c;
  bad.step.precision = "fp8";
  expect_config_error(dsgd::kImageClassifier, bad, "unknown step.precision 'fp8'; use fp32, bf16 or fp16");
  bad = c;
  bad.device = "cuda";
  bad.comm.forward_overlap_buckets = 2;
  expect_config_error(dsgd::kImageClassifier, bad, "forward_overlap_buckets is CPU-only");
  bad.comm.forward_overlap_buckets = 0;
  bad.strategy = "ps_async";
  expect_config_error(dsgd::kImageClassifier, bad, "device cuda takes the strategies simple, allreduce and ps");
}

// Where LibTorch sees no GPU (Debian's LibTorch has no CUDA), device cuda fails at the workers'
// setup with what to do, not later in training.
// Memory known before it runs out: workers whose estimate (parameters, gradients, optimizer
// state) exceeds launch.memory_mib stop after their set-up, before any step, with the figures
// (what they say: MemoryCheck.*).
TEST(TrainerBadInput, WorkersThatWouldHoldMoreThanTheMemoryGivenStopBeforeTheirFirstStep) {
  auto c = base_config(2, "allreduce", 64);
  c.launch.memory_mib = 1;  // the CNN's 2 x 4.8 MB of weights alone exceed it
  try {
    Trainer t(dsgd::kImageClassifier, c);
    t.train({.num_steps = 1});
    FAIL() << "accepted a job larger than launch.memory_mib";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "launch.memory_mib") << e.what();
    EXPECT_NE(std::string(e.what()).find("2 worker(s) on this machine will hold"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("than the 1.0 MiB available"), std::string::npos) << e.what();
  }
  c.launch.memory_mib = 1024;
  Trainer t(dsgd::kImageClassifier, c);
  EXPECT_EQ(t.train({.num_steps = 2}).batch, 2);
}

TEST(TrainerBadInput, Fp16OnTheCpuOrLossScalingWhereTheServersStepSaysWhatToUse) {
  auto expect_error = [](TrainerConfig c, const std::string& says) {
    try {
      Trainer t(dsgd::kImageClassifier, c);
      FAIL() << "accepted; expected: " << says;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  auto c = base_config(1, "allreduce", 64);
  c.step.precision = "fp16";
  c.device = "cpu";
  expect_error(c, "precision fp16 needs CUDA");  // before any process starts
  if (!torch::cuda::is_available()) {
    c.device = "auto";  // resolved to the CPU by the worker
    expect_error(c, "Use precision bf16 on the CPU");
  }
  c = base_config(2, "ps", 64);
  c.ps.update_on_shards = true;
  c.step.loss_scale = 256;
  expect_error(c, "loss scaling needs the optimizer step in the replicas");
  c = base_config(1, "allreduce", 64);
  c.step.loss_scale = 1000;
  expect_error(c, "loss_scale must be a power of two");
}

TEST(TrainerBadInput, DeviceCudaWithoutAGpuSaysWhatToDo) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has a GPU";
  auto c = base_config(1, "allreduce", 64);
  c.device = "cuda";
  try {
    Trainer t(dsgd::kImageClassifier, c);
    FAIL() << "device cuda accepted without a GPU";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("sees no CUDA device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("use device cpu or auto"), std::string::npos) << e.what();
  }
}

TEST(TrainerBadInput, UpdateOnShardsWithAnOptimizerOtherThanSgdSaysWhatItNeeds) {
  auto c = ps_update_config(2, 2, 2);
  try {
    Trainer t("AdamOperator", c);
    FAIL() << "the shards accepted an Adam model they cannot update";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("must all be in one param group of a torch::optim::SGD"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("its optimizer is another kind"), std::string::npos) << e.what();
  }
}

// The image classifier registers its config check: a bad key is refused by the driver before
// any process starts. An operator without one refuses it in setup(), and the error names the worker.
TEST(TrainerBadInput, OperatorConfigErrorsComeFromItsCheckOrFromAWorkerNamed) {
  auto c = base_config(2, "allreduce", 64);
  c.config["modle"] = "cnn";
  expect_config_error(dsgd::kImageClassifier, c, "unknown image classifier config key 'modle'");
  EXPECT_THROW(validate_config(dsgd::kImageClassifier, c), ConfigError);
  EXPECT_NO_THROW(validate_config(operator_of<PickyOperator>(), c));  // no check registered
  try {
    Trainer t(operator_of<PickyOperator>(), c);
    FAIL() << "accepted a misspelt config key";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown picky config key 'modle'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("worker "), std::string::npos) << e.what();
  }
}

// Each rule's ConfigError names the TrainerConfig field at fault, wherever the rule lives (the
// Trainer, the strategy, the launcher, loss scaling), so a front end can name its own flag.
TEST(TrainerBadInput, EveryConfigErrorNamesItsField) {
  const auto c = base_config(2, "allreduce", 64);
  const auto field_of = [](const TrainerConfig& bad) -> std::string {
    try {
      validate_config(dsgd::kImageClassifier, bad);
    } catch (const ConfigError& e) {
      return e.field();
    }
    return "<accepted>";
  };
  auto bad = c;
  bad.num_workers = 0;
  EXPECT_EQ(field_of(bad), "num_workers");
  bad = c;
  bad.strategy = "gossip";
  EXPECT_EQ(field_of(bad), "strategy");
  bad = c;
  bad.comm.compression = Compression::kFp16;
  bad.comm.allreduce_algo = AllreduceAlgo::kRing;
  EXPECT_EQ(field_of(bad), "comm.compression");  // strategy::validate's rule
  bad = c;
  bad.comm.compression = Compression::kPowerSgd;
  bad.comm.powersgd_rank = 0;
  EXPECT_EQ(field_of(bad), "comm.powersgd_rank");
  bad = c;
  bad.launch.hosts = {"a", "b"};
  EXPECT_EQ(field_of(bad), "launch.hosts");  // the launcher's rule
  bad = c;
  bad.step.loss_scale = 3;  // not a power of two: LossScaler's own bound
  EXPECT_EQ(field_of(bad), "step.loss_scale");
  bad = c;
  bad.recovery.heartbeat_timeout = milliseconds(50);
  EXPECT_EQ(field_of(bad), "recovery.heartbeat_timeout");
  bad = c;
  bad.strategy = Strategy::kPsAsync;
  bad.step.max_grad_norm = 1;  // the servers step: no averaged gradient to clip
  EXPECT_EQ(field_of(bad), "step.max_grad_norm");
  bad = c;
  bad.step.max_grad_norm = -1;
  EXPECT_EQ(field_of(bad), "step.max_grad_norm");
  for (const int stage : {-1, 4}) {
    bad = c;
    bad.step.zero_stage = stage;
    EXPECT_EQ(field_of(bad), "step.zero_stage");
  }
  bad = c;
  bad.step.zero_stage = 2;
  bad.strategy = Strategy::kPs;
  EXPECT_EQ(field_of(bad), "step.zero_stage");
  bad.strategy = Strategy::kAllreduce;
  bad.comm.compression = Compression::kBf16;
  EXPECT_EQ(field_of(bad), "step.zero_stage");
  bad.comm.compression = Compression::kNone;
  bad.device = Device::kCuda;  // stage 2 is CPU-only
  EXPECT_EQ(field_of(bad), "step.zero_stage");
  bad.step.zero_stage = 3;  // so is stage 3
  EXPECT_EQ(field_of(bad), "step.zero_stage");
  bad.device = c.device;
  EXPECT_EQ(field_of(bad), "<accepted>");
  EXPECT_EQ(field_of(c), "<accepted>");
}

TEST(TrainerBadInput, DifferentModelsOnDifferentWorkersAreRefusedNamingTheParameter) {
  TrainerConfig c;
  c.num_workers = 2;
  c.batch_size = 4;
  try {
    Trainer t(operator_of<MismatchOperator>(), c);
    FAIL() << "workers with different models were accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("worker 1 built a different model"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model0.fc.weight [4, 4]"), std::string::npos) << e.what();
  }
}

TEST(TrainerBadInput, BinaryWithoutInitIsARegistrationErrorNotAHang) {
  testing::TempDir dir;
  const std::string script = dir.file("no-init.sh");
  {
    std::ofstream f(script);
    f << "#!/bin/sh\nexec sleep 30\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  auto c = base_config(1, "allreduce", 64);
  c.launch.worker_binary = script;
  c.launch.registration_timeout = milliseconds(1500);
  const auto t0 = Clock::now();
  try {
    Trainer t(dsgd::kImageClassifier, c);
    FAIL() << "a worker that never registers was accepted";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("0 of 1 workers registered"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dsgd::init(argc, argv)"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, milliseconds(8000));

  // A binary that exits instead is reported at once, with its status.
  c.launch.worker_binary = "/bin/false";
  c.launch.registration_timeout = milliseconds(30000);
  const auto t1 = Clock::now();
  try {
    Trainer t(dsgd::kImageClassifier, c);
    FAIL() << "a worker that exits was accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("exited with status 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t1, milliseconds(5000));
}

TEST(TrainerNonFinite, ANanOnOneReplicaSkipsTheStepEverywhere) {
  Trainer t(operator_of<NanOperator>(), nan_config(2));
  auto r = t.train({.num_steps = 6});
  EXPECT_EQ(r.metrics.at("skipped_steps"), 1.0);
  EXPECT_TRUE(std::isnan(r.metrics.at("loss")));  // reported as it was, not hidden or lost in JSON
  auto sums = t.foreach_worker("weight_sum");
  EXPECT_TRUE(std::isfinite(sums[0].get<double>()));
  EXPECT_EQ(sums[0], sums[1]);  // still identical replicas
}

// A lone replica has no GradSync: its gradients are checked as backward makes them (GradCheck).
TEST(TrainerNonFinite, ALoneReplicaSkipsTheStepToo) {
  Trainer t(operator_of<NanOperator>(), nan_config(1));
  auto r = t.train({.num_steps = 6});
  EXPECT_EQ(r.metrics.at("skipped_steps"), 1.0);
  EXPECT_TRUE(std::isfinite(t.foreach_worker("weight_sum")[0].get<double>()));
}

TEST(TrainerNonFinite, ErrorPolicyStopsNamingTheStep) {
  auto c = nan_config(2);
  c.step.nonfinite_policy = "error";
  Trainer t(operator_of<NanOperator>(), c);
  try {
    t.train({.num_steps = 6});
    FAIL() << "a NaN gradient passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite gradient at epoch 1, batch 3"), std::string::npos) << e.what();
  }
}

// Loss scaling by a power of two is exact: float32 training with it is training without it, bit
// for bit (2 workers through GradSync's weight, and a lone replica's own unscale), and reports
// the scale.
TEST(TrainerLossScaling, AScaledFloat32JobIsTheUnscaledJobBitForBit) {
  for (int workers : {2, 1}) {
    SCOPED_TRACE(workers);
    auto run = [&](double scale) {
      auto c = base_config(workers, "allreduce", 64);
      c.step.loss_scale = scale;
      Trainer t(dsgd::kImageClassifier, c);
      auto r = t.train({.num_steps = 6});
      return std::make_pair(params_of(*t.get_model()), r);
    };
    const auto [plain, rp] = run(-1);
    const auto [scaled, rs] = run(0x1p20);
    EXPECT_EQ(max_difference(plain, scaled), 0.0);
    EXPECT_EQ(rp.metrics.count("loss_scale"), 0u);
    EXPECT_EQ(rs.metrics.at("loss_scale"), 0x1p20);
    EXPECT_EQ(rs.metrics.at("loss"), rp.metrics.at("loss"));  // reported unscaled
  }
}

// A non-finite gradient under loss scaling is an overflow: the step is skipped on every replica
// and the scale halved, whatever nonfinite_policy says; it grows again after N good steps. The
// result is the unscaled run that skipped the same step. At the minimum scale the policy
// decides again. The scale and its count come back from checkpoints.
TEST(TrainerLossScaling, AnOverflowSkipsTheStepEverywhereBacksOffAndTheScaleIsCheckpointed) {
  auto c = nan_config(2);  // replica 1's third loss is NaN
  c.step.nonfinite_policy = "error";
  c.step.loss_scale = 1024;
  c.step.loss_scale_growth_interval = 2;
  Trainer t(operator_of<NanOperator>(), c);
  auto r = t.train({.num_steps = 6});
  // good, good (-> 2048), NaN (-> 1024, skipped), good, good (-> 2048), good
  EXPECT_EQ(r.metrics.at("skipped_steps"), 1.0);
  EXPECT_EQ(r.metrics.at("loss_scale"), 2048);
  auto sums = t.foreach_worker("weight_sum");
  EXPECT_EQ(sums[0], sums[1]);
  auto plain = nan_config(2);  // the same NaN, skipped by the policy
  Trainer u(operator_of<NanOperator>(), plain);
  u.train({.num_steps = 6});
  EXPECT_EQ(max_difference(params_of(*t.get_model()), params_of(*u.get_model())), 0.0);

  testing::TempDir dir;
  t.save(dir.file("ckpt"));
  Trainer back(operator_of<NanOperator>(), c);
  back.load(dir.file("ckpt"));
  // 2048 with one good step counted: the next good step doubles it (a fresh job would be at 1024).
  EXPECT_EQ(back.train({.num_steps = 1}).metrics.at("loss_scale"), 4096);

  c.step.loss_scale = 0x1p-24;  // LossScaler::kMinScale, and kept there
  c.step.loss_scale_growth_interval = 100;
  Trainer low(operator_of<NanOperator>(), c);
  try {
    low.train({.num_steps = 6});
    FAIL() << "a NaN at the minimum scale passed under the error policy";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite gradient at epoch 1, batch 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsgd
