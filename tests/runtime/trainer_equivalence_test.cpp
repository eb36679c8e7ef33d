// Distributed training equals single-process training: every strategy, overlap and layout, two
// replicas in a worker, clipping, accumulation, BatchNorm, compression, async ps, bf16.
#include "runtime/trainer_testing.h"

namespace dsgd {
namespace {

using namespace trainer_testing;

// step.max_grad_norm: the averaged gradient is clipped to a global L2 norm, the same on every
// replica, so 2 workers still equal one process clipping its global batch's gradient. The bound
// is below the norm (reported as grad_norm), so every step clips, and an unclipped run ends far
// away: the test fails if the workers skip clipping, or clip each replica's own gradient before
// averaging (a different direction and length).
TEST(TrainerEquivalence, ClippedGradientsEqualOneProcessWithTheGlobalBatch) {
  constexpr int64_t kSteps = 10;
  auto c = base_config(2, "allreduce", 64);
  c.step.max_grad_norm = 0.5;
  Metrics one;
  const Params reference = single_process(c.batch_size, kSteps, c.config, c.step, &one);
  Trainer trainer(dsgd::kImageClassifier, c);
  const auto r = trainer.train({.num_steps = kSteps});
  const Params clipped = params_of(*trainer.get_model());
  ASSERT_TRUE(r.metrics.count("grad_norm")) << "no grad_norm in the train metrics";
  EXPECT_GT(r.metrics.at("grad_norm"), 2 * c.step.max_grad_norm) << "the bound should clip every step";
  // The norms, averaged over the 10 steps, follow the parameters' drift: within 1e-4 (relative)
  // of each other where LibTorch's kernels are AVX2 code, 4.7e-4 apart with its AVX-512 kernels on
  // an Intel Xeon with AMX (the parameters then 7.7e-6 apart, not 3e-8).
  EXPECT_NEAR(r.metrics.at("grad_norm"), one.at("grad_norm"), 2e-3 * one.at("grad_norm"));
  EXPECT_LT(max_difference(reference, clipped), 5e-5);
  const Params unclipped = single_process(c.batch_size, kSteps, c.config);
  std::printf("grad_norm %.3f (one process %.3f), bound %.2f: 2 workers %.2g from one process, %.2g from unclipped\n",
              r.metrics.at("grad_norm"), one.at("grad_norm"), c.step.max_grad_norm, max_difference(reference, clipped),
              max_difference(unclipped, clipped));
  EXPECT_GT(max_difference(unclipped, clipped), 1e-3) << "clipping changed nothing";
}

// The language model (gpt-tiny on a token file that streams from disk, AdamW, warmup and cosine
// per step, clipping): 2 workers equal one process with the global batch, as the image models do,
// and so do 2 workers and one process that accumulate each step's gradient over 2 micro-batches.
// AdamW divides by the root of its second moment, so it carries rounding further than SGD: 1e-5.
TEST(TrainerEquivalence, LanguageModelTwoWorkersEqualOneProcessWithTheGlobalBatch) {
  constexpr int64_t kSteps = 20;
  testing::TempDir dir;
  TrainerConfig c = language_model_job(dir, 800, kSteps);
  c.step.max_grad_norm = 1.0;
  dsgd::register_builtin_operators();
  torch_glue::ReplicaOptions o;
  o.global_batch = c.batch_size;
  o.seed = o.info.seed = c.seed;
  o.threads = 1;
  o.step = c.step;
  torch_glue::ReplicaRuntime one(make_operator(kLanguageModel), o);
  one.setup(c.config);
  ASSERT_EQ(one.train(kSteps, false).at("batches"), kSteps);  // one epoch holds them all
  const Params reference = params_of(one.op().model(0));

  Trainer trainer(kLanguageModel, c);
  const Params before = params_of(*trainer.get_model());
  EXPECT_EQ(trainer.train({.num_steps = kSteps}).batch, kSteps);
  const Params after = params_of(*trainer.get_model());
  EXPECT_GT(max_difference(before, after), 1e-3) << "training did not move the parameters";
  EXPECT_LT(max_difference(reference, after), 1e-5);

  o.step.accumulate_steps = c.step.accumulate_steps = 2;
  torch_glue::ReplicaRuntime lone(make_operator(kLanguageModel), o);
  lone.setup(c.config);
  const auto m = lone.train(kSteps, false);
  EXPECT_EQ(m.at("batches"), kSteps) << "steps, not micro-batches";
  EXPECT_EQ(lone.position().batch, kSteps);
  EXPECT_LT(max_difference(reference, params_of(lone.op().model(0))), 1e-5) << "one process accumulating";
  Trainer accumulating(kLanguageModel, c);
  const auto r = accumulating.train({.num_steps = kSteps});
  EXPECT_EQ(r.batch, kSteps);
  EXPECT_EQ(r.batches_per_epoch, one.batches_per_epoch());
  const Params accumulated = params_of(*accumulating.get_model());
  EXPECT_LT(max_difference(reference, accumulated), 1e-5) << "2 workers accumulating";
  std::printf("2 workers %.2g, one process accumulating 2 %.2g, 2 workers accumulating 2 %.2g from one process\n",
              max_difference(reference, after), max_difference(reference, params_of(lone.op().model(0))),
              max_difference(reference, accumulated));
}

// BatchNorm's running statistics are averaged over the replicas after every step (each replica
// normalises with its own part of the batch, as DDP does): the replicas hold the same buffers
// after every step, and the driver's copy of the model (from the snapshot) holds them too.
TEST(TrainerEquivalence, BatchNormStatisticsAreTheSameOnEveryReplicaAfterEveryStep) {
  auto c = base_config(2, "allreduce", 32);
  c.config["model"] = "resnet18";
  c.config["synthetic_samples"] = 512;
  c.config["synthetic_image_size"] = 16;
  Trainer t(dsgd::kImageClassifier, c);
  const auto before = t.foreach_worker("running_stats")[0].get<std::vector<float>>();
  ASSERT_GT(before.size(), 9000u) << "ResNet-18 has 9600 running statistics";
  std::vector<float> stats;
  for (int step = 1; step <= 3; ++step) {
    t.train({.num_steps = 1});
    const auto w = t.foreach_worker("running_stats");
    stats = w[0].get<std::vector<float>>();
    EXPECT_EQ(stats, w[1].get<std::vector<float>>()) << "the replicas' statistics differ after step " << step;
  }
  EXPECT_NE(stats, before) << "training did not move the statistics";
  EXPECT_EQ(running_stats(*t.get_model()), stats) << "the snapshot's statistics are not the replicas'";
}

// sync_batchnorm (dsgd/torch/sync_batchnorm.h): each BatchNorm layer normalises with the statistics of
// every replica's samples together, so 2 workers train what one process with the global batch
// trains, parameters and running statistics alike, and their checkpoint (get_model reads the
// state a checkpoint holds) is that process's. Without it each replica normalises its own half,
// and both part from the one process's at once. At a small learning rate, where float32's
// rounding is not amplified by the training itself: after 3 steps 1.0e-6 (parameters) and
// 8.3e-7 (statistics) from one process, against 2.3e-4 and 0.014 without; one process's own two
// BatchNorm formulas (BatchNorm2d's, SyncBatchNorm2d's) part by as much (1.1e-6). At lr 0.01 the
// trajectories of any two such formulas part 1000-fold a step, so no bound holds beyond the first.
TEST(TrainerEquivalence, SyncBatchNormTrainsTheParametersAndStatisticsOfOneProcessWithTheGlobalBatch) {
  constexpr int64_t kSteps = 3;
  auto c = base_config(2, "allreduce", 32);
  c.config["model"] = "resnet18";
  c.config["synthetic_samples"] = 512;
  c.config["synthetic_image_size"] = 16;
  c.config["lr"] = 1e-4;
  const auto distance_from_one_process = [&](bool sync) {
    c.config["sync_batchnorm"] = sync;
    std::vector<float> one_stats;
    const Params one = single_process(c.batch_size, kSteps, c.config, {}, nullptr, &one_stats);
    Trainer t(dsgd::kImageClassifier, c);
    t.train({.num_steps = kSteps});
    const auto w = t.foreach_worker("running_stats");
    EXPECT_EQ(w[0], w[1]) << "the replicas' statistics differ";
    const auto model = t.get_model();
    const std::vector<float> stats = running_stats(*model);
    EXPECT_EQ(stats.size(), one_stats.size());
    double worst_stat = 0;
    for (size_t i = 0; i < stats.size() && i < one_stats.size(); ++i) {
      worst_stat = std::max(worst_stat, static_cast<double>(std::abs(stats[i] - one_stats[i])));
    }
    return std::make_pair(max_difference(one, params_of(*model)), worst_stat);
  };
  const auto [params, stats] = distance_from_one_process(true);
  const auto [plain_params, plain_stats] = distance_from_one_process(false);
  std::printf("from one process after %lld steps: synced %.2g (parameters), %.2g (statistics); plain %.2g, %.2g\n",
              static_cast<long long>(kSteps), params, stats, plain_params, plain_stats);
  EXPECT_LT(params, 1e-5);
  EXPECT_LT(stats, 1e-5);
  EXPECT_GT(plain_stats, 1e-3) << "each replica's own statistics should part from the whole batch's";
}

// Accumulation sends nothing for the micro-batches before a step's last: across 2 pseudo-hosts
// a step of 4 micro-batches moves the bytes of a step of one, and trains the same parameters.
TEST(TrainerEquivalence, AccumulatedMicroBatchesSendNothingAndEqualTheWholeBatch) {
  constexpr int64_t kSteps = 3;
  auto run = [&](int64_t accumulate) {
    auto c = base_config(2, "allreduce", 64);
    c.launch.local_hosts = 2;
    c.step.accumulate_steps = accumulate;
    Trainer trainer(dsgd::kImageClassifier, c);
    auto r = trainer.train({.num_steps = kSteps});
    EXPECT_EQ(r.metrics.at("batches"), kSteps);
    return std::make_pair(params_of(*trainer.get_model()), r.metrics.at("comm_bytes_per_step"));
  };
  const auto [whole, whole_bytes] = run(1);
  const auto [micro, micro_bytes] = run(4);
  EXPECT_GT(whole_bytes, 0);
  EXPECT_EQ(micro_bytes, whole_bytes);
  EXPECT_LT(max_difference(whole, micro), 1e-5);
  // An epoch of 1000 samples in steps of 4 x 16: its last step holds 40 samples in 3 micro-batches
  // of 16, 16, 8, and equals the last batch of 40 of a process that does not accumulate.
  auto small = synthetic_config();
  small["synthetic_samples"] = 1000;
  small["synthetic_image_size"] = 8;
  StepConfig four;
  four.accumulate_steps = 4;
  EXPECT_LT(max_difference(single_process(64, 16, small), single_process(64, 16, small, four)), 1e-5);
  EXPECT_THROW(Trainer(dsgd::kImageClassifier,
                       [] {
                         auto c = base_config(2, "allreduce", 64);
                         c.step.accumulate_steps = 48;  // micro-batches of 1.33 samples
                         return c;
                       }()),
               ConfigError);
}

// compression fp16 / bf16 on allreduce across 2 pseudo-hosts: half the bytes cross hosts, and
// a few steps end near the uncompressed run, float16 (10 bits of mantissa) nearer than bfloat16
// (7): after 3 steps here 6.0e-7 and 5.5e-6 apart (later, trajectories part at the rate any
// rounding change makes them: 8 steps, 2e-5 both). compression none is the equivalence tests'
// path, unchanged. PowerSGD at rank 4 (no plain start): 30x fewer bytes here, 2.2e-4 from
// float32 after 3 steps. ps takes every scheme too (shards in the workers, averaging); other
// strategies refuse.
TEST(TrainerCompression, EachSchemeCutsTheBytesAcrossHostsAndTrainsNearFloat32) {
  constexpr int64_t kSteps = 3;
  auto run = [](const char* compression) {
    auto c = base_config(2, "allreduce", 64);
    c.launch.local_hosts = 2;
    c.comm.compression = compression;
    Trainer trainer(dsgd::kImageClassifier, c);
    auto r = trainer.train({.num_steps = kSteps});
    return std::make_pair(params_of(*trainer.get_model()), r.metrics.at("comm_bytes_per_step"));
  };
  const auto [p32, b32] = run("none");
  EXPECT_GT(b32, 0);
  std::map<std::string, double> diff;
  for (const std::string c : {"fp16", "bf16"}) {
    const auto [p, b] = run(c.c_str());
    EXPECT_NEAR(b32 / b, 2.0, 0.02) << c << ": " << b32 << " bytes a step in float32, " << b;
    diff[c] = max_difference(p32, p);
    EXPECT_GT(diff[c], 0) << c << ": compression changed nothing";
  }
  EXPECT_LT(diff["fp16"], 5e-6);
  EXPECT_LT(diff["bf16"], 5e-5);
  EXPECT_LT(diff["fp16"], diff["bf16"]);
  {  // PowerSGD at rank 4 from the first step: the convolutions' and linear layers' factors only
    auto c = base_config(2, "allreduce", 64);
    c.launch.local_hosts = 2;
    c.comm.compression = "powersgd";
    c.comm.powersgd_start_steps = 0;
    Trainer trainer(dsgd::kImageClassifier, c);
    auto r = trainer.train({.num_steps = kSteps});
    const double b = r.metrics.at("comm_bytes_per_step");
    const double d = max_difference(p32, params_of(*trainer.get_model()));
    std::printf("powersgd:4: %.1fx fewer bytes, %g from float32 after %d steps\n", b32 / b, d,
                static_cast<int>(kSteps));
    EXPECT_GT(b32 / b, 8.0);
    EXPECT_GT(d, diff["bf16"]) << "rank 4 should lose more than 16-bit rounding";
    EXPECT_LT(d, 1e-2);
  }
  {  // ps: its pushes and pulls in 16 bits, half the bytes, near its own float32 run
    auto ps = base_config(2, "ps", 64);
    ps.launch.local_hosts = 2;
    ps.ps.shards = 2;
    std::map<std::string, std::pair<Params, double>> runs;
    ps.comm.powersgd_start_steps = 0;
    for (const char* compression : {"none", "fp16", "bf16", "powersgd"}) {
      ps.comm.compression = compression;
      Trainer trainer(dsgd::kImageClassifier, ps);
      auto r = trainer.train({.num_steps = kSteps});
      runs[compression] = {params_of(*trainer.get_model()), r.metrics.at("comm_bytes_per_step")};
    }
    EXPECT_GT(runs["none"].second, 0);
    for (const char* c : {"fp16", "bf16"}) {
      EXPECT_NEAR(runs["none"].second / runs[c].second, 2.0, 0.02) << c;
      const double d = max_difference(runs["none"].first, runs[c].first);
      EXPECT_GT(d, 0) << c << ": compression changed nothing";
      EXPECT_LT(d, 5e-5) << c;
    }
    EXPECT_LT(max_difference(runs["none"].first, p32), 5e-5) << "ps and allreduce average alike";
    EXPECT_GT(runs["none"].second / runs["powersgd"].second, 8.0);
    const double d = max_difference(runs["none"].first, runs["powersgd"].first);
    EXPECT_GT(d, max_difference(runs["none"].first, runs["bf16"].first));
    EXPECT_LT(d, 1e-2);
  }
  auto reject = [](TrainerConfig c, const char* why) {
    try {
      Trainer t(dsgd::kImageClassifier, c);
      FAIL() << "accepted: " << why;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("to strategy ps with its shards in the workers"), std::string::npos)
          << e.what();
    }
  };
  auto c = base_config(2, "ps", 64);
  c.comm.compression = "fp16";
  c.ps.update_on_shards = true;
  reject(c, "fp16 with update on shards");
  c = base_config(2, "ps_async", 64);
  c.comm.compression = "bf16";
  reject(c, "bf16 on ps_async");
}

TEST(TrainerEquivalence, TwoWorkersAllreduceEqualOneProcessWithTheGlobalBatch) {
  expect_equivalent(base_config(2, "allreduce", 64));
}

TEST(TrainerEquivalence, TwoWorkersSimpleEqualOneProcessWithTheGlobalBatch) {
  expect_equivalent(base_config(2, "simple", 64));
}

TEST(TrainerEquivalence, ThreeWorkersAllreduceWithBatch96) { expect_equivalent(base_config(3, "allreduce", 96)); }

TEST(TrainerEquivalence, TwoReplicasInOneWorker) {
  auto c = base_config(1, "allreduce", 64);
  c.devices_per_worker = 2;
  c.threads_per_worker = 2;
  expect_equivalent(c);
}

// Convolutions laid out channels_last: gradients keep that layout in the buckets (the average is
// elementwise).
TEST(TrainerEquivalence, ChannelsLastAllreduce) {
  auto c = base_config(2, "allreduce", 64);
  c.config["channels_last"] = true;
  expect_equivalent(c);
  Trainer t(dsgd::kImageClassifier, c);
  for (const auto& w : t.foreach_worker("conv_layout")) EXPECT_EQ(w, "channels_last");
}

TEST(TrainerEquivalence, FlatRingAllreduce) {
  auto c = base_config(2, "allreduce", 64);
  c.comm.allreduce_algo = "ring";
  expect_equivalent(c);
}

TEST(TrainerEquivalence, UnevenSplitIsWeightedExactly) {
  // 63 samples over 2 replicas: 32 + 31; each replica's mean gradient is weighted by its share.
  expect_equivalent(base_config(2, "allreduce", 63));
}

TEST(TrainerEquivalence, PsOneShardOnTwoHosts) { expect_equivalent(ps_config(2, 2, 1)); }

TEST(TrainerEquivalence, PsTwoShardsOnTwoHosts) { expect_equivalent(ps_config(2, 2, 2)); }

TEST(TrainerEquivalence, PsFourShardsThreeWorkersOnTwoHosts) { expect_equivalent(ps_config(3, 2, 4, 96)); }

TEST(TrainerEquivalence, PsOneHostIsSharedMemoryOnly) { expect_equivalent(ps_config(2, 1, 0)); }

TEST(TrainerEquivalence, PsWithoutOverlap) {
  auto c = ps_config(2, 2, 2);
  c.comm.overlap = false;
  expect_equivalent(c);
}

TEST(TrainerEquivalence, PsUpdateOnShardsOneShardOnTwoHosts) { expect_equivalent(ps_update_config(2, 2, 1)); }

TEST(TrainerEquivalence, PsUpdateOnShardsTwoShardsOnTwoHosts) { expect_equivalent(ps_update_config(2, 2, 2)); }

TEST(TrainerEquivalence, PsUpdateOnShardsFourShardsThreeWorkersOnTwoHosts) {
  expect_equivalent(ps_update_config(3, 2, 4, 96));
}

TEST(TrainerEquivalence, PsUpdateOnShardsOneHost) { expect_equivalent(ps_update_config(2, 1, 0)); }

// Servers that update parameters take them in logical order, whatever the layout.
TEST(TrainerEquivalence, ChannelsLastPsUpdateOnShards) {
  auto c = ps_update_config(2, 2, 2);
  c.config["channels_last"] = true;
  expect_equivalent(c);
}

TEST(TrainerEquivalence, PsShardProcessesOneShard) { expect_equivalent(ps_processes_config(2, 2, 1, false)); }

TEST(TrainerEquivalence, PsShardProcessesTwoShards) { expect_equivalent(ps_processes_config(2, 2, 2, false)); }

TEST(TrainerEquivalence, PsShardProcessesFourShardsThreeWorkers) {
  expect_equivalent(ps_processes_config(3, 2, 4, false, 96));
}

TEST(TrainerEquivalence, PsShardProcessesOneHostDefaultShards) {
  expect_equivalent(ps_processes_config(2, 1, 0, false));
}

TEST(TrainerEquivalence, PsShardProcessesUpdateOnShardsOneShard) {
  expect_equivalent(ps_processes_config(2, 2, 1, true));
}

TEST(TrainerEquivalence, PsShardProcessesUpdateOnShardsTwoShards) {
  expect_equivalent(ps_processes_config(2, 2, 2, true));
}

TEST(TrainerEquivalence, PsShardProcessesUpdateOnShardsFourShardsThreeWorkers) {
  expect_equivalent(ps_processes_config(3, 2, 4, true, 96));
}

// The forward overlap: T buckets, spread over the layers, travel after backward and each
// bucket's step is taken as the next forward reaches its layer (the CNN has 5 buckets here).
TEST(TrainerEquivalence, ForwardOverlapAllreduce) {
  auto c = base_config(2, "allreduce", 64);
  c.comm.forward_overlap_buckets = 2;
  expect_equivalent(c);
}

TEST(TrainerEquivalence, ForwardOverlapSimple) {  // averaged on the driver
  auto c = base_config(2, "simple", 64);
  c.comm.forward_overlap_buckets = 2;
  expect_equivalent(c);
}

TEST(TrainerEquivalence, ForwardOverlapOfEveryBucketWithAPerBatchSchedule) {
  auto c = base_config(2, "allreduce", 64);
  c.comm.forward_overlap_buckets = 64;  // more than there are: all of them
  c.config["lr_decay"] = 0.9;           // a new learning rate every step: each deferred step takes its own
  c.step.scheduler_step_freq = "batch";
  expect_equivalent(c);
}

TEST(TrainerEquivalence, ForwardOverlapTwoReplicasInOneWorker) {
  auto c = base_config(1, "allreduce", 64);
  c.devices_per_worker = 2;
  c.threads_per_worker = 2;
  c.comm.forward_overlap_buckets = 3;
  expect_equivalent(c);
}

// auto: the first 36 steps try T = 0, 1, 2 (of the CNN's 3 buckets at this bucket size), 6 steps
// each, in two rounds, then the choice trains on; the driver names T in every command, so the
// replicas agree at every step (checked to fail with T off by one on odd ranks).
TEST(TrainerEquivalence, ForwardOverlapAutoTriesEachTAndStaysEquivalent) {
  auto c = base_config(2, "allreduce", 64);
  c.comm.forward_overlap_buckets = -1;
  c.config["lr_decay"] = 0.9;
  c.step.scheduler_step_freq = "batch";
  expect_equivalent(c, 44);
}

TEST(TrainerEquivalence, ForwardOverlapPs) {
  auto c = ps_config(2, 2, 2);
  c.comm.forward_overlap_buckets = 2;
  expect_equivalent(c);
}

TEST(TrainerEquivalence, ForwardOverlapPsShardProcesses) {
  auto c = ps_processes_config(2, 2, 2, false);
  c.comm.forward_overlap_buckets = 2;
  expect_equivalent(c);
}

TEST(TrainerPsAsync, ASlowWorkerDoesNotSlowTheOthersUnlessTheStalenessBoundHoldsThem) {
  // The slow worker takes 12 x 40 ms >= 480 ms. Unbounded, the fast one does not wait for it.
  const auto async = run_with_a_slow_worker("ps_async", -1);
  EXPECT_GE(async.slow_s, 0.48);
  EXPECT_LT(async.fast_s, 0.5 * async.slow_s) << "fast " << async.fast_s << " s, slow " << async.slow_s << " s";
  EXPECT_GE(async.slow_staleness_max, 1.0) << "the slow worker's pushes landed on parameters it had not seen";
  // After the call every replica holds the servers' parameters (the snapshot's pull).
  ASSERT_EQ(async.weight_sums.size(), 2u);
  EXPECT_EQ(async.weight_sums[0], async.weight_sums[1]);
  // Synchronous ps, and ps_async bounded to 1 update ahead: the fast worker waits for the slow.
  const auto sync = run_with_a_slow_worker("ps", 4);
  EXPECT_GT(sync.fast_s, 0.8 * sync.slow_s) << "fast " << sync.fast_s << " s, slow " << sync.slow_s << " s";
  const auto bounded = run_with_a_slow_worker("ps_async", 1);
  EXPECT_GT(bounded.fast_s, 0.7 * bounded.slow_s) << "fast " << bounded.fast_s << " s, slow " << bounded.slow_s << " s";
  std::cout << "fast/slow worker seconds: ps_async " << async.fast_s << "/" << async.slow_s << " (staleness max "
            << async.slow_staleness_max << "), ps " << sync.fast_s << "/" << sync.slow_s << ", ps_async bounded to 1 "
            << bounded.fast_s << "/" << bounded.slow_s << "\n";
}

TEST(TrainerPsAsync, TrainsAndItsCheckpointLoadsUnderAllreduce) {
  testing::TempDir dir;
  auto c = base_config(2, "ps_async", 64);
  c.launch.local_hosts = 2;
  Trainer a(dsgd::kImageClassifier, c);
  const Params before = params_of(*a.get_model());
  auto r1 = a.train({.num_steps = 20});
  auto r2 = a.train({.num_steps = 20});
  EXPECT_LT(r2.metrics.at("loss"), r1.metrics.at("loss"));
  EXPECT_TRUE(r2.metrics.count("staleness_mean"));
  EXPECT_GT(max_difference(before, params_of(*a.get_model())), 1e-3);
  a.save(dir.file("ckpt"));
  Trainer b(dsgd::kImageClassifier, base_config(2, "allreduce", 64));
  b.load(dir.file("ckpt"));
  EXPECT_LT(max_difference(params_of(*a.get_model()), params_of(*b.get_model())), 1e-7);
  EXPECT_EQ(b.train({.num_steps = 1}).batch, 41);
}

// bf16 autocast on the CPU through the Trainer, 2 workers: the CNN's loss falls as in float32.
TEST(TrainerPrecision, Bf16OnTheCpuTrainsTheCnnLikeFloat32) {
  expect_trains_like_fp32(base_config(2, "allreduce", 64), Precision::kBf16, 5, 40, 0.2);
}

}  // namespace
}  // namespace dsgd
