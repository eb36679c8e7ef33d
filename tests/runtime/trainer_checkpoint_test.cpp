// Checkpoints: they move between worker counts and strategies, keep what must come back (the
// operator's state, schedules, feedback, momentum on ps shards), and a damaged one is named.
#include "runtime/checkpoint/sharded_checkpoint.h"
#include "runtime/driver/checkpoint.h"
#include "runtime/trainer_testing.h"

namespace dsgd {
namespace {

using namespace trainer_testing;

// 2 allreduce workers writing a checkpoint exactly every `every` steps into dir/ckpts, `keep` kept.
TrainerConfig checkpointing(const testing::TempDir& dir, int64_t every, int keep) {
  auto c = base_config(2, "allreduce", 64);
  c.checkpoints.dir = dir.file("ckpts");
  c.checkpoints.every_steps = every;
  c.checkpoints.max_overhead = 0;
  c.checkpoints.keep = keep;
  return c;
}

TEST(TrainerCheckpoint, SavedWithTwoAllreduceWorkersContinuesIdenticallyWithThreeSimple) {
  testing::TempDir dir;
  const std::string path = dir.file("ckpt");
  auto a_config = base_config(2, "allreduce", 60);
  Trainer a(dsgd::kImageClassifier, a_config);
  a.train({.num_steps = 10});
  a.save(path);
  // Sharded (docs/CHECKPOINTS.md): the manifest, a share per replica, and model.pt.
  ASSERT_TRUE(std::filesystem::exists(path + "/manifest.json"));
  ASSERT_TRUE(std::filesystem::exists(path + "/share-00000.bin"));
  ASSERT_TRUE(std::filesystem::exists(path + "/share-00001.bin"));
  ASSERT_TRUE(std::filesystem::exists(path + "/model.pt"));

  Trainer b(dsgd::kImageClassifier, base_config(3, "simple", 60));
  b.train({.num_steps = 3});  // a state of its own, which load must replace entirely
  EXPECT_GT(max_difference(params_of(*a.get_model()), params_of(*b.get_model())), 1e-4);
  b.load(path);
  EXPECT_LT(max_difference(params_of(*a.get_model()), params_of(*b.get_model())), 1e-7);
  auto ra = a.train({.num_steps = 5});
  auto rb = b.train({.num_steps = 5});
  EXPECT_EQ(ra.batch, 15);
  EXPECT_EQ(rb.batch, 15);  // the sampler position came with the checkpoint
  EXPECT_NEAR(ra.metrics.at("loss"), rb.metrics.at("loss"), 1e-5);
  EXPECT_LT(max_difference(params_of(*a.get_model()), params_of(*b.get_model())), 1e-5);
}

// With compression a checkpoint holds every replica's error feedback: a job of the same shape
// goes on from it bit for bit. One of another size or compression loads it too, from zero
// feedback (with a notice), and trains on.
TEST(TrainerCheckpoint, WithCompressionTheFeedbackComesBackAndOtherJobsLoadItFromZero) {
  testing::TempDir dir;
  const std::string path = dir.file("ckpt");
  auto c = base_config(2, "allreduce", 64);
  c.launch.local_hosts = 2;
  c.comm.compression = "powersgd";
  c.comm.powersgd_start_steps = 2;
  Trainer a(dsgd::kImageClassifier, c);
  a.train({.num_steps = 6});
  a.save(path);
  Trainer b(dsgd::kImageClassifier, c);
  b.load(path);
  a.train({.num_steps = 4});
  b.train({.num_steps = 4});
  EXPECT_EQ(max_difference(params_of(*a.get_model()), params_of(*b.get_model())), 0.0);
  {  // without the feedback the same job parts from it at once
    Trainer z(dsgd::kImageClassifier, c);
    std::filesystem::copy(path, dir.file("bare"));
    auto m = runtime::read_manifest(dir.file("bare"));
    ASSERT_EQ(m["blobs"].erase("feedback/0") + m["blobs"].erase("feedback/1"), 2u) << "a feedback per replica";
    m.erase("crc32");
    m["crc32"] = runtime::crc_of(m.dump());
    std::ofstream(dir.file("bare") + "/manifest.json") << m.dump();
    z.load(dir.file("bare"));
    z.train({.num_steps = 4});
    EXPECT_GT(max_difference(params_of(*a.get_model()), params_of(*z.get_model())), 0.0);
  }
  for (auto other : {base_config(3, "allreduce", 66), base_config(2, "allreduce", 64)}) {
    other.launch.local_hosts = 2;
    other.comm.compression = other.num_workers == 3 ? "powersgd" : "fp16";
    Trainer d(dsgd::kImageClassifier, other);
    d.load(path);
    auto r = d.train({.num_steps = 2});
    EXPECT_EQ(r.batch, 8);
    EXPECT_TRUE(std::isfinite(r.metrics.at("loss")));
  }
}

// A job loading another's checkpoint takes its state but keeps its own learning rate (what PBT's
// exploit relies on: the checkpoint's state, the perturbed values).
TEST(TrainerCheckpoint, LoadingTakesTheStateButKeepsThisJobsLearningRate) {
  testing::TempDir dir;
  auto c = base_config(1, "allreduce", 64);
  c.config["lr"] = 0.1;
  Trainer a(dsgd::kImageClassifier, c);
  a.train({.num_steps = 3});
  a.save(dir.file("ckpt"));
  c.config["lr"] = 0.025;
  Trainer b(dsgd::kImageClassifier, c);
  b.load(dir.file("ckpt"));
  EXPECT_DOUBLE_EQ(b.foreach_worker("learning_rate")[0].get<double>(), 0.025);
  EXPECT_LT(max_difference(params_of(*a.get_model()), params_of(*b.get_model())), 1e-7);
}

TEST(TrainerCheckpoint, SavedWithMomentumOnPsShardsContinuesIdenticallyUnderAllreduce) {
  expect_checkpoint_moves(ps_update_config(2, 2, 2), base_config(2, "allreduce", 64));
}

TEST(TrainerCheckpoint, SavedUnderAllreduceContinuesIdenticallyWithMomentumOnPsShards) {
  expect_checkpoint_moves(base_config(2, "allreduce", 64), ps_update_config(2, 2, 2));
}

TEST(TrainerCheckpoint, WithMomentumOnPsShardsTheReplicasOptimizersHoldNoneBetweenSnapshots) {
  // The momentum lives on the shards: the replicas hold a copy only between a snapshot's gather
  // and its read, and the saved state still has all of it (checked by the tests above).
  testing::TempDir dir;
  Trainer ps(dsgd::kImageClassifier, ps_update_config(2, 2, 2));
  ps.train({.num_steps = 12});
  ps.save(dir.file("ckpt"));
  for (const auto& n : ps.foreach_worker("optimizer_states")) EXPECT_EQ(n.get<int>(), 0);
  Trainer allreduce(dsgd::kImageClassifier, base_config(2, "allreduce", 64));
  allreduce.train({.num_steps = 2});
  for (const auto& n : allreduce.foreach_worker("optimizer_states")) EXPECT_GT(n.get<int>(), 0);
}

TEST(TrainerCheckpoint, SchedulesStepPerEpochOrBatchAndComeBackFromCheckpoints) {
  testing::TempDir dir;
  auto c = base_config(2, "allreduce", 64);
  c.config["synthetic_samples"] = 256;  // 4 batches per epoch
  c.config["lr_decay"] = 0.5;
  {
    Trainer t(dsgd::kImageClassifier, c);
    for (const auto& lr : t.foreach_worker("learning_rate")) EXPECT_DOUBLE_EQ(lr.get<double>(), 0.01);
    auto r = t.train();
    EXPECT_EQ(r.epoch, 1);
    EXPECT_EQ(r.batches_per_epoch, 4);
    for (const auto& lr : t.foreach_worker("learning_rate")) EXPECT_DOUBLE_EQ(lr.get<double>(), 0.005);
    t.save(dir.file("ckpt"));
  }
  c.num_workers = 1;
  Trainer loaded(dsgd::kImageClassifier, c);
  loaded.load(dir.file("ckpt"));
  EXPECT_DOUBLE_EQ(loaded.foreach_worker("learning_rate")[0].get<double>(), 0.005);
  c.step.scheduler_step_freq = "batch";
  Trainer per_batch(dsgd::kImageClassifier, c);
  per_batch.train({.num_steps = 3});
  EXPECT_DOUBLE_EQ(per_batch.foreach_worker("learning_rate")[0].get<double>(), 0.01 * 0.125);
}

// An operator's own state (state_dict) travels in checkpoints to every replica of the job that
// loads it, whatever its size.
TEST(TrainerCheckpoint, AnOperatorsOwnStateComesBackFromACheckpoint) {
  testing::TempDir dir;
  auto c = base_config(2, "allreduce", 64);
  c.step.scheduler_step_freq = SchedulerStepFreq::kManual;
  {
    Trainer t(operator_of<CountingOperator>(), c);
    t.train({.num_steps = 3});
    for (const auto& n : t.foreach_worker("counted_batches")) EXPECT_EQ(n.get<int64_t>(), 3);
    t.save(dir.file("ckpt"));
  }
  c.num_workers = 3;
  c.batch_size = 66;
  Trainer loaded(operator_of<CountingOperator>(), c);
  for (const auto& n : loaded.foreach_worker("counted_batches")) EXPECT_EQ(n.get<int64_t>(), 0);
  loaded.load(dir.file("ckpt"));
  for (const auto& n : loaded.foreach_worker("counted_batches")) EXPECT_EQ(n.get<int64_t>(), 3);
  loaded.train({.num_steps = 1});
  for (const auto& n : loaded.foreach_worker("counted_batches")) EXPECT_EQ(n.get<int64_t>(), 4);
}

TEST(TrainerCheckpoint, DamagedOrMissingCheckpointIsADataErrorNamingTheFile) {
  testing::TempDir dir;
  const std::string path = dir.file("ckpt");
  Trainer t(dsgd::kImageClassifier, base_config(1, "allreduce", 32));
  EXPECT_THROW(t.load(dir.file("nothing-here")), DataError);
  t.save(path);
  const std::string file = path + "/share-00000.bin";
  {  // one byte flipped inside the first tensor's data
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    const char was = static_cast<char>(f.get());
    f.seekp(100);
    f.put(static_cast<char>(was ^ 0x5a));
  }
  try {
    t.load(path);
    FAIL() << "a damaged checkpoint loaded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
    EXPECT_EQ(e.path(), file);
  }
  EXPECT_EQ(t.train({.num_steps = 1}).metrics.at("batches"), 1) << "a damaged file broke the job";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 1000);
  try {
    t.load(path);
    FAIL() << "a truncated checkpoint loaded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("cut short"), std::string::npos) << e.what();
    EXPECT_EQ(e.path(), file);
  }
  {  // the manifest damaged: one digit of a size changed
    std::string m = testing::read_file(path + "/manifest.json");
    const size_t at = m.find("\"bytes\": ") + 9;
    m[at] = static_cast<char>('0' + (m[at] - '0' + 1) % 10);
    std::ofstream(path + "/manifest.json", std::ios::binary) << m;
  }
  try {
    t.load(path);
    FAIL() << "a damaged manifest loaded";
  } catch (const DataError& e) {
    EXPECT_EQ(e.path(), path + "/manifest.json") << e.what();
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
  }
}

// The workers write a checkpoint_dir's checkpoints, so they come at every checkpoint_every_steps
// whatever a snapshot costs (checkpoint_max_overhead spaces out the driver's snapshots alone:
// SnapshotPolicy's tests); training waits only for the copies.
TEST(TrainerCheckpoint, CheckpointsByTheWorkersComeAtEveryIntervalWhateverASnapshotCosts) {
  for (const double overhead : {0.0, 0.01}) {
    testing::TempDir dir;
    auto c = checkpointing(dir, 1, 100);
    c.checkpoints.max_overhead = overhead;
    Trainer t(dsgd::kImageClassifier, c);
    const Results r = t.train({.num_steps = 12});
    EXPECT_EQ(r.metrics.at("batches"), 12);
    const auto kept = runtime::list_checkpoints(c.checkpoints.dir);
    ASSERT_EQ(kept.size(), 12u) << overhead;  // after steps 1..12
    EXPECT_TRUE(runtime::is_sharded_checkpoint(kept.back()));
    EXPECT_EQ(r.checkpoint_waits_s.size(), 12u);
    EXPECT_EQ(r.checkpoint_failures, 0);
  }
}

// forward_overlap_buckets auto trains its first steps in trial chunks of at most 6 steps (6 trials
// here): their snapshots wait for the interval, so a checkpoint_dir gets no checkpoint per trial.
TEST(TrainerCheckpoint, TheForwardOverlapsTrialChunksKeepTheCheckpointInterval) {
  testing::TempDir dir;
  auto c = checkpointing(dir, 10, 100);
  c.comm.forward_overlap_buckets = -1;
  Trainer t(dsgd::kImageClassifier, c);
  EXPECT_EQ(t.train({.num_steps = 20}).batch, 20);
  std::vector<std::string> names;
  for (const auto& k : runtime::list_checkpoints(c.checkpoints.dir))
    names.push_back(std::filesystem::path(k).filename());
  // Trials of 6 steps and then the 4 left of the interval (10 steps), then 6; checkpoints at the
  // interval and at the call's end only.
  EXPECT_EQ(names, (std::vector<std::string>{"step-000000000010", "step-000000000020"}));
  // Each checkpoint holds the state at its step: a job loading the first trains on as this one did.
  Trainer b(dsgd::kImageClassifier, base_config(1, "allreduce", 64));
  b.load(runtime::list_checkpoints(c.checkpoints.dir)[0]);
  EXPECT_EQ(b.train({.num_steps = 10}).batch, 20);
  EXPECT_LT(max_difference(params_of(*t.get_model()), params_of(*b.get_model())), 1e-5);
}

// A periodic checkpoint's parameters and optimizer state are copied while the next step's
// forward and backward run, its update held until the copy ends: the checkpoint of step 10,
// taken in the middle of a call, holds the bytes a save at step 10 writes, share for share.
TEST(TrainerCheckpoint, ACheckpointCopiedWhileTheNextStepRunsHoldsItsStepsStateByteForByte) {
  testing::TempDir dir;
  const auto c = checkpointing(dir, 10, 10);
  {
    Trainer t(dsgd::kImageClassifier, c);
    t.train({.num_steps = 20});  // the checkpoint of step 10 is written during steps 11-20
  }
  auto plain = base_config(2, "allreduce", 64);
  Trainer s(dsgd::kImageClassifier, plain);
  s.train({.num_steps = 10});
  s.save(dir.file("saved"));
  const std::string periodic = runtime::checkpoint_path(c.checkpoints.dir, 10);
  for (const std::string share : {"share-00000.bin", "share-00001.bin"}) {
    EXPECT_TRUE(testing::read_file(periodic + "/" + share) == testing::read_file(dir.file("saved") + "/" + share))
        << share << " differs from the save's at the same step";
  }
}

void flip_byte(const std::string& file, std::streamoff at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  const char was = static_cast<char>(f.get());
  f.seekp(at);
  f.put(static_cast<char>(was ^ 0x5a));
}

TEST(TrainerCheckpoint, CheckpointDirKeepsTheLastKAndLoadFallsBackPastADamagedOne) {
  testing::TempDir dir;
  const auto c = checkpointing(dir, 4, 2);
  Trainer t(dsgd::kImageClassifier, c);
  t.train({.num_steps = 10});  // checkpoints after steps 4, 8 and 10
  const auto kept = runtime::list_checkpoints(c.checkpoints.dir);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(std::filesystem::path(kept[0]).filename(), "step-000000000008");
  EXPECT_EQ(std::filesystem::path(kept[1]).filename(), "step-000000000010");
  // Written by the workers, a share each; the manifest by the driver.
  const nlohmann::json m = runtime::read_manifest(kept[1]);
  EXPECT_EQ(m.at("files").size(), 2u);
  EXPECT_EQ(m.at("header").at("batch"), 10);

  // The newest is damaged, a byte of a share flipped (found by the worker that reads it): a new
  // job of one worker passes over it, resumes from step 8, and continues exactly as the first did.
  flip_byte(kept[1] + "/share-00001.bin", 8192);
  auto b_config = base_config(1, "allreduce", 64);
  Trainer b(dsgd::kImageClassifier, b_config);
  b.load(c.checkpoints.dir);
  auto rb = b.train({.num_steps = 2});
  EXPECT_EQ(rb.batch, 10);
  EXPECT_LT(max_difference(params_of(*t.get_model()), params_of(*b.get_model())), 1e-5);
}

// A worker lost while a checkpoint's shares are being written (here between the copy and the
// commit, as the next checkpoint would make it): that checkpoint is never committed, so it is not
// there; it counts as failed; the others are whole and load; the job goes on.
TEST(TrainerCheckpoint, AWorkerLostWhileACheckpointIsWrittenLeavesItUncommittedAndTheRestLoadable) {
  testing::TempDir dir;
  auto c = checkpointing(dir, 4, 100);
  c.recovery.heartbeat_timeout = std::chrono::milliseconds(2000);
  Trainer t(dsgd::kImageClassifier, c);
  const int victim = t.foreach_worker("replica_info")[1]["pid"].get<int>();
  std::atomic<bool> killed{false};
  t.set_callbacks([&](const TrainProgress& p) {
    if (p.batches >= 6 && !killed.exchange(true)) ::kill(victim, SIGKILL);
  }, {});
  const Results r = t.train({.num_steps = 16});
  ASSERT_TRUE(killed);
  ASSERT_GE(r.recoveries.size(), 1u);
  EXPECT_EQ(r.batch, 16);
  // The one in flight, not those after (the replacement that joins between chunks has no share
  // of the one then in flight, and need not).
  EXPECT_EQ(r.checkpoint_failures, 1) << "the checkpoint in flight was not counted, or more were lost";
  const auto kept = runtime::list_checkpoints(c.checkpoints.dir);
  EXPECT_EQ(kept.size(), 3u);  // of steps 4, 8, 12, 16
  EXPECT_EQ(std::filesystem::path(kept.back()).filename(), "step-000000000016");
  for (const auto& e : std::filesystem::directory_iterator(c.checkpoints.dir)) {
    EXPECT_EQ(e.path().filename().string().rfind(".step-", 0), std::string::npos) << "left behind: " << e.path();
  }
  // Each one there is whole: a job of one worker loads it and stands at its step.
  for (const auto& k : kept) {
    Trainer b(dsgd::kImageClassifier, base_config(1, "allreduce", 64));
    b.load(k);
    EXPECT_EQ(b.train({.num_steps = 1}).batch, runtime::checkpoint_step(k) + 1) << k;
  }
}

TEST(TrainerCheckpoint, LoadingAStateFromBeforeTheFirstStepDropsMomentumBuffers) {
  // Found by the soak: a worker lost before the first snapshot restored the setup-time state,
  // which has no momentum buffers yet; survivors kept theirs and the replicas drifted apart.
  testing::TempDir dir;
  auto c = base_config(2, "allreduce", 64);
  Trainer a(dsgd::kImageClassifier, c);
  a.save(dir.file("fresh"));
  a.train({.num_steps = 5});
  a.load(dir.file("fresh"));
  a.train({.num_steps = 5});
  Trainer b(dsgd::kImageClassifier, c);
  b.train({.num_steps = 5});
  EXPECT_LT(max_difference(params_of(*a.get_model()), params_of(*b.get_model())), 1e-7);
}

TEST(TrainerCheckpoint, PythonTorchLoadReadsTheModel) {
  if (::access("/usr/bin/python3", X_OK) != 0 ||
      std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no /usr/bin/python3 with torch (Debian's python3-torch)";
  }
  testing::TempDir dir;
  Trainer t(dsgd::kImageClassifier, base_config(1, "allreduce", 32));
  t.save(dir.file("ckpt"));
  auto model = t.get_model();
  const double expected = model->named_parameters()["fc2.bias"].sum().item<double>();
  const std::string cmd = "/usr/bin/python3 -c \"import torch; d = torch.load('" + dir.file("ckpt/model.pt") +
                          "'); print(len(d), float(d['fc2.bias'].sum()))\" > " + dir.file("out.txt");
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(dir.file("out.txt"));
  size_t n = 0;
  double sum = 0;
  in >> n >> sum;
  EXPECT_EQ(n, model->named_parameters().size() + model->named_buffers().size());
  EXPECT_NEAR(sum, expected, 1e-5);
}

}  // namespace
}  // namespace dsgd
