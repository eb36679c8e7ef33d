// The Trainer end to end with real worker processes (this test binary, spawned): results and
// traces, progress, datasets read by index, schedules, how local workers are started, and a
// lost worker or a group that cannot form named within seconds.
#include "runtime/trainer_testing.h"

namespace dsgd {
namespace {

using namespace trainer_testing;

// The operator reaches the runtime only through its host: without one, a clear error, no crash.
TEST(ReplicaState, AnOperatorNotRunByATrainerSaysSoInsteadOfCrashing) {
  dsgd::register_builtin_operators();
  auto op = make_operator(dsgd::kImageClassifier);
  op->setup(synthetic_config());
  Batch batch;
  try {
    op->next_train_batch(batch);
    FAIL() << "next_train_batch worked without a runtime";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("next_train_batch: this operator is not being run by a Trainer"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(op->after_batch(), ConfigError);
  EXPECT_THROW(op->batches_per_epoch(), ConfigError);
  Batch some{torch::randn({4, 1, 28, 28}), torch::zeros({4}, torch::kInt64)};
  EXPECT_THROW(op->train_batch(some), ConfigError);
}

// state_bytes() is save_state()'s size without the bytes: the driver's snapshot schedule scales
// the constructor's snapshot by it once the first steps have given the optimizer its momentum.
TEST(ReplicaState, StateBytesIsTheSizeSaveStateWritesAndGrowsWithTheMomentum) {
  dsgd::register_builtin_operators();
  torch_glue::ReplicaOptions o;
  o.global_batch = 32;
  o.threads = 1;
  torch_glue::ReplicaRuntime r(make_operator(dsgd::kImageClassifier), o);
  r.setup(synthetic_config());
  const size_t before = r.state_bytes();
  EXPECT_EQ(before, r.save_state().size());
  r.train(2, false);
  const size_t after = r.state_bytes();
  EXPECT_EQ(after, r.save_state().size());
  EXPECT_GT(after, before * 3 / 2) << "momentum 0.9: a buffer per parameter after the first step";
}

// dsgd::fit reports progress while the first epoch runs, before any call has returned the number
// of batches in an epoch (worker 0 says it in its heartbeat).
TEST(TrainerFit, ProgressIsReportedFromTheFirstEpochOn) {
  class Recorder : public ProgressListener {
   public:
    void on_batch(const BatchProgress& p) override { batches.push_back(p); }
    void on_epoch(const EpochSummary& s) override { epochs.push_back(s); }
    std::vector<BatchProgress> batches;
    std::vector<EpochSummary> epochs;
  } rec;
  Trainer t(dsgd::kImageClassifier, base_config(2, "allreduce", 64));
  const FitResult r = fit(t, {.epochs = 2, .evaluate = false}, &rec);
  EXPECT_EQ(r.steps, 128);
  ASSERT_EQ(rec.epochs.size(), 2u);
  ASSERT_FALSE(rec.batches.empty()) << "no progress at all";
  EXPECT_EQ(rec.batches.front().epoch, 1) << "nothing reported during the first epoch";
  EXPECT_EQ(rec.batches.front().batches_per_epoch, 64);
  EXPECT_EQ(rec.batches.front().total_steps, 128);
}

// trace_path: every worker's steps, bucket launches, waits and allreduces in one Chrome trace.
// With the forward overlap (T = 2 of the CNN's 3 buckets at this bucket size), every bucket of
// every step is waited for and stepped once: in the next step's forward, or in the flush at the
// call's end.
TEST(Trainer, TraceShowsEachWorkersStepsBucketsAndAllreduces) {
  testing::TempDir dir;
  auto c = base_config(2, "allreduce", 64);
  c.comm.forward_overlap_buckets = 2;
  Trainer trainer(dsgd::kImageClassifier, c);
  const int steps = 4;
  const auto t0 = std::chrono::steady_clock::now();
  trainer.train({.num_steps = steps, .trace_path = dir.file("trace.json")});
  const double call_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  const size_t buckets = 3;

  const auto t = nlohmann::json::parse(std::ifstream(dir.file("trace.json")));
  std::map<std::pair<int, int>, std::string> rows;
  for (const auto& e : t.at("traceEvents")) {
    if (e.at("name") == "thread_name") rows[{e.at("pid"), e.at("tid")}] = e["args"]["name"];
  }
  for (int w = 0; w < 2; ++w) {
    std::map<std::string, int> count;
    std::map<int64_t, int> waits, launches, allreduces;  // per bucket
    std::vector<std::pair<double, double>> forwards, backwards;
    for (const auto& e : t.at("traceEvents")) {
      if (e.at("ph") == "M" || e.at("pid") != w) continue;
      const std::string name = e.at("name");
      const std::string row = rows.at({w, e.at("tid")});
      const double ts = e.at("ts");
      EXPECT_GE(ts, 0);
      EXPECT_LE(ts, call_us);
      ++count[name.substr(0, name.find(" ("))];
      if (name == "wait") ++waits[e.at("args").at("bucket").get<int64_t>()];
      if (name == "launch") ++launches[e.at("args").at("bucket").get<int64_t>()];
      if (name.rfind("hierarchical allreduce", 0) == 0) ++allreduces[e.at("args").at("bucket").get<int64_t>()];
      if (name == "forward" || name == "backward" || name == "launch" || name == "wait") {
        EXPECT_EQ(row, "replica " + std::to_string(w)) << name;
      }
      if (name.rfind("hierarchical allreduce", 0) == 0) {
        EXPECT_EQ(row, "hierarchical group");
      }
      if (name == "forward") forwards.emplace_back(ts, ts + e.at("dur").get<double>());
      if (name == "backward") backwards.emplace_back(ts, ts + e.at("dur").get<double>());
    }
    EXPECT_EQ(count["forward"], steps);
    EXPECT_EQ(count["backward"], steps);
    EXPECT_EQ(count["optimizer"], steps);
    EXPECT_EQ(count["next batch"], steps);
    EXPECT_EQ(count["launch"], static_cast<int>(steps * buckets));
    EXPECT_EQ(count["hierarchical allreduce"], static_cast<int>(steps * buckets));
    EXPECT_EQ(count["deferred step"], static_cast<int>(steps * buckets));
    ASSERT_EQ(waits.size(), buckets);
    ASSERT_EQ(launches.size(), buckets);
    for (const auto& [bucket, n] : waits) EXPECT_EQ(n, steps) << "bucket " << bucket;
    for (const auto& [bucket, n] : launches) EXPECT_EQ(n, steps) << "bucket " << bucket;
    EXPECT_EQ(allreduces, launches);  // each allreduce's span names its bucket
    // Each step's forward ends before its backward starts, which ends before the next forward.
    ASSERT_EQ(forwards.size(), backwards.size());
    for (size_t i = 0; i < forwards.size(); ++i) {
      EXPECT_LE(forwards[i].second, backwards[i].first);
      if (i + 1 < forwards.size()) {
        EXPECT_LE(backwards[i].second, forwards[i + 1].first);
      }
    }
  }
}

TEST(Trainer, ResultsAverageOverWorkersAndForeachWorkerReachesEveryWorker) {
  auto c = base_config(2, "allreduce", 64);
  c.initialization_hook = "count_hook";
  Trainer trainer(dsgd::kImageClassifier, c);
  EXPECT_EQ(trainer.parameter_count(), 1199882);
  for (const auto& runs : trainer.foreach_worker("hook_runs_here")) {
    EXPECT_EQ(runs.at("runs"), 1) << runs;
    EXPECT_EQ(runs.at("with_operator"), 0) << "the initialization hook ran after setup: " << runs;
  }
  auto r = trainer.train({.num_steps = 4, .profile = true, .reduce_results = false});
  ASSERT_EQ(r.per_worker.size(), 2u);
  for (const char* k : {"loss", "accuracy", "forward_s", "backward_s", "comm_wait_s", "optimizer_s", "epoch_s"}) {
    EXPECT_TRUE(r.metrics.count(k)) << k;
  }
  const double mean = (r.per_worker[0].at("loss") + r.per_worker[1].at("loss")) / 2;
  EXPECT_NEAR(r.metrics.at("loss"), mean, 1e-9);  // equal shares: the plain mean
  auto v = trainer.validate();
  EXPECT_EQ(v.metrics.at("num_samples"), 1024.0);  // the whole synthetic test split, split over workers
  EXPECT_GT(v.metrics.at("accuracy"), 0.0);
  // AVX-512 kernels where the CPU has them (LibTorch 1.13 leaves them opt-in).
  const bool avx512 = runtime::cpu_has_avx512_kernels();
  for (const auto& kernels : trainer.foreach_worker("cpu_kernels")) EXPECT_EQ(kernels == "AVX512", avx512) << kernels;
  auto infos = trainer.foreach_worker("replica_info", 42);
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[0]["rank"], 0);
  EXPECT_EQ(infos[1]["rank"], 1);
  EXPECT_EQ(infos[1]["world"], 2);
  EXPECT_EQ(infos[1]["arg"], 42);
  EXPECT_NE(infos[0]["pid"], infos[1]["pid"]);
  EXPECT_THROW(trainer.foreach_worker("no_such_function"), ConfigError);
}

// register_dataset: the same samples read by index as each replica needs them train exactly as
// the same tensors registered whole, and validate the same; each replica reads its own share of
// each global batch and nothing else (no sample read twice, none loaded up front).
// DistributedSGD's foreach_model: every replica of every worker, in rank order, with the
// built-in "dsgd.replica"; foreach_worker reaches each worker's first replica only.
TEST(Trainer, ForeachModelVisitsEveryReplicaOfEveryWorkerInRankOrder) {
  auto c = base_config(2, "allreduce", 64);
  c.devices_per_worker = 2;
  Trainer t(dsgd::kImageClassifier, c);
  t.train({.num_steps = 2});
  const auto models = t.foreach_model("dsgd.replica");
  ASSERT_EQ(models.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(models[i]["rank"], i);
    EXPECT_EQ(models[i]["worker"], i / 2);
    EXPECT_EQ(models[i]["local_replica"], i % 2);
    EXPECT_EQ(models[i]["world_size"], 4);
    EXPECT_EQ(models[i]["parameters"], t.parameter_count());
    EXPECT_EQ(models[i]["checksum"], models[0]["checksum"]) << "replica " << i << " holds other parameters";
  }
  const auto workers = t.foreach_worker("dsgd.replica");
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0]["rank"], 0);
  EXPECT_EQ(workers[1]["rank"], 2);
  // The checksum follows the parameters: another seed trains other ones.
  c.seed = 8;
  Trainer other(dsgd::kImageClassifier, c);
  other.train({.num_steps = 2});
  EXPECT_NE(other.foreach_model("dsgd.replica")[0]["checksum"], models[0]["checksum"]);
  EXPECT_THROW(t.foreach_model("no_such_function"), ConfigError);
}

TEST(TrainerData, ADatasetReadByIndexTrainsExactlyAsTheSameTensorsInMemory) {
  constexpr int64_t kSteps = 4, kBatch = 64;  // the epoch's 256 samples
  auto c = base_config(2, "allreduce", kBatch);
  c.config = json::object();
  auto run = [&](bool streamed, std::vector<json>* read) {
    c.config["streamed"] = streamed;
    Trainer t(operator_of<StreamedOperator>(), c);
    EXPECT_EQ(t.train({.num_steps = kSteps}).epoch, 1);
    const auto v = t.validate();
    if (read != nullptr) *read = t.foreach_worker("samples_read");
    return std::make_pair(params_of(*t.get_model()), v.metrics.at("loss"));
  };
  std::vector<json> read;
  const auto [in_memory, in_memory_loss] = run(false, nullptr);
  const auto [streamed, streamed_loss] = run(true, &read);
  EXPECT_EQ(max_difference(in_memory, streamed), 0.0);
  EXPECT_EQ(in_memory_loss, streamed_loss);
  ASSERT_EQ(read.size(), 2u);
  for (const auto& n : read) EXPECT_EQ(n.get<int64_t>(), kSteps * kBatch / 2) << "samples a replica read";
}

// scheduler_step_freq manual: the schedules move only when the operator steps them (every second
// batch here), not at the epoch's end as under epoch, nor every batch as under batch.
TEST(TrainerSchedules, ManualSchedulesStepOnlyWhenTheOperatorStepsThem) {
  std::map<std::string, double> lr;
  for (const auto freq : {SchedulerStepFreq::kManual, SchedulerStepFreq::kEpoch, SchedulerStepFreq::kBatch}) {
    auto c = base_config(2, "allreduce", 64);  // 256 samples: 4 batches an epoch
    c.step.scheduler_step_freq = freq;
    Trainer t(operator_of<CountingOperator>(), c);
    EXPECT_EQ(t.train().batches_per_epoch, 4);
    t.train({.num_steps = 2});  // 6 batches: the operator stepped 3 times
    const auto rates = t.foreach_worker("learning_rate");
    EXPECT_EQ(rates[0], rates[1]);
    lr[Choice<SchedulerStepFreq>(freq).name()] = rates[0].get<double>();
  }
  EXPECT_DOUBLE_EQ(lr["manual"], 0.1 * std::pow(0.5, 3));
  EXPECT_DOUBLE_EQ(lr["epoch"], 0.1 * std::pow(0.5, 3 + 1));  // and the runtime once, after epoch 1
  EXPECT_DOUBLE_EQ(lr["batch"], 0.1 * std::pow(0.5, 3 + 6));  // and the runtime after each batch
}

// The language model's schedule as its header states it, written out here and not taken from
// the code under test: lr (t + 1) / W over the W warmup steps, then a cosine from lr down to
// min_lr over D steps, then min_lr. Every worker's optimizer, read after each step of a real
// job, holds the rate of the step to come; a few values are also checked by hand.
TEST(TrainerSchedules, LanguageModelWarmupThenCosineFollowsItsClosedFormStepByStep) {
  constexpr int64_t kWarmup = 5, kDecay = 8;
  constexpr double kLr = 1e-3, kMinLr = 1e-4;
  const auto closed_form = [&](int64_t t) {
    if (t < kWarmup) return kLr * static_cast<double>(t + 1) / kWarmup;
    const double progress = std::min(1.0, static_cast<double>(t - kWarmup) / kDecay);
    return kMinLr + (kLr - kMinLr) * 0.5 * (1 + std::cos(M_PI * progress));
  };
  EXPECT_DOUBLE_EQ(closed_form(0), 2e-4);
  EXPECT_DOUBLE_EQ(closed_form(4), 1e-3);
  EXPECT_DOUBLE_EQ(closed_form(9), 5.5e-4);  // half way down: the mean of lr and min_lr
  EXPECT_DOUBLE_EQ(closed_form(13), 1e-4);
  testing::TempDir dir;
  TrainerConfig c = language_model_job(dir, 300, kDecay);
  c.config["lr"] = kLr;
  c.config["min_lr"] = kMinLr;
  ASSERT_EQ(c.config["warmup_steps"], kWarmup);
  Trainer t(kLanguageModel, c);
  for (int64_t step = 0; step <= kWarmup + kDecay + 2; ++step) {
    if (step > 0) t.train({.num_steps = 1});
    const auto rates = t.foreach_worker("learning_rate");
    ASSERT_EQ(rates.size(), 2u);
    for (const auto& rate : rates) {
      EXPECT_NEAR(rate.get<double>(), closed_form(step), 1e-12 * kLr) << "after " << step << " steps";
    }
  }
}

TEST(TrainerFailure, WithoutRetriesAKilledWorkerFailsTrainWithinSecondsNamingIt) {
  auto c = base_config(2, "allreduce", 64);
  c.recovery.heartbeat_timeout = milliseconds(3000);
  c.comm.timeout = milliseconds(5000);
  c.recovery.max_failures = 0;
  Trainer t(dsgd::kImageClassifier, c);
  const int victim = t.foreach_worker("replica_info")[1]["pid"].get<int>();
  std::thread killer([victim] {
    std::this_thread::sleep_for(milliseconds(800));
    ::kill(victim, SIGKILL);
  });
  const auto t0 = Clock::now();
  try {
    t.train();  // a whole epoch: far longer than the test
    FAIL() << "train survived a killed worker";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("giving up after 1 failures"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(victim)), std::string::npos) << e.what();
  }
  killer.join();
  EXPECT_LT(Clock::now() - t0, milliseconds(6000));
  EXPECT_THROW(t.train(), Error);  // unusable after a failure, and says so
}

TEST(TrainerFailure, AGroupThatCannotFormWithEveryWorkerAliveIsTriedThreeTimesThenNamed) {
  // Worker 1 can open nothing, so after worker 2 is killed the new group (with worker 2's
  // replacement, awaited) never forms while every member is alive: three generations are
  // tried, then train() fails listing them. (Without the replacement, worker 1 might form
  // worker 0's and its shared-memory group from what it holds open already.)
  auto c = base_config(3, "allreduce", 60);
  c.recovery.wait_for_replacements = true;
  c.recovery.heartbeat_timeout = milliseconds(20000);
  c.comm.timeout = milliseconds(2000);
  Trainer t(dsgd::kImageClassifier, c);
  const auto info = t.foreach_worker("replica_info");
  const int stuck = info[1]["pid"].get<int>(), victim = info[2]["pid"].get<int>();
  const auto done = t.foreach_worker("exhaust_descriptors", stuck);
  ASSERT_TRUE(done[1].get<bool>()) << "setrlimit failed";
  ::kill(victim, SIGKILL);
  try {
    t.train({.num_steps = 5});
    FAIL() << "the group formed although worker 1 could open no socket";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("did not form in 3 attempts, every worker alive"), std::string::npos) << what;
    for (const char* attempt : {"\n  1. generation ", "\n  2. generation ", "\n  3. generation "}) {
      EXPECT_NE(what.find(attempt), std::string::npos) << "no attempt '" << attempt << "' in: " << what;
    }
    EXPECT_NE(what.find("pid " + std::to_string(stuck)), std::string::npos) << what;
  }
  EXPECT_THROW(t.train(), Error);  // unusable after it, and says so
}

// Local workers are forks of a fork server of this binary (runtime/launch/fork_server.h): this
// process's children, with their own command lines; a killed one's replacement is forked too;
// and the job ends where the same job with every worker exec'd (DSGD_FORK_SERVER=0) does.
TEST(TrainerLaunch, LocalWorkersAreForkedFromAForkServerAndComputeWhatExecdOnesDo) {
  auto run = [](bool fork_server) {
    if (!fork_server) ::setenv("DSGD_FORK_SERVER", "0", 1);
    auto c = base_config(2, "allreduce", 64);
    c.recovery.wait_for_replacements = true;  // the same two replicas after the kill
    Trainer t(dsgd::kImageClassifier, c);
    t.train({.num_steps = 6});
    const auto servers = child_pids_with("--dsgd-fork-server");
    EXPECT_EQ(servers.size(), fork_server ? 1u : 0u) << "fork server " << fork_server;
    const auto workers = worker_pids();
    EXPECT_EQ(workers.size(), 2u);
    for (int pid : workers) {  // as exec'd: its environment, its command line
      std::ifstream env_file("/proc/" + std::to_string(pid) + "/environ");
      const std::string env((std::istreambuf_iterator<char>(env_file)), {});
      EXPECT_NE(env.find("DSGD_WORKER_OF=" + std::to_string(::getpid())), std::string::npos);
      std::ifstream cmd_file("/proc/" + std::to_string(pid) + "/cmdline");
      const std::string cmd((std::istreambuf_iterator<char>(cmd_file)), {});
      const std::string nul(1, '\0');
      EXPECT_EQ(cmd.rfind(runtime::self_executable() + nul + "--dsgd-worker" + nul + "--driver" + nul, 0), 0u) << cmd;
    }
    ::kill(workers.at(0), SIGKILL);
    EXPECT_EQ(t.train({.num_steps = 6}).recoveries.size(), 1u);
    EXPECT_EQ(worker_pids().size(), 2u);
    EXPECT_EQ(child_pids_with("--dsgd-fork-server"), servers) << "the replacement came from the same server";
    ::unsetenv("DSGD_FORK_SERVER");
    return params_of(*t.get_model());
  };
  const Params forked = run(true);
  const Params execd = run(false);
  EXPECT_LT(max_difference(forked, execd), 1e-7);
}

// The largest difference between two workers' models as all_parameters returns them; infinity
// where their shapes differ.
double models_difference(const json& a, const json& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t m = 0; m < a.size(); ++m) {
    if (a[m].size() != b[m].size()) return std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < a[m].size(); ++i) {
      worst = std::max(worst, std::abs(a[m][i].get<double>() - b[m][i].get<double>()));
    }
  }
  return worst;
}

// Two models, two optimizers and a custom train_batch (the GAN's shape): every replica holds the
// same two models after every step, 2 workers end where 1 worker with the global batch does, and
// a checkpoint brings back both models and both optimizers' state: a job that loads it goes on
// bit for bit as the job that saved it.
TEST(TrainerTwoModels, ReplicasStayIdenticalEqualOneWorkerAndACheckpointContinuesExactly) {
  const auto config = [](int workers) {
    TrainerConfig c = base_config(workers, "allreduce", 64);
    c.config = json::object();
    return c;
  };
  // The first worker's models, after checking that the second holds the same bit for bit.
  const auto same_replicas = [](Trainer& t) {
    const auto workers = t.foreach_worker("all_parameters");
    EXPECT_EQ(workers.size(), 2u);
    EXPECT_EQ(workers.at(0).size(), 2u) << "the generator and the discriminator";
    EXPECT_EQ(models_difference(workers.at(0), workers.at(1)), 0.0) << "the replicas parted";
    return workers.at(0);
  };
  testing::TempDir dir;
  Trainer two(operator_of<TwoModelOperator>(), config(2));
  const json before = two.foreach_worker("all_parameters")[0];
  two.train({.num_steps = 6});
  same_replicas(two);
  two.save(dir.file("ckpt"));
  two.train({.num_steps = 6});
  const json after = same_replicas(two);
  ASSERT_EQ(after.size(), 2u);
  for (size_t m = 0; m < 2; ++m) {
    EXPECT_GT(models_difference(json::array({before[m]}), json::array({after[m]})), 1e-3) << "model " << m;
  }

  Trainer loaded(operator_of<TwoModelOperator>(), config(2));
  loaded.load(dir.file("ckpt"));
  loaded.train({.num_steps = 6});
  EXPECT_EQ(models_difference(same_replicas(loaded), after), 0.0) << "the checkpoint did not continue exactly";

  Trainer one(operator_of<TwoModelOperator>(), config(1));
  one.train({.num_steps = 12});
  const double difference = models_difference(one.foreach_worker("all_parameters")[0], after);
  std::printf("2 workers %.2g from 1 worker after 12 steps\n", difference);
  EXPECT_LT(difference, 1e-5);
}

}  // namespace
}  // namespace dsgd
