// The Trainer end to end with real worker processes (this test binary, spawned): distributed
// training equals single-process training, checkpoints move between worker counts and
// strategies, bad input fails before anything is spawned, a lost worker is named within seconds.
#include "dsgd/trainer.h"

#include <gtest/gtest.h>

#include <ATen/Version.h>
#include <torch/cuda.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "dsgd/error.h"
#include "dsgd/image_classifier.h"
#include "dsgd/fit.h"
#include "dsgd/language_model.h"
#include "dsgd/text.h"
#include "dsgd/operator.h"
#include "runtime/driver/checkpoint.h"
#include "runtime/launch/spawn.h"
#include "runtime/worker/cpu_kernels.h"
#include "testing/params.h"
#include "testing/proc.h"
#include "testing/temp_dir.h"
#include "torch/grad_sync.h"
#include "torch/replica.h"

namespace dsgd {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

DSGD_REGISTER_WORKER_FUNCTION(replica_info, [](TrainingOperator* op, const json& arg) -> json {
  return {{"rank", op->replica().rank}, {"world", op->replica().world_size}, {"pid", ::getpid()},
          {"arg", arg}};
});

// The initialization hook counts its runs in the worker and notes whether an operator existed
// yet (it runs before setup: none); hook_runs_here reports both to the driver, where the test
// asserts them (an EXPECT in a worker process could not fail the test).
std::atomic<int> hook_runs{0};
std::atomic<int> hook_runs_with_operator{0};
DSGD_REGISTER_WORKER_FUNCTION(count_hook, [](TrainingOperator* op, const json&) -> json {
  ++hook_runs;
  if (op != nullptr) ++hook_runs_with_operator;
  return {};
});
DSGD_REGISTER_WORKER_FUNCTION(hook_runs_here, [](TrainingOperator*, const json&) -> json {
  return {{"runs", hook_runs.load()}, {"with_operator", hook_runs_with_operator.load()}};
});

// A worker that dies at start-up, before setup: with DSGD_TEST_DIE_ONCE=FILE the first worker to
// create FILE, with DSGD_TEST_DIE_ALWAYS set every worker.
DSGD_REGISTER_WORKER_FUNCTION(die_at_start, [](TrainingOperator*, const json&) -> json {
  if (std::getenv("DSGD_TEST_DIE_ALWAYS") != nullptr) ::raise(SIGKILL);
  if (const char* once = std::getenv("DSGD_TEST_DIE_ONCE")) {
    const int fd = ::open(once, O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd >= 0) ::raise(SIGKILL);
  }
  return {};
});

DSGD_REGISTER_WORKER_FUNCTION(optimizer_states, [](TrainingOperator* op, const json&) -> json {
  return op->optimizer(0).state().size();
});

DSGD_REGISTER_WORKER_FUNCTION(learning_rate, [](TrainingOperator* op, const json&) -> json {
  return op->optimizer(0).param_groups()[0].options().get_lr();
});

// Builds a model whose width depends on the worker: the driver must refuse to start.
struct Widening : torch::nn::Module {
  // width < 0: 1 on every worker (no mismatch).
  explicit Widening(int64_t width) { fc = register_module("fc", torch::nn::Linear(4, width < 0 ? 1 : width)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x); }
  torch::nn::Linear fc{nullptr};
};
class MismatchOperator : public TrainingOperator {
 public:
  void setup(const json&) override {
    register_model(std::make_shared<Widening>(3 + replica().worker));
    register_data(torch::zeros({8, 4}), torch::zeros({8}, torch::kInt64));
  }
};
DSGD_REGISTER_OPERATOR(MismatchOperator);

// The regression y = sum(x) on a 1-wide Linear, SGD at 0.1, 256 seeded samples: the test
// operators below each change one thing.
class RegressionOperator : public TrainingOperator {
 public:
  void setup(const json&) override {
    auto m = register_model(std::make_shared<Widening>(-2));  // width 1
    register_optimizer(make_optimizer(m->parameters()));
    register_loss([this](const torch::Tensor& out, const torch::Tensor& y) { return loss(out, y); });
    auto gen = at::detail::createCPUGenerator(replica().seed);
    auto x = torch::randn({samples(), 4}, gen);
    register_data(x, x.sum(1, true));
  }

 protected:
  virtual std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(std::move(params), 0.1);
  }
  virtual torch::Tensor loss(const torch::Tensor& out, const torch::Tensor& y) { return torch::mse_loss(out, y); }
  virtual int64_t samples() const { return 256; }
};

// Its loss turns NaN on replica 1's third batch.
class NanOperator : public RegressionOperator {
  torch::Tensor loss(const torch::Tensor& out, const torch::Tensor& y) override {
    auto l = torch::mse_loss(out, y);
    // The last replica's third loss (rank 1 of 2, or a lone replica's).
    if (replica().rank == replica().world_size - 1 && ++calls_ == 3) l = l * std::numeric_limits<float>::quiet_NaN();
    return l;
  }
  int calls_ = 0;
};
DSGD_REGISTER_OPERATOR(NanOperator);

// With Adam: the ps shards cannot apply it.
class AdamOperator : public RegressionOperator {
  std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<torch::Tensor> params) override {
    return std::make_unique<torch::optim::Adam>(std::move(params), 0.01);
  }
};
DSGD_REGISTER_OPERATOR(AdamOperator);

// The second replica sleeps `slow_ms` (config) in every step; SGD 0.02 with momentum, 1024 samples.
class SlowSecondReplicaOperator : public RegressionOperator {
  void setup(const json& config) override {
    slow_ms_ = config.value("slow_ms", 0);
    RegressionOperator::setup(config);
  }
  std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<torch::Tensor> params) override {
    return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(0.02).momentum(0.9));
  }
  int64_t samples() const override { return 1024; }
  Metrics train_batch(const Batch& batch) override {
    if (replica().rank == 1 && slow_ms_ > 0) std::this_thread::sleep_for(milliseconds(slow_ms_));
    return TrainingOperator::train_batch(batch);
  }
  int slow_ms_ = 0;
};
DSGD_REGISTER_OPERATOR(SlowSecondReplicaOperator);

// Kills its replica in state_dict (the driver's snapshot) while the file named by
// DSGD_TEST_DIE_IN_SNAPSHOT exists, removing it first: it dies once.
class DiesInSnapshotOperator : public RegressionOperator {
  void state_dict(torch::serialize::OutputArchive&) const override {
    const char* armed = std::getenv("DSGD_TEST_DIE_IN_SNAPSHOT");
    if (armed != nullptr && std::filesystem::remove(armed)) ::raise(SIGKILL);
  }
};
DSGD_REGISTER_OPERATOR(DiesInSnapshotOperator);

// Kills replica 1 in its first validation batch while the file named by
// DSGD_TEST_DIE_IN_VALIDATION exists, removing it first.
class DiesInValidationOperator : public RegressionOperator {
  void setup(const json& config) override {
    RegressionOperator::setup(config);
    auto gen = at::detail::createCPUGenerator(replica().seed + 1);
    auto x = torch::randn({samples(), 4}, gen);
    auto y = x.sum(1, true);
    register_data(torch::randn({samples(), 4}, gen), torch::zeros({samples(), 1}), x, y);
  }
  Metrics validate_batch(const Batch& batch) override {
    const char* armed = std::getenv("DSGD_TEST_DIE_IN_VALIDATION");
    if (replica().rank == 1 && armed != nullptr && std::filesystem::remove(armed)) ::raise(SIGKILL);
    return RegressionOperator::validate_batch(batch);
  }
};
DSGD_REGISTER_OPERATOR(DiesInValidationOperator);

// Kills replica 1 as its 15th batch begins (steps 0-13 done by every replica) while the file
// named by DSGD_TEST_DIE_AT_STEP exists, removing it first: it dies once, at a known step.
class DiesAtStepOperator : public RegressionOperator {
  Metrics train_batch(const Batch& batch) override {
    const char* armed = std::getenv("DSGD_TEST_DIE_AT_STEP");
    if (replica().rank == 1 && ++batches_ == 15 && armed != nullptr && std::filesystem::remove(armed)) {
      ::raise(SIGKILL);
    }
    return RegressionOperator::train_batch(batch);
  }
  int64_t samples() const override { return 1024; }  // 64 steps an epoch at batch 16
  int batches_ = 0;
};
DSGD_REGISTER_OPERATOR(DiesAtStepOperator);

// Counts the batches its replica trained in state of its own (state_dict/load_state_dict), and
// halves its learning rate every second batch by stepping its schedule itself (for
// scheduler_step_freq manual).
class CountingOperator : public RegressionOperator {
 public:
  void setup(const json& config) override {
    RegressionOperator::setup(config);
    register_scheduler([](int64_t t) { return std::pow(0.5, static_cast<double>(t)); });
  }
  Metrics train_batch(const Batch& batch) override {
    auto m = RegressionOperator::train_batch(batch);
    if (++batches_ % 2 == 0) step_schedulers();
    return m;
  }
  void state_dict(torch::serialize::OutputArchive& archive) const override {
    archive.write("batches", torch::tensor(batches_));
  }
  void load_state_dict(torch::serialize::InputArchive& archive) override {
    torch::Tensor t;
    archive.read("batches", t);
    batches_ = t.item<int64_t>();
  }
  int64_t batches_ = 0;
};
DSGD_REGISTER_OPERATOR(CountingOperator);
DSGD_REGISTER_WORKER_FUNCTION(counted_batches, [](TrainingOperator* op, const json&) -> json {
  return dynamic_cast<CountingOperator&>(*op).batches_;
});

// The regression's data (256 samples, 64 more for validation) registered as tensors, or with
// config "streamed" as datasets read by index (register_dataset), the training set counting the
// samples each replica asked for.
class CountingDataset final : public Dataset {
 public:
  explicit CountingDataset(std::shared_ptr<const Dataset> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  Batch get_batch(const torch::Tensor& indices) const override {
    read_ += indices.numel();
    return inner_->get_batch(indices);
  }
  std::shared_ptr<const Dataset> inner_;
  mutable std::atomic<int64_t> read_{0};
};
class StreamedOperator : public RegressionOperator {
 public:
  void setup(const json& config) override {
    auto m = register_model(std::make_shared<Widening>(-2));
    register_optimizer(make_optimizer(m->parameters()));
    register_loss([](const torch::Tensor& out, const torch::Tensor& y) { return torch::mse_loss(out, y); });
    auto gen = at::detail::createCPUGenerator(replica().seed);
    auto x = torch::randn({256 + 64, 4}, gen);
    auto y = x.sum(1, true);
    auto train_x = x.slice(0, 0, 256), train_y = y.slice(0, 0, 256);
    auto val_x = x.slice(0, 256), val_y = y.slice(0, 256);
    if (config.value("streamed", false)) {
      counting_ = std::make_shared<CountingDataset>(tensor_dataset(train_x, train_y));
      register_dataset(counting_, tensor_dataset(val_x, val_y));
    } else {
      register_data(train_x, train_y, val_x, val_y);
    }
  }
  std::shared_ptr<CountingDataset> counting_;
};
DSGD_REGISTER_OPERATOR(StreamedOperator);
DSGD_REGISTER_WORKER_FUNCTION(samples_read, [](TrainingOperator* op, const json&) -> json {
  const auto& c = dynamic_cast<StreamedOperator&>(*op).counting_;
  return c ? c->read_.load() : -1;
});

// Refuses a config key in setup(), in the worker: it registers no config check of its own.
class PickyOperator : public RegressionOperator {
  void setup(const json& config) override {
    if (config.contains("modle")) throw ConfigError("unknown picky config key 'modle'");
    RegressionOperator::setup(config);
  }
};
DSGD_REGISTER_OPERATOR(PickyOperator);

// The vectorised kernels LibTorch chose in the worker's process (runtime/worker/cpu_kernels.h).
DSGD_REGISTER_WORKER_FUNCTION(cpu_kernels, [](TrainingOperator*, const json&) -> json {
  const std::string config = at::show_config(), key = "CPU capability usage: ";
  const size_t at = config.find(key);
  if (at == std::string::npos) return std::string();
  return config.substr(at + key.size(), config.find('\n', at) - at - key.size());
});

DSGD_REGISTER_WORKER_FUNCTION(weight_sum, [](TrainingOperator* op, const json&) -> json {
  double s = 0;
  for (const auto& p : op->model(0).parameters()) s += p.sum().item<double>();
  return s;
});

// Every running_mean and running_var buffer of model 0 (BatchNorm's statistics), in order.
std::vector<float> running_stats(torch::nn::Module& model) {
  std::vector<float> out;
  for (const auto& b : model.named_buffers()) {
    if (b.key().find("running_") == std::string::npos || !b.value().is_floating_point()) continue;
    const auto t = b.value().to(torch::kCPU).contiguous().reshape({-1});
    out.insert(out.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  }
  return out;
}
DSGD_REGISTER_WORKER_FUNCTION(running_stats, [](TrainingOperator* op, const json&) -> json {
  return running_stats(op->model(0));
});

// How the replica's convolution weights are laid out: "channels_last", "nchw" (or "mixed").
DSGD_REGISTER_WORKER_FUNCTION(conv_layout, [](TrainingOperator* op, const json&) -> json {
  int last = 0, plain = 0;
  for (const auto& p : op->model(0).parameters()) {
    if (p.dim() != 4 || p.is_contiguous() == p.is_contiguous(torch::MemoryFormat::ChannelsLast)) continue;
    (p.is_contiguous(torch::MemoryFormat::ChannelsLast) ? last : plain)++;
  }
  return last > 0 && plain == 0 ? "channels_last" : plain > 0 && last == 0 ? "nchw" : "mixed";
});

// Small enough to train 20 steps in a second, with several buckets and several layers.
json synthetic_config() {
  return {{"model", "cnn"}, {"dataset", "synthetic"}, {"synthetic_samples", 4096}, {"synthetic_image_size", 28},
          {"lr", 0.01}, {"momentum", 0.9}, {"dropout", false}};
}

TrainerConfig base_config(int workers, const std::string& strategy, int64_t batch) {
  TrainerConfig c;
  c.num_workers = workers;
  c.strategy = strategy;
  c.batch_size = batch;
  c.seed = 7;
  c.config = synthetic_config();
  c.comm.grad_shard_bytes = 1 << 20;  // the CNN's 4.8 MB of gradients in 5 buckets
  c.threads_per_worker = 1;
  c.device = "cpu";  // the CPU's results, also on a machine with a GPU (TrainerGpu tests that)
  return c;
}

using testing::max_difference;
using testing::Params;
using testing::params_of;

// One process, no dsgd communication: the global batch at once (its model's BatchNorm
// statistics into *stats, if given).
Params single_process(int64_t batch, int64_t steps, const json& config = synthetic_config(),
                      const StepConfig& step = {}, Metrics* metrics = nullptr, std::vector<float>* stats = nullptr) {
  dsgd::register_builtin_operators();
  torch_glue::ReplicaOptions o;
  o.global_batch = batch;
  o.seed = 7;
  o.info.seed = 7;
  o.threads = 1;
  o.step = step;
  torch_glue::ReplicaRuntime r(make_operator(dsgd::kImageClassifier), o);
  r.setup(config);
  for (int64_t left = steps; left > 0;) {  // across epochs, as Trainer::train calls would
    const Metrics m = r.train(left, false);
    if (metrics != nullptr) *metrics = m;
    const auto done = static_cast<int64_t>(m.at("batches"));
    if (done == 0) break;
    left -= done;
  }
  if (stats != nullptr) *stats = running_stats(r.op().model(0));
  return params_of(r.op().model(0));
}

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

// Data parallelism's claim: the replicas' weighted average of their shards' gradients is the
// global batch's gradient. In float32 they round differently from one process's single batch; on
// an AVX2 machine 20 steps ended 2.6e-6 apart (8.3e-6 for the uneven split), a drift that depends
// on the CPU's kernels (40 steps: 5.5e-5 on one machine, under 1e-5 on another). 5e-5 leaves room
// for that and still fails any real error: weighting the uneven split's 32 and 31 samples alike
// ends 4.8e-3 apart, and a lost or unaveraged gradient further.
void expect_equivalent(TrainerConfig config, int64_t steps = 20) {
  const Params reference = single_process(config.batch_size, steps, config.config, config.step);
  Trainer trainer(dsgd::kImageClassifier, config);
  const Params before = params_of(*trainer.get_model());
  auto r = trainer.train({.num_steps = steps});
  EXPECT_EQ(r.batch, steps);
  EXPECT_EQ(r.metrics.at("num_samples"), static_cast<double>(steps * config.batch_size));
  const Params after = params_of(*trainer.get_model());
  EXPECT_GT(max_difference(before, after), 1e-3) << "training did not move the parameters";
  EXPECT_LT(max_difference(reference, after), 5e-5);
}

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
  EXPECT_NEAR(r.metrics.at("grad_norm"), one.at("grad_norm"), 1e-4 * one.at("grad_norm"));
  EXPECT_LT(max_difference(reference, clipped), 5e-5);
  const Params unclipped = single_process(c.batch_size, kSteps, c.config);
  std::printf("grad_norm %.3f (one process %.3f), bound %.2f: 2 workers %.2g from one process, %.2g from unclipped\n",
              r.metrics.at("grad_norm"), one.at("grad_norm"), c.step.max_grad_norm, max_difference(reference, clipped),
              max_difference(unclipped, clipped));
  EXPECT_GT(max_difference(unclipped, clipped), 1e-3) << "clipping changed nothing";
}

// gpt-tiny, 2 workers, on a token file of `lines` lines of text written into `dir`, with AdamW,
// 5 warmup steps and cosine decay over `decay_steps`, stepped per batch.
TrainerConfig language_model_job(const testing::TempDir& dir, int lines, int64_t decay_steps) {
  std::string text;
  for (int i = 0; i < lines; ++i) text += "verse " + std::to_string(i * 7919 % 1000) + " of the text\n";
  data::write_token_file(dir.file("train.tok"), data::encode_bytes(text), 256);
  TrainerConfig c{.num_workers = 2, .batch_size = 16, .device = "cpu", .seed = 7, .threads_per_worker = 1};
  c.config = {{"model", "gpt-tiny"}, {"train_tokens", dir.file("train.tok")}, {"context", 32}, {"lr", 1e-3},
              {"warmup_steps", 5}, {"decay_steps", decay_steps}};
  c.step.scheduler_step_freq = SchedulerStepFreq::kBatch;
  return c;
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

// step.zero_stage 1: each replica's optimizer holds state for its share of the parameters only
// and steps only those; the shares are summed into every replica after the step. Stage 2 also
// keeps only its share's averaged gradients, the others passing through a ring of 8 buckets
// (small buckets here, so that the ring turns over many times a backward). The parameters must be
// those of plain allreduce (the same averaged gradients, the same optimizer arithmetic per
// tensor), and each replica's optimizer state about 1/N of plain's. Fails if the parameters are
// not shared (replicas keep the others' old values), if a replica steps a parameter it does not
// own twice over, if the state is not sharded, if a ring buffer is reused before its bucket is
// averaged or its owned averages copied out, or if stage 2 keeps every gradient.
void expect_zero_equals_plain(TrainerConfig c, const std::string& op, int64_t steps, double tolerance = 1e-6,
                              bool balanced = false) {
  c.comm.grad_shard_bytes = 64 << 10;
  struct Run {
    testing::Params params;
    double state_bytes, gradient_bytes;
  };
  const auto run = [&](int stage) {
    c.step.zero_stage = stage;
    Trainer t(op, c);
    const auto r = t.train({.num_steps = steps});
    EXPECT_EQ(r.batch, steps);
    return Run{params_of(*t.get_model()), r.metrics.at("optimizer_state_bytes"), r.metrics.at("gradient_bytes")};
  };
  const double ring_bytes = [&] {  // stage 2's ring: 8 buffers, each as large as its largest bucket
    Trainer t(op, c);
    std::vector<size_t> counts;
    for (const auto& p : t.get_model()->parameters()) counts.push_back(static_cast<size_t>(p.numel()));
    return 4.0 * static_cast<double>(torch_glue::GradSync::ring_elements(counts, c.comm.grad_shard_bytes));
  }();
  const Run plain = run(0);
  const double n = c.num_workers;
  EXPECT_GT(plain.state_bytes, 0);
  for (int stage : {1, 2}) {
    const Run zero = run(stage);
    const double difference = max_difference(plain.params, zero.params);
    std::printf("%s, %d workers: zero %d %.2g from plain allreduce; optimizer state %.0f bytes a replica (plain "
                "%.0f), gradients %.0f bytes (plain %.0f)\n",
                op.c_str(), c.num_workers, stage, difference, zero.state_bytes, plain.state_bytes, zero.gradient_bytes,
                plain.gradient_bytes);
    // Accumulating, stage 2 averages each micro-batch by itself and adds the averages, where plain
    // averages the sum: another rounding (9.8e-7 and 1.3e-6 from plain with AdamW after 20 steps,
    // as the GPT's kernels round; stage 1, summing as plain does, 0).
    const double limit = stage == 2 && c.step.accumulate_steps > 1 ? 3 * tolerance : tolerance;
    EXPECT_LT(difference, limit) << "stage " << stage;
    EXPECT_LT(zero.state_bytes, plain.state_bytes / n * 1.35) << "the state is not sharded at stage " << stage;
    EXPECT_GT(zero.state_bytes, plain.state_bytes / n * 0.65) << "stage " << stage;
    if (stage == 1) EXPECT_EQ(zero.gradient_bytes, plain.gradient_bytes);
    // The image classifier's largest layer is most of it, and its owner keeps its gradient: only
    // a model of many like-sized tensors shows the share.
    if (stage == 2 && balanced) {
      EXPECT_LT(zero.gradient_bytes, plain.gradient_bytes / n * 1.35 + ring_bytes) << "every gradient is kept";
      EXPECT_LT(zero.gradient_bytes, plain.gradient_bytes * 0.85);
    }
  }
}

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

// sync_batchnorm (dsgd/sync_batchnorm.h): each BatchNorm layer normalises with the statistics of
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
  EXPECT_THROW(Trainer(dsgd::kImageClassifier, [] {
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

// ps: shards inside the workers; pseudo-hosts put the shard exchange on Gloo, as across machines.
TrainerConfig ps_config(int workers, int hosts, int shards, int64_t batch = 64) {
  auto c = base_config(workers, "ps", batch);
  c.launch.local_hosts = hosts;
  c.ps.shards = shards;
  return c;
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

// ps with update on shards: the owners apply SGD (momentum 0.9) to their slices.
TrainerConfig ps_update_config(int workers, int hosts, int shards, int64_t batch = 64) {
  auto c = ps_config(workers, hosts, shards, batch);
  c.ps.update_on_shards = true;
  return c;
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


// ps with the shards in processes of their own (spawned by the driver), in both update modes.
TrainerConfig ps_processes_config(int workers, int hosts, int shards, bool update_on_shards, int64_t batch = 64) {
  auto c = ps_config(workers, hosts, shards, batch);
  c.ps.placement = "processes";
  c.ps.update_on_shards = update_on_shards;
  return c;
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
  c.config["lr_decay"] = 0.9;      // a new learning rate every step: each deferred step takes its own
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

// ps_async: 2 workers on 2 pseudo-hosts, 2 shards, worker 1 sleeping 40 ms per step.
struct SlowRun {
  double fast_s, slow_s, slow_staleness_max;
  std::vector<double> weight_sums;
};
SlowRun run_with_a_slow_worker(const std::string& strategy, int max_staleness) {
  TrainerConfig c;
  c.num_workers = 2;
  c.strategy = strategy;
  c.launch.local_hosts = 2;
  c.ps.shards = 2;
  c.ps.max_staleness = max_staleness;
  c.batch_size = 64;
  c.threads_per_worker = 1;
  c.config = {{"slow_ms", 40}};
  Trainer t("SlowSecondReplicaOperator", c);
  auto r = t.train({.num_steps = 12, .profile = true, .reduce_results = false});
  EXPECT_EQ(r.batch, 12);
  SlowRun out{r.per_worker.at(0).at("epoch_s"), r.per_worker.at(1).at("epoch_s"),
              r.per_worker.at(1).count("staleness_max") ? r.per_worker.at(1).at("staleness_max") : -1.0, {}};
  for (const auto& w : t.foreach_worker("weight_sum")) out.weight_sums.push_back(w.get<double>());
  return out;
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

TEST(TrainerCheckpoint, SavedWithTwoAllreduceWorkersContinuesIdenticallyWithThreeSimple) {
  testing::TempDir dir;
  const std::string path = dir.file("ckpt");
  auto a_config = base_config(2, "allreduce", 60);
  Trainer a(dsgd::kImageClassifier, a_config);
  a.train({.num_steps = 10});
  a.save(path);
  ASSERT_TRUE(std::filesystem::exists(path + "/checkpoint.dsgd"));
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

// Trains `from` 10 steps, saves, loads into a fresh `to` job; both go on 5 steps and must agree.
// The momentum (0.9) must come along: without it the two part at once.
void expect_checkpoint_moves(const TrainerConfig& from, const TrainerConfig& to) {
  testing::TempDir dir;
  const std::string path = dir.file("ckpt");
  Trainer a(dsgd::kImageClassifier, from);
  a.train({.num_steps = 10});
  a.save(path);
  Trainer b(dsgd::kImageClassifier, to);
  b.load(path);
  EXPECT_LT(max_difference(params_of(*a.get_model()), params_of(*b.get_model())), 1e-7);
  auto ra = a.train({.num_steps = 5});
  auto rb = b.train({.num_steps = 5});
  EXPECT_EQ(rb.batch, 15);
  EXPECT_NEAR(ra.metrics.at("loss"), rb.metrics.at("loss"), 1e-5);
  EXPECT_LT(max_difference(params_of(*a.get_model()), params_of(*b.get_model())), 1e-5);
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
    auto ck = runtime::read_checkpoint(path);
    ASSERT_EQ(ck.feedback.size(), 2u) << "a feedback per replica";
    ck.feedback.clear();
    runtime::write_checkpoint(dir.file("bare"), ck, "");
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

// register_dataset: the same samples read by index as each replica needs them train exactly as
// the same tensors registered whole, and validate the same; each replica reads its own share of
// each global batch and nothing else (no sample read twice, none loaded up front).
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

// Trains `base` under fp32 and under bf16 autocast (lr 0.05): `steps` steps, the loss of the
// first and last `probe` steps compared. Each loss must fall and the replicas stay identical;
// the two precisions must end near each other by different paths (autocast changed the
// arithmetic). The GPU test runs it too.
void expect_bf16_trains_like_fp32(TrainerConfig base, int64_t probe, int64_t steps, double tolerance) {
  std::map<Precision, std::pair<double, Params>> runs;
  for (const auto precision : {Precision::kFp32, Precision::kBf16}) {
    auto c = base;
    c.step.precision = precision;
    c.config["lr"] = 0.05;
    Trainer t(dsgd::kImageClassifier, c);
    const double first = t.train({.num_steps = probe}).metrics.at("loss");
    t.train({.num_steps = steps});
    const double last = t.train({.num_steps = probe}).metrics.at("loss");
    const std::string name = Choice<Precision>(precision).name();
    std::cout << name << ": loss " << first << " -> " << last << "\n";
    EXPECT_LT(last, first) << name;
    const auto prints = t.foreach_worker("weight_sum");
    for (const auto& p : prints) EXPECT_EQ(p, prints[0]) << "replicas differ under " << name;
    runs[precision] = {last, params_of(*t.get_model())};
  }
  EXPECT_NEAR(runs[Precision::kBf16].first, runs[Precision::kFp32].first, tolerance);
  EXPECT_GT(max_difference(runs[Precision::kBf16].second, runs[Precision::kFp32].second), 1e-5)
      << "bf16 ran as float32";
}

// bf16 autocast on the CPU through the Trainer, 2 workers: the CNN's loss falls as in float32.
TEST(TrainerPrecision, Bf16OnTheCpuTrainsTheCnnLikeFloat32) {
  expect_bf16_trains_like_fp32(base_config(2, "allreduce", 64), 3, 12, 0.15);
}

TEST(TrainerCheckpoint, DamagedOrMissingCheckpointIsADataErrorNamingTheFile) {
  testing::TempDir dir;
  const std::string path = dir.file("ckpt");
  Trainer t(dsgd::kImageClassifier, base_config(1, "allreduce", 32));
  EXPECT_THROW(t.load(dir.file("nothing-here")), DataError);
  t.save(path);
  const std::string file = path + "/checkpoint.dsgd";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x5a');
  }
  try {
    t.load(path);
    FAIL() << "a damaged checkpoint loaded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
    EXPECT_EQ(e.path(), file);
  }
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 1000);
  try {
    t.load(path);
    FAIL() << "a truncated checkpoint loaded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

// checkpoint_max_overhead spaces snapshots out where they cost much next to a step: here every
// step would be one, and a snapshot (a gRPC round trip and a serialisation) costs more than 1%
// of a step of this tiny model. With 0, exactly every step.
TEST(TrainerCheckpoint, CostlySnapshotsAreSpacedOutToTheOverheadBudget) {
  for (const double overhead : {0.0, 0.01}) {
    testing::TempDir dir;
    auto c = base_config(2, "allreduce", 64);
    c.checkpoints.dir = dir.file("ckpts");
    c.checkpoints.every_steps = 1;
    c.checkpoints.keep = 100;
    c.checkpoints.max_overhead = overhead;
    Trainer t(dsgd::kImageClassifier, c);
    const Results r = t.train({.num_steps = 12});
    EXPECT_EQ(r.metrics.at("batches"), 12);
    const auto kept = runtime::list_checkpoints(c.checkpoints.dir);
    if (overhead == 0) {
      EXPECT_EQ(kept.size(), 12u);  // after steps 1..11, and at the end
    } else {
      EXPECT_LT(kept.size(), 6u) << "snapshots were not spaced out";
      EXPECT_GE(kept.size(), 2u);   // the first chunk's, and the end's
    }
  }
}

// forward_overlap_buckets auto trains its first steps in trial chunks of at most 6 steps (6 trials
// here): their snapshots wait for the interval, so a checkpoint_dir gets no checkpoint per trial.
TEST(TrainerCheckpoint, TheForwardOverlapsTrialChunksKeepTheCheckpointInterval) {
  testing::TempDir dir;
  auto c = base_config(2, "allreduce", 64);
  c.comm.forward_overlap_buckets = -1;
  c.checkpoints.dir = dir.file("ckpts");
  c.checkpoints.every_steps = 10;
  c.checkpoints.max_overhead = 0;
  c.checkpoints.keep = 100;
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

TEST(TrainerCheckpoint, CheckpointDirKeepsTheLastKAndLoadFallsBackPastADamagedOne) {
  testing::TempDir dir;
  auto c = base_config(2, "allreduce", 64);
  c.checkpoints.dir = dir.file("ckpts");
  c.checkpoints.every_steps = 4;
  c.checkpoints.max_overhead = 0;  // exactly that interval
  c.checkpoints.keep = 2;
  Trainer t(dsgd::kImageClassifier, c);
  t.train({.num_steps = 10});  // snapshots after steps 4, 8 and 10
  const auto kept = runtime::list_checkpoints(c.checkpoints.dir);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(std::filesystem::path(kept[0]).filename(), "step-000000000008");
  EXPECT_EQ(std::filesystem::path(kept[1]).filename(), "step-000000000010");
  EXPECT_TRUE(std::filesystem::exists(kept[1] + "/model.pt"));

  // The newest is damaged: a new job resumes from step 8, and continues exactly as the first did.
  std::filesystem::resize_file(kept[1] + "/checkpoint.dsgd",
                               std::filesystem::file_size(kept[1] + "/checkpoint.dsgd") / 2);
  auto b_config = base_config(1, "allreduce", 64);
  Trainer b(dsgd::kImageClassifier, b_config);
  b.load(c.checkpoints.dir);
  auto rb = b.train({.num_steps = 2});
  EXPECT_EQ(rb.batch, 10);
  EXPECT_LT(max_difference(params_of(*t.get_model()), params_of(*b.get_model())), 1e-5);
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

// ---- bad input: errors before anything is spawned ----

void expect_config_error(const std::string& op, TrainerConfig c, const std::string& needle) {
  const auto t0 = Clock::now();
  try {
    Trainer t(op, c);
    FAIL() << "accepted; expected an error mentioning '" << needle << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, milliseconds(500)) << "the check should come before any process starts";
}

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
  for (const int stage : {-1, 3}) {
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

// NanOperator's jobs: 16 samples per worker.
TrainerConfig nan_config(int workers) {
  TrainerConfig c;
  c.num_workers = workers;
  c.batch_size = 16 * workers;
  return c;
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

// In the worker whose pid is `arg`: no more file descriptors (the limit lowered to the lowest
// free one), so it stays alive and answers, but cannot open a socket or a store connection.
DSGD_REGISTER_WORKER_FUNCTION(exhaust_descriptors, [](TrainingOperator*, const json& arg) -> json {
  if (arg.get<int>() != ::getpid()) return false;
  const int lowest = ::dup(0);
  ::close(lowest);
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = static_cast<rlim_t>(lowest);
  return ::setrlimit(RLIMIT_NOFILE, &r) == 0;
});

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

// This process's live children with `flag` on their command line.
std::vector<int> child_pids_with(const std::string& flag) {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string st = testing::read_proc(e.path() / "stat"), cmd = testing::read_proc(e.path() / "cmdline");
    const auto close = st.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(st.substr(close + 1));
    std::string state;
    int ppid = 0;
    fields >> state >> ppid;
    if (ppid == ::getpid() && state != "Z" && cmd.find(flag) != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

// Its ps shard processes (--dsgd-ps-server) and its workers (--dsgd-worker).
std::vector<int> shard_process_pids() { return child_pids_with("--dsgd-ps-server"); }
std::vector<int> worker_pids() { return child_pids_with("--dsgd-worker"); }

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

// 2 workers of a regression operator that kills a replica itself (DiesAtStepOperator,
// DiesInSnapshotOperator), a snapshot exactly every `every_steps`, one standby.
TrainerConfig self_killing_config(int64_t batch, int64_t every_steps) {
  auto c = base_config(2, "allreduce", batch);
  c.config = json::object();
  c.checkpoints.every_steps = every_steps;
  c.checkpoints.max_overhead = 0;  // exactly that interval
  c.recovery.heartbeat_timeout = milliseconds(2000);
  c.recovery.standby_workers = 1;
  return c;
}

// Waits until t's standby is set up (on a busy machine it may take longer than a few steps), so
// that a loss armed next is taken over by it rather than survived by the survivors alone.
void await_standby(Trainer& t) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (t.ready_standbys() < 1 && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(t.ready_standbys(), 1);
}

// Runs 40 steps with a snapshot every 10 and does `fault` to worker 1 (with `shard_victim`: to
// a ps shard process) once 15 steps are done; training must finish with parameters equal to a
// fault-free run of the same job, to `tolerance` (the same replicas afterwards: `c` has a
// standby, or waits for replacements). (Not to a single process: 2 workers' averaged
// gradients round differently from one batch's, and over 40 steps that drift reached 5.5e-5 on
// one machine and stayed under 1e-5 on another.)
Results train_through_fault(TrainerConfig c, int sig, std::vector<int>* victims = nullptr, double tolerance = 1e-7,
                            bool shard_victim = false, const std::function<void(Trainer&)>& after = {},
                            const std::string& op = dsgd::kImageClassifier) {
  c.checkpoints.every_steps = 10;
  c.checkpoints.max_overhead = 0;  // exactly that interval
  c.recovery.heartbeat_timeout = milliseconds(2000);
  c.comm.timeout = milliseconds(10000);
  const Params reference = [&] {
    Trainer clean(op, c);
    EXPECT_EQ(clean.train({.num_steps = 40}).recoveries.size(), 0u);
    return params_of(*clean.get_model());
  }();
  std::atomic<bool> done{false};
  int victim = 0;
  c.on_progress = [&](const TrainProgress& p) {
    if (p.batches >= 15 && !done.exchange(true)) ::kill(victim, sig);
  };
  Trainer t(op, c);
  if (shard_victim) {
    const auto shards = shard_process_pids();
    EXPECT_EQ(shards.size(), static_cast<size_t>(c.ps.shards));
    if (shards.empty()) return {};
    victim = shards.back();
  } else {
    victim = t.foreach_worker("replica_info")[1]["pid"].get<int>();
  }
  if (victims != nullptr) victims->push_back(victim);
  auto r = t.train({.num_steps = 40});
  EXPECT_TRUE(done) << "the fault was never injected";
  EXPECT_EQ(r.batch, 40);
  EXPECT_EQ(r.metrics.at("batches"), 40.0);
  const double difference = max_difference(reference, params_of(*t.get_model()));
  EXPECT_LT(difference, tolerance);
  std::cout << "largest difference from the fault-free run: " << difference << "\n";
  if (shard_victim) {  // replaced
    const auto now = shard_process_pids();
    EXPECT_EQ(now.size(), static_cast<size_t>(c.ps.shards)) << "the lost shard process was not replaced";
    EXPECT_EQ(std::count(now.begin(), now.end(), victim), 0);
  }
  if (after) after(t);
  if (sig == SIGSTOP) ::kill(victim, SIGKILL);  // it was evicted; do not leave it stopped
  return r;
}

// The standby takes the state of a survivor (recovery.from_peer, the default): no completed step
// is trained again, and the survivors' generator goes back to where their last step ended, so
// the interrupted step draws the same dropout masks again.
TEST(TrainerRecovery, AStandbyTakesAKilledWorkersPlaceAndTheResultEqualsAFaultFreeRun) {
  std::vector<int> victims;
  auto c = base_config(3, "allreduce", 66);
  c.launch.local_hosts = 2;  // the standby takes the victim's pseudo-host (Placement::hosts)
  c.recovery.standby_workers = 1;
  c.config["dropout"] = true;  // the generator's state comes with the snapshot: the same masks
  size_t processes = 0;
  auto r = train_through_fault(c, SIGKILL, &victims, 1e-7, false, [&](Trainer&) {
    // A new standby is started in the background: 3 members and 1 standby again.
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while ((processes = worker_pids().size()) != 4 && Clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(100));
  });
  EXPECT_EQ(processes, 4u);
  ASSERT_EQ(r.recoveries.size(), 1u);
  const auto& ev = r.recoveries[0];
  EXPECT_EQ(ev.standbys_used, 1);
  EXPECT_EQ(ev.workers_after, 3);
  EXPECT_TRUE(ev.from_peer);
  EXPECT_EQ(ev.rolled_back_steps, 0);
  EXPECT_EQ(ev.caught_up_s, ev.recovery_s);  // nothing to redo
  std::cout << "standby recovery: " << ev.recovery_s << " s, detected " << ev.detect_s << " s after the failure\n";
}

// A worker killed at step 14, in the chunk of steps 10-19 (a snapshot every 10): from a peer
// nothing is rolled back; with recovery.from_peer off the snapshot at step 10 is restored and
// the chunk trained again from its start, so its 4 steps done are rolled back and caught_up_s
// adds the time their redoing took. Both end where the fault-free run does.
TEST(TrainerRecovery, FromAPeerNothingIsRolledBackFromTheSnapshotTheChunksStepsAreRedone) {
  testing::TempDir dir;
  const std::string armed = dir.file("die-at-step");
  ::setenv("DSGD_TEST_DIE_AT_STEP", armed.c_str(), 1);
  auto c = self_killing_config(16, 10);
  const auto op = operator_of<DiesAtStepOperator>();
  const Params reference = [&] {
    Trainer clean(op, c);
    EXPECT_EQ(clean.train({.num_steps = 30}).recoveries.size(), 0u);
    return params_of(*clean.get_model());
  }();
  for (const bool from_peer : {true, false}) {
    c.recovery.from_peer = from_peer;
    Trainer t(op, c);
    await_standby(t);
    std::ofstream(armed) << "die\n";
    const auto r = t.train({.num_steps = 30});
    EXPECT_FALSE(std::filesystem::exists(armed)) << "the victim never reached step 14";
    ASSERT_EQ(r.recoveries.size(), 1u);
    const auto& ev = r.recoveries[0];
    EXPECT_EQ(ev.from_peer, from_peer);
    EXPECT_EQ(r.batch, 30);
    EXPECT_EQ(r.metrics.at("batches"), 30.0);
    EXPECT_EQ(r.metrics.at("num_samples"), 30.0 * 16);  // the kept steps' samples too
    EXPECT_LT(max_difference(reference, params_of(*t.get_model())), 1e-7);
    if (from_peer) {
      EXPECT_EQ(ev.rolled_back_steps, 0);
      EXPECT_EQ(ev.caught_up_s, ev.recovery_s);
    } else {
      EXPECT_EQ(ev.rolled_back_steps, 4);
      EXPECT_GT(ev.caught_up_s, ev.recovery_s);
      EXPECT_LT(ev.caught_up_s, ev.recovery_s + 4.0);  // well under 1 s a step
    }
    std::printf("from %s: %lld steps rolled back, recovered in %.3f s, caught up in %.3f s\n",
                from_peer ? "a peer" : "the snapshot", static_cast<long long>(ev.rolled_back_steps), ev.recovery_s,
                ev.caught_up_s);
  }
  ::unsetenv("DSGD_TEST_DIE_AT_STEP");
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

// The language model reads its sequences from a token file as it goes (a streaming dataset): a
// worker killed mid-epoch, between the snapshots at steps 10 and 20, its standby takes its place
// and reads on from the snapshot's position (recovery.from_peer off: the snapshot is restored
// and every replica seeks back), and the job ends where the fault-free run does. (The
// kill comes between two calls, at step 15 exactly: gpt-tiny's steps are faster than progress
// reports, and a kill timed by them landed on a snapshot under load.)
TEST(TrainerRecovery, AKilledWorkerUnderAStreamingDatasetEndsAsTheFaultFreeRun) {
  testing::TempDir dir;
  TrainerConfig c = language_model_job(dir, 1600, 40);
  c.recovery.standby_workers = 1;
  c.recovery.from_peer = false;
  c.checkpoints.every_steps = 10;
  c.checkpoints.max_overhead = 0;
  c.recovery.heartbeat_timeout = milliseconds(2000);
  dsgd::register_builtin_operators();
  const Params reference = [&] {
    Trainer clean(kLanguageModel, c);
    EXPECT_EQ(clean.train({.num_steps = 40}).recoveries.size(), 0u);
    return params_of(*clean.get_model());
  }();
  Trainer t(kLanguageModel, c);
  const int victim = t.foreach_worker("replica_info")[1]["pid"].get<int>();  // (before: it takes a snapshot)
  EXPECT_EQ(t.train({.num_steps = 15}).batch, 15);
  ::kill(victim, SIGKILL);
  const auto r = t.train({.num_steps = 25});
  EXPECT_EQ(r.batch, 40);
  ASSERT_EQ(r.recoveries.size(), 1u);
  EXPECT_EQ(r.recoveries[0].standbys_used, 1);
  // Back to the snapshot at step 10: steps 11-15, and step 16 if it had begun.
  EXPECT_GE(r.recoveries[0].rolled_back_steps, 5);
  EXPECT_LE(r.recoveries[0].rolled_back_steps, 6);
  EXPECT_GT(r.batches_per_epoch, 40) << "the fault should come mid-epoch";
  EXPECT_LT(max_difference(reference, params_of(*t.get_model())), 1e-7);
}

TEST(TrainerRecovery, WaitingForReplacementsAKilledWorkersReplacementTakesItsPlaceExactly) {
  std::vector<int> victims;
  auto c = base_config(2, "allreduce", 64);
  c.recovery.wait_for_replacements = true;
  auto r = train_through_fault(c, SIGKILL, &victims);
  ASSERT_EQ(r.recoveries.size(), 1u);
  const auto& ev = r.recoveries[0];
  EXPECT_EQ(ev.standbys_used, 0);
  EXPECT_NE(ev.lost.find("pid " + std::to_string(victims[0])), std::string::npos) << ev.lost;
  EXPECT_NE(ev.lost.find("exited"), std::string::npos) << ev.lost;
  EXPECT_EQ(ev.workers_after, 2);
  EXPECT_GT(ev.recovery_s, 0);
  EXPECT_LT(ev.recovery_s, 10);
  // Killed once worker 0 reported 15 steps: in the chunk of steps 10-19 or a later one (the
  // victim's own last report may lag worker 0's by a heartbeat).
  EXPECT_GE(ev.at_step, 10);
  EXPECT_LT(ev.at_step, 40);
  EXPECT_LT(ev.detect_s, 2.0) << "a process that exits is seen before the heartbeat timeout";
  std::cout << "recovery: " << ev.recovery_s << " s, detected " << ev.detect_s << " s after the victim's last "
            << "sign of life, rolled back " << ev.rolled_back_steps << " steps\n";
}

// Compression keeps error feedback per replica (each host leader's own residual) and PowerSGD's
// state (its calls and warm-start Q): both travel with the snapshot, so a replacement's run ends
// equal to the fault-free run with the same compression. (Restarted from zero they part: the
// first step after the restore sends other values.)
TEST(TrainerRecovery, WithCompressionTheErrorFeedbackComesBackAndTheResultEqualsAFaultFreeRun) {
  for (const std::string run : {"allreduce fp16", "allreduce powersgd", "ps bf16"}) {
    SCOPED_TRACE(run);
    const auto space = run.find(' ');
    const std::string strategy = run.substr(0, space), compression = run.substr(space + 1);
    auto c = base_config(2, strategy, 64);
    c.launch.local_hosts = 2;
    c.comm.compression = compression;
    c.comm.powersgd_start_steps = 3;  // compressed from step 4: Q warm by the snapshot at 10
    c.recovery.wait_for_replacements = true;
    auto r = train_through_fault(c, SIGKILL, nullptr, std::numeric_limits<double>::denorm_min());  // bit for bit
    ASSERT_EQ(r.recoveries.size(), 1u);
    EXPECT_EQ(r.recoveries[0].workers_after, 2);
  }
}

// The call's scale-up, if it had one.
std::optional<RecoveryEvent> scale_up_in(const Results& r) {
  for (const auto& ev : r.recoveries) {
    if (ev.kind == "scale_up") return ev;
  }
  return std::nullopt;
}

// Trains 5 steps a call until the job scales back up (for up to 60 s), adding the steps to *steps.
std::optional<RecoveryEvent> train_until_scale_up(Trainer& t, int64_t* steps) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    auto r = t.train({.num_steps = 5});
    *steps += static_cast<int64_t>(r.metrics.at("batches"));
    if (auto ev = scale_up_in(r)) return ev;
  }
  return std::nullopt;
}

// The default without a standby: the survivors go on at once with the global batch re-split
// over them, and the new worker, set up meanwhile, joins between chunks.
TEST(TrainerRecovery, WithoutAStandbyTheSurvivorsResumeAtOnceAndTheNewWorkerJoinsWhenSetUp) {
  auto c = base_config(3, "allreduce", 66);
  c.checkpoints.every_steps = 5;
  c.checkpoints.max_overhead = 0;
  c.recovery.heartbeat_timeout = milliseconds(2000);
  std::atomic<bool> killed{false};
  int victim = 0;
  c.on_progress = [&](const TrainProgress& p) {
    if (p.batches >= 3 && !killed.exchange(true)) ::kill(victim, SIGKILL);
  };
  std::vector<std::string> notices;  // on_recovery: the start, the resumption, the scale-up
  c.on_recovery = [&](const RecoveryEvent& e) {
    notices.push_back(e.kind + (e.resumed_at == Clock::time_point{} ? " started" : " done"));
  };
  Trainer t(dsgd::kImageClassifier, c);
  victim = t.foreach_worker("replica_info")[1]["pid"].get<int>();
  auto first = t.train({.num_steps = 20});
  ASSERT_TRUE(killed);
  ASSERT_GE(first.recoveries.size(), 1u);
  EXPECT_EQ(first.recoveries[0].workers_after, 2) << "it waited for the replacement";
  EXPECT_EQ(first.recoveries[0].standbys_used, 0);
  int64_t steps = 20;
  std::optional<RecoveryEvent> grew = scale_up_in(first);
  if (!grew) grew = train_until_scale_up(t, &steps);
  ASSERT_TRUE(grew) << "the new worker never joined";
  EXPECT_EQ(grew->workers_after, 3);
  EXPECT_EQ(t.foreach_worker("replica_info").size(), 3u);
  EXPECT_EQ(notices, (std::vector<std::string>{"recovery started", "recovery done", "scale_up done"}));
  // 3, 2, then 3 replicas: one process's mathematics, summed in other orders (see
  // AfterFailedReplacementsTheJobScalesBackUpToNumWorkers for the bound).
  const double difference = max_difference(single_process(66, steps), params_of(*t.get_model()));
  std::cout << "after " << steps << " steps: " << difference << " from one process\n";
  EXPECT_LT(difference, 2e-4);
}

TEST(TrainerRecovery, StepByStepSnapshotsEveryIntervalAndARecoveryReplaysTheStepsSince) {
  // step() is a train() call of one step: its snapshot waits until an interval (10 steps) has
  // passed, so after 24 steps the last snapshot is step 20's. A worker killed then costs a
  // recovery that restores it and trains steps 21-24 again before step 25: the result equals
  // a fault-free run.
  auto c = base_config(2, "allreduce", 64);
  c.checkpoints.every_steps = 10;
  c.checkpoints.max_overhead = 0;
  c.recovery.heartbeat_timeout = milliseconds(2000);
  c.comm.timeout = milliseconds(10000);
  c.recovery.wait_for_replacements = true;
  c.recovery.from_peer = false;  // (from a peer nothing is replayed: the survivor holds step 24)
  const Params reference = [&] {  // a fault-free run of the same steps (see train_through_fault)
    Trainer clean(dsgd::kImageClassifier, c);
    for (int i = 0; i < 25; ++i) EXPECT_EQ(clean.step().recoveries.size(), 0u);
    return params_of(*clean.get_model());
  }();
  Trainer t(dsgd::kImageClassifier, c);
  const int victim = t.foreach_worker("replica_info")[1]["pid"].get<int>();  // a worker function takes a snapshot
  for (int i = 0; i < 24; ++i) ASSERT_EQ(t.step().recoveries.size(), 0u);
  ::kill(victim, SIGKILL);
  auto r = t.step();
  ASSERT_EQ(r.recoveries.size(), 1u);
  // The 4 steps since the snapshot (and the victim's last reported step, counted again).
  EXPECT_GE(r.recoveries[0].rolled_back_steps, 4);
  EXPECT_LE(r.recoveries[0].rolled_back_steps, 5);
  EXPECT_GE(r.recoveries[0].at_step, 24);  // the steps of every call so far
  EXPECT_LE(r.recoveries[0].at_step, 25);
  EXPECT_EQ(r.batch, 25);
  EXPECT_LT(max_difference(reference, params_of(*t.get_model())), 1e-7);
}

// A standby lost while it waits costs the job nothing: no recovery, and a new one takes its place.
TEST(TrainerRecovery, AStandbyLostWhileItWaitsIsReplacedWithoutARecovery) {
  auto c = base_config(2, "allreduce", 64);
  c.recovery.standby_workers = 1;
  Trainer t(dsgd::kImageClassifier, c);
  std::vector<int> members;
  for (const auto& w : t.foreach_worker("replica_info")) members.push_back(w["pid"].get<int>());
  int standby = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (standby == 0 && Clock::now() < deadline) {
    for (int pid : worker_pids()) {
      if (std::find(members.begin(), members.end(), pid) == members.end()) standby = pid;
    }
    if (standby == 0) std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_NE(standby, 0) << "no standby process";
  t.train({.num_steps = 5});
  ::kill(standby, SIGKILL);
  size_t events = 0;
  std::vector<int> now;
  auto replaced = [&] {
    now = worker_pids();
    return now.size() == 3 && std::count(now.begin(), now.end(), standby) == 0;
  };
  for (int i = 0; i < 100 && !replaced(); ++i) {
    events += t.train({.num_steps = 2}).recoveries.size();  // the driver reaps and respawns as it trains
  }
  EXPECT_EQ(events, 0u) << "a standby's loss disturbed training";
  EXPECT_EQ(now.size(), 3u);
  EXPECT_EQ(std::count(now.begin(), now.end(), standby), 0);
}

// A loss seen by validate() or load() is survived like one seen by train(): the call completes.
TEST(TrainerRecovery, ValidateAndLoadSurviveALostWorker) {
  testing::TempDir dir;
  auto c = base_config(2, "allreduce", 64);
  c.recovery.heartbeat_timeout = milliseconds(2000);
  c.recovery.standby_workers = 1;
  Trainer t(dsgd::kImageClassifier, c);
  t.train({.num_steps = 5});
  t.save(dir.file("ckpt"));
  const auto before = t.validate().metrics.at("accuracy");
  ::kill(t.foreach_worker("replica_info")[1]["pid"].get<int>(), SIGKILL);
  const auto after = t.validate();
  EXPECT_EQ(after.metrics.at("accuracy"), before) << "validated another state";
  ::kill(t.foreach_worker("replica_info")[0]["pid"].get<int>(), SIGKILL);
  t.load(dir.file("ckpt"));
  EXPECT_EQ(t.train({.num_steps = 1}).batch, 6);  // the checkpoint's position, on every worker
  // Back to two workers: the new standby, when it was not set up in time for the second loss,
  // joins at the start of a later call.
  for (int i = 0; i < 100 && t.foreach_worker("replica_info").size() < 2; ++i) t.train({.num_steps = 1});
  EXPECT_EQ(t.foreach_worker("replica_info").size(), 2u);
}

// Shutting down with a worker just killed neither hangs nor throws.
TEST(TrainerRecovery, ShutdownRightAfterALostWorkerEndsWithinSeconds) {
  auto c = base_config(2, "allreduce", 64);
  Trainer t(dsgd::kImageClassifier, c);
  t.train({.num_steps = 2});
  ::kill(t.foreach_worker("replica_info")[1]["pid"].get<int>(), SIGKILL);
  const auto t0 = Clock::now();
  EXPECT_NO_THROW(t.shutdown());
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  EXPECT_TRUE(worker_pids().empty()) << "a worker outlived shutdown()";
}

TEST(TrainerRecovery, SaveSurvivesTheLossOfTheWorkerItReadsFrom) {
  // save() reads the state from the first worker: kill that one just before, and save must
  // recover and write the state training had reached.
  testing::TempDir dir;
  auto c = base_config(2, "allreduce", 64);
  c.recovery.heartbeat_timeout = milliseconds(2000);
  c.recovery.standby_workers = 1;  // the same replicas after the loss: the same replayed steps
  Trainer t(dsgd::kImageClassifier, c);
  t.train({.num_steps = 10});
  const Params before = params_of(*t.get_model());
  ::kill(t.foreach_worker("replica_info")[0]["pid"].get<int>(), SIGKILL);
  t.save(dir.file("ckpt"));
  Trainer loaded(dsgd::kImageClassifier, base_config(1, "allreduce", 64));
  loaded.load(dir.file("ckpt"));
  EXPECT_LT(max_difference(before, params_of(*loaded.get_model())), 1e-7);
  EXPECT_EQ(loaded.train({.num_steps = 1}).batch, 11);  // the position came along too
}

TEST(TrainerRecovery, AWorkerLostBetweenAChunkAndItsSnapshotCostsNothingFromAPeerARedoneChunkWithout) {
  // The chunk ended on every worker, then the snapshot's worker died. From a peer (the default)
  // the standby takes the survivor's state: nothing is trained again. Without, the recovery goes
  // back to the previous snapshot and trains the chunk again. Both equal a fault-free run.
  testing::TempDir dir;
  const std::string armed = dir.file("die-in-snapshot");
  ::setenv("DSGD_TEST_DIE_IN_SNAPSHOT", armed.c_str(), 1);
  auto c = self_killing_config(32, 4);
  auto run = [&](bool fault) {
    Trainer t(operator_of<DiesInSnapshotOperator>(), c);
    await_standby(t);
    if (fault) std::ofstream(armed) << "die\n";  // after the constructor's snapshot
    auto r = t.train({.num_steps = 6});
    EXPECT_FALSE(std::filesystem::exists(armed)) << "no replica took the snapshot";
    return std::make_pair(r, t.foreach_worker("weight_sum")[0].get<double>());
  };
  const auto [clean, clean_sum] = run(false);
  EXPECT_EQ(clean.recoveries.size(), 0u);
  for (const bool from_peer : {true, false}) {
    SCOPED_TRACE(from_peer ? "from a peer" : "from the snapshot");
    c.recovery.from_peer = from_peer;
    const auto [faulty, faulty_sum] = run(true);
    ASSERT_EQ(faulty.recoveries.size(), 1u);
    const auto& ev = faulty.recoveries[0];
    EXPECT_EQ(ev.workers_after, 2);
    EXPECT_EQ(ev.from_peer, from_peer);
    EXPECT_EQ(ev.rolled_back_steps, from_peer ? 0 : 4);  // the chunk since the snapshot at step 0
    EXPECT_EQ(faulty.metrics.at("batches"), 6);           // a redone chunk counts once
    EXPECT_EQ(faulty.batch, 6);
    EXPECT_EQ(faulty_sum, clean_sum);
  }
  ::unsetenv("DSGD_TEST_DIE_IN_SNAPSHOT");
}

// A worker lost in a validation between two train calls: the standby takes a survivor's state
// (they all stand where the last call left them), the validation is done again on the re-formed
// group, and nothing is trained again, though steps since the last snapshot were pending.
TEST(TrainerRecovery, AWorkerLostInAValidationBetweenCallsCostsNoStep) {
  testing::TempDir dir;
  const std::string armed = dir.file("die-in-validation");
  ::setenv("DSGD_TEST_DIE_IN_VALIDATION", armed.c_str(), 1);
  const auto c = self_killing_config(32, 4);
  auto run = [&](bool fault) {
    Trainer t(operator_of<DiesInValidationOperator>(), c);
    await_standby(t);
    EXPECT_EQ(t.train({.num_steps = 6}).batch, 6);  // 2 steps past the snapshot at step 4
    if (fault) std::ofstream(armed) << "die\n";
    const Results v = t.validate();
    const Results r = t.train({.num_steps = 2});  // to the epoch's end (8 steps)
    EXPECT_EQ(r.metrics.at("batches"), 2);
    EXPECT_EQ(r.recoveries.size(), 0u);
    return std::make_tuple(v, t.foreach_worker("weight_sum")[0].get<double>());
  };
  const auto [clean, clean_sum] = run(false);
  const auto [faulty, faulty_sum] = run(true);
  ::unsetenv("DSGD_TEST_DIE_IN_VALIDATION");
  EXPECT_FALSE(std::filesystem::exists(armed)) << "no replica validated";
  EXPECT_EQ(clean.recoveries.size(), 0u);
  ASSERT_EQ(faulty.recoveries.size(), 1u);
  const auto& ev = faulty.recoveries[0];
  EXPECT_TRUE(ev.from_peer);
  EXPECT_EQ(ev.rolled_back_steps, 0);
  EXPECT_EQ(ev.standbys_used, 1);
  EXPECT_EQ(faulty.metrics.at("loss"), clean.metrics.at("loss"));  // the whole validation set, once
  EXPECT_EQ(faulty_sum, clean_sum);
}

TEST(TrainerRecovery, SimpleStrategySurvivesAKilledWorker) {
  auto c = base_config(2, "simple", 64);
  c.recovery.standby_workers = 1;
  auto r = train_through_fault(c, SIGKILL);
  ASSERT_EQ(r.recoveries.size(), 1u);
}

TEST(TrainerRecovery, PsSurvivesAKilledWorkerHoldingAShard) {
  // Every worker serves shards (num_ps_shards 2 on 2 pseudo-hosts): the victim takes one with it;
  // the standby, spawned for pseudo-host 0, takes the victim's host 1 and its shard.
  auto c = ps_config(2, 2, 2);
  c.recovery.standby_workers = 1;
  auto r = train_through_fault(c, SIGKILL);
  ASSERT_EQ(r.recoveries.size(), 1u);
  EXPECT_EQ(r.recoveries[0].workers_after, 2);
}

TEST(TrainerRecovery, PsUpdateOnShardsGetsALostShardsParametersAndMomentumBackFromTheSnapshot) {
  // The victim owns a shard's parameters and momentum, found nowhere else: the recovery restores
  // them from the last snapshot (gathered into it) and the result equals a fault-free run.
  auto c = ps_update_config(2, 2, 2);
  c.recovery.standby_workers = 1;
  auto r = train_through_fault(c, SIGKILL);
  ASSERT_EQ(r.recoveries.size(), 1u);
  EXPECT_EQ(r.recoveries[0].workers_after, 2);
}

TEST(TrainerRecovery, PsKilledShardProcessIsRespawnedAndTheResultEqualsAFaultFreeRun) {
  // The victim holds a shard's parameters and momentum (update on shards), found nowhere else:
  // the driver respawns it and every replica restarts it from the last snapshot.
  std::vector<int> victims;
  auto r = train_through_fault(ps_processes_config(2, 2, 2, true), SIGKILL, &victims, 1e-7, /*shard_victim=*/true);
  ASSERT_EQ(r.recoveries.size(), 1u);
  EXPECT_EQ(r.recoveries[0].workers_after, 2);
  EXPECT_TRUE(r.recoveries[0].lost.empty()) << "no worker was lost: " << r.recoveries[0].lost;
  EXPECT_NE(r.recoveries[0].failure.find(std::to_string(victims.at(0))), std::string::npos)
      << "the failure names the shard process: " << r.recoveries[0].failure;
  std::cout << "shard recovery: " << r.recoveries[0].recovery_s << " s after: " << r.recoveries[0].failure << "\n";
}

TEST(TrainerRecovery, PsAsyncLosesAShardOwnerAndGoesOnFromTheSnapshot) {
  // Asynchronous updates have no single-process reference: the job must finish every step
  // after one recovery, with every replica holding the servers' parameters at the end.
  auto c = base_config(2, "ps_async", 64);
  c.launch.local_hosts = 2;
  c.recovery.standby_workers = 1;
  c.checkpoints.every_steps = 10;
  c.checkpoints.max_overhead = 0;
  c.recovery.heartbeat_timeout = milliseconds(2000);
  c.comm.timeout = milliseconds(10000);
  std::atomic<bool> done{false};
  int victim = 0;
  c.on_progress = [&](const TrainProgress& p) {
    if (p.batches >= 15 && !done.exchange(true)) ::kill(victim, SIGKILL);
  };
  Trainer t(dsgd::kImageClassifier, c);
  victim = t.foreach_worker("replica_info")[1]["pid"].get<int>();
  auto r = t.train({.num_steps = 40});
  EXPECT_TRUE(done);
  EXPECT_EQ(r.batch, 40);
  ASSERT_EQ(r.recoveries.size(), 1u);
  const auto sums = t.foreach_worker("weight_sum");
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_EQ(sums[0].get<double>(), sums[1].get<double>());
}

TEST(TrainerRecovery, PsSurvivesAHungWorkerOnItsOwnHost) {
  // Found by the soak: 3 workers on 3 pseudo-hosts, worker 1 stopped; its replacement joins
  // another host's shared memory.
  auto c = ps_config(3, 3, 3, 64);
  c.recovery.wait_for_replacements = true;
  auto r = train_through_fault(c, SIGSTOP);
  ASSERT_EQ(r.recoveries.size(), 1u);
}

// A worker lost before the first step (here: killed at setup) costs a restart of every worker;
// the job then trains as if nothing happened, to the same parameters.
TEST(TrainerRecovery, AWorkerKilledDuringStartUpCostsARestartAndTheJobTrainsTheSame) {
  testing::TempDir dir;
  auto c = base_config(2, "allreduce", 64);
  c.initialization_hook = "die_at_start";
  const Params reference = [&] {
    Trainer clean(dsgd::kImageClassifier, c);
    clean.train({.num_steps = 10});
    return params_of(*clean.get_model());
  }();
  ::setenv("DSGD_TEST_DIE_ONCE", dir.file("died").c_str(), 1);
  Trainer t(dsgd::kImageClassifier, c);
  ::unsetenv("DSGD_TEST_DIE_ONCE");
  EXPECT_TRUE(std::filesystem::exists(dir.file("died"))) << "no worker died at start-up";
  const auto r = t.train({.num_steps = 10});
  EXPECT_EQ(r.batch, 10);
  ASSERT_EQ(r.recoveries.size(), 1u) << "the first call reports the start-up's restart";
  EXPECT_EQ(r.recoveries[0].kind, "restart");
  EXPECT_NE(r.recoveries[0].failure.find("during start-up"), std::string::npos) << r.recoveries[0].failure;
  EXPECT_EQ(r.recoveries[0].failure.find("dsgd::init"), std::string::npos) << "killed, not a wrong main()";
  EXPECT_LT(max_difference(reference, params_of(*t.get_model())), 1e-7);
  EXPECT_TRUE(t.train({.num_steps = 1}).recoveries.empty()) << "reported once";
}

// Lost after every replica is set up (here: in the constructor's snapshot), a worker costs an
// ordinary recovery, not a restart: a standby takes its place and the job trains the same.
TEST(TrainerRecovery, AWorkerLostAfterSetUpAtStartUpIsAnOrdinaryRecovery) {
  testing::TempDir dir;
  const std::string armed = dir.file("die-in-snapshot");
  auto c = base_config(2, "allreduce", 32);
  c.config = json::object();
  c.recovery.standby_workers = 1;
  auto run = [&](bool fault) {
    if (fault) std::ofstream(armed) << "die\n";
    ::setenv("DSGD_TEST_DIE_IN_SNAPSHOT", armed.c_str(), 1);
    Trainer t(operator_of<DiesInSnapshotOperator>(), c);
    ::unsetenv("DSGD_TEST_DIE_IN_SNAPSHOT");
    auto r = t.train({.num_steps = 6});
    return std::make_pair(r, t.foreach_worker("weight_sum")[0].get<double>());
  };
  const auto [faulty, faulty_sum] = run(true);
  EXPECT_FALSE(std::filesystem::exists(armed)) << "no replica took the snapshot";
  ASSERT_GE(faulty.recoveries.size(), 1u);
  EXPECT_EQ(faulty.recoveries[0].kind, "recovery");
  EXPECT_NE(faulty.recoveries[0].failure.find("during start-up"), std::string::npos) << faulty.recoveries[0].failure;
  EXPECT_EQ(faulty.recoveries[0].at_step, 0);
  EXPECT_EQ(faulty.batch, 6);
  const auto [clean, clean_sum] = run(false);
  EXPECT_TRUE(clean.recoveries.empty());
  EXPECT_EQ(faulty_sum, clean_sum);
}

// A lone worker without a standby has no survivor to recover with: lost after set-up, it is
// started again as before set-up.
TEST(TrainerRecovery, ALoneWorkerLostAfterSetUpAtStartUpIsStartedAgain) {
  testing::TempDir dir;
  const std::string armed = dir.file("die-in-snapshot");
  std::ofstream(armed) << "die\n";
  auto c = base_config(1, "allreduce", 32);
  c.config = json::object();
  ::setenv("DSGD_TEST_DIE_IN_SNAPSHOT", armed.c_str(), 1);
  Trainer t(operator_of<DiesInSnapshotOperator>(), c);
  ::unsetenv("DSGD_TEST_DIE_IN_SNAPSHOT");
  EXPECT_FALSE(std::filesystem::exists(armed)) << "no replica took the snapshot";
  const auto r = t.train({.num_steps = 3});
  EXPECT_EQ(r.batch, 3);
  ASSERT_EQ(r.recoveries.size(), 1u);
  EXPECT_EQ(r.recoveries[0].kind, "restart");
}

TEST(TrainerRecovery, WorkersThatKeepDyingAtStartUpFailTheJobNamingEveryFailure) {
  auto c = base_config(2, "allreduce", 64);
  c.initialization_hook = "die_at_start";
  c.recovery.max_failures = 1;
  ::setenv("DSGD_TEST_DIE_ALWAYS", "1", 1);
  try {
    Trainer t(dsgd::kImageClassifier, c);
    ::unsetenv("DSGD_TEST_DIE_ALWAYS");
    FAIL() << "the job started with every worker dying";
  } catch (const std::exception& e) {
    ::unsetenv("DSGD_TEST_DIE_ALWAYS");
    const std::string what = e.what();
    EXPECT_NE(what.find("giving up after 2 failures (max_failures 1)"), std::string::npos) << what;
    EXPECT_NE(what.find("1. "), std::string::npos) << what;
    EXPECT_NE(what.find("2. "), std::string::npos) << what;
    EXPECT_NE(what.find("during start-up"), std::string::npos) << what;
  }
}

TEST(TrainerRecovery, HungWorkerIsEvictedAfterTheHeartbeatTimeout) {
  auto c = base_config(2, "allreduce", 64);
  c.recovery.standby_workers = 1;
  auto r = train_through_fault(c, SIGSTOP);
  ASSERT_EQ(r.recoveries.size(), 1u);
  EXPECT_NE(r.recoveries[0].lost.find("silent"), std::string::npos) << r.recoveries[0].lost;
  // A stopped process sends nothing: seen at the heartbeat timeout (2 s), not at once.
  EXPECT_GT(r.recoveries[0].detect_s, 1.0);
}

TEST(TrainerRecovery, WithoutReplacementsTrainingGoesOnWithFewerWorkersAndTheSameMathematics) {
  auto c = base_config(3, "allreduce", 66);
  c.recovery.replace_lost_workers = false;
  // 3 replicas of 22 samples, then 2 of 33: the same gradient, summed in a different order.
  auto r = train_through_fault(c, SIGKILL, nullptr, 5e-5);
  ASSERT_EQ(r.recoveries.size(), 1u);
  EXPECT_EQ(r.recoveries[0].workers_after, 2);
}

TEST(TrainerRecovery, AfterFailedReplacementsTheJobScalesBackUpToNumWorkers) {
  testing::TempDir dir;
  const std::string refuse = dir.file("refuse-new-workers");
  ::setenv("DSGD_TEST_REFUSE_WORKERS_WHILE", refuse.c_str(), 1);
  ::setenv("DSGD_FORK_SERVER", "0", 1);  // exec'd workers: each runs main(), which refuses
  auto c = base_config(3, "allreduce", 66);
  c.checkpoints.every_steps = 5;
  c.checkpoints.max_overhead = 0;  // exactly that interval
  c.recovery.heartbeat_timeout = milliseconds(2000);
  c.comm.timeout = milliseconds(10000);
  std::atomic<bool> killed{false};
  int victim = 0;
  c.on_progress = [&](const TrainProgress& p) {
    if (p.batches >= 3 && !killed.exchange(true)) {
      std::ofstream(refuse) << "no\n";
      ::kill(victim, SIGKILL);
    }
  };
  Trainer t(dsgd::kImageClassifier, c);
  victim = t.foreach_worker("replica_info")[1]["pid"].get<int>();
  auto first = t.train({.num_steps = 30});  // long enough for a progress tick (~10 per second) to see step 3
  ASSERT_TRUE(killed);
  ASSERT_EQ(first.recoveries.size(), 1u);
  EXPECT_EQ(first.recoveries[0].workers_after, 2);  // the replacement refused to start
  EXPECT_EQ(t.foreach_worker("replica_info").size(), 2u);

  // Replacements can start again: within the back-off the job grows back to 3 workers.
  std::filesystem::remove(refuse);
  int64_t steps = 30;
  const std::optional<RecoveryEvent> grew = train_until_scale_up(t, &steps);
  ::unsetenv("DSGD_TEST_REFUSE_WORKERS_WHILE");
  ::unsetenv("DSGD_FORK_SERVER");
  ASSERT_TRUE(grew) << "never scaled back up";
  EXPECT_EQ(grew->workers_after, 3);
  EXPECT_EQ(t.foreach_worker("replica_info").size(), 3u);
  auto last = t.train({.num_steps = 5});  // may stop short at an epoch's end (62 batches)
  steps += static_cast<int64_t>(last.metrics.at("batches"));
  EXPECT_EQ(last.epoch * last.batches_per_epoch + last.batch, steps);
  // 3, 2, then 3 replicas: the same mathematics as one process with the global batch, summed in
  // a different order at each size. The float32 rounding that leaves grows with the steps, and
  // their number (45-70) depends on when the scale-up lands: 5.1e-5 was seen on one machine, and
  // 2.0e-5 to 1.05e-4 on another (AVX2, 2026-11-25: 63-68 steps). A wrong weighting or a lost
  // momentum moves the parameters by 3e-4 and more (the sabotaged runs of the ps tests).
  const double difference = max_difference(single_process(66, steps), params_of(*t.get_model()));
  std::cout << "after " << steps << " steps: " << difference << " from one process\n";
  EXPECT_LT(difference, 2e-4);
}

// ---- on a GPU machine (bench/gpu/run.sh); each test skips, saying why, without one ----

#define SKIP_WITHOUT_CUDA()                                                                       \
  if (!torch::cuda::is_available()) {                                                            \
    GTEST_SKIP() << "LibTorch sees no CUDA device (Debian's LibTorch has no CUDA): runs on a GPU " \
                    "machine (bench/gpu/run.sh)";                                                 \
  }

TrainerConfig gpu_config(int workers, const std::string& model) {
  TrainerConfig c = base_config(workers, "allreduce", 64);
  c.device = "cuda";
  c.config["model"] = model;
  return c;
}

// Two worker processes sharing one GPU (their gradients staged through host shared memory)
// against one process with the global batch: the MLP's float32 matmuls (no TF32 by default),
// 20 steps. The one GPU process also ends where the CPU does.
TEST(TrainerGpu, TwoProcessesOnOneGpuEqualOneProcessWithTheGlobalBatch) {
  SKIP_WITHOUT_CUDA();
  Trainer one(dsgd::kImageClassifier, gpu_config(1, "mlp"));
  const Params before = params_of(*one.get_model());
  EXPECT_EQ(one.train({.num_steps = 20}).batch, 20);
  const double vs_cpu =
      max_difference(single_process(64, 20, gpu_config(1, "mlp").config), params_of(*one.get_model()));
  std::cout << "1 process on the GPU vs the CPU, 20 steps: max parameter difference " << vs_cpu << "\n";
  EXPECT_LT(vs_cpu, 1e-4);
  Trainer two(dsgd::kImageClassifier, gpu_config(2, "mlp"));
  EXPECT_EQ(two.train({.num_steps = 20}).batch, 20);
  const Params a = params_of(*one.get_model()), b = params_of(*two.get_model());
  EXPECT_GT(max_difference(before, a), 1e-3) << "training did not move the parameters";
  const double difference = max_difference(a, b);
  std::cout << "2 processes on one GPU vs 1 process, 20 steps: max parameter difference " << difference << "\n";
  EXPECT_LT(difference, 1e-4);
}

// On a GPU the image classifier lays out its convolutions channels_last unless told not to, and
// trains as the plain layout does (cuDNN's kernels differ: the parameters differ by rounding).
TEST(TrainerGpu, ChannelsLastIsTheDefaultForConvolutionsAndTrainsLikeNchw) {
  SKIP_WITHOUT_CUDA();
  std::map<std::string, Params> runs;
  Params before;
  for (const bool channels_last : {true, false}) {
    TrainerConfig c = gpu_config(1, "cnn");
    if (!channels_last) c.config["channels_last"] = false;
    Trainer t(dsgd::kImageClassifier, c);
    const std::string expected = channels_last ? "channels_last" : "nchw";
    EXPECT_EQ(t.foreach_worker("conv_layout").at(0), expected);
    before = params_of(*t.get_model());
    t.train({.num_steps = 20});
    runs[expected] = params_of(*t.get_model());
  }
  EXPECT_GT(max_difference(before, runs["nchw"]), 1e-3) << "training did not move the parameters";
  const double difference = max_difference(runs["channels_last"], runs["nchw"]);
  std::cout << "channels_last vs NCHW on the GPU, CNN, 20 steps: max parameter difference " << difference << "\n";
  EXPECT_LT(difference, 1e-3);
}

// bf16 autocast on the GPU: the CNN trains to where float32 does, by another path (the
// parameters differ, so autocast did change the arithmetic).
TEST(TrainerGpu, Bf16AutocastTrainsTheCnnLikeFloat32) {
  SKIP_WITHOUT_CUDA();
  expect_bf16_trains_like_fp32(gpu_config(1, "cnn"), 5, 25, 0.1);
}

// float16 autocast with dynamic loss scaling (65536 by default): trains like float32, 2 replicas
// stay identical, and a scale that overflows at once backs off until steps are taken.
TEST(TrainerGpu, Fp16AutocastWithLossScalingTrainsTheCnnLikeFloat32) {
  SKIP_WITHOUT_CUDA();
  TrainerConfig c = gpu_config(2, "cnn");
  c.step.precision = "fp16";
  c.config["lr"] = 0.05;
  Trainer t(dsgd::kImageClassifier, c);
  auto r0 = t.train({.num_steps = 5});
  EXPECT_EQ(r0.metrics.at("loss_scale"), 65536.0);
  t.train({.num_steps = 25});
  const double last = t.train({.num_steps = 5}).metrics.at("loss");
  std::cout << "fp16: loss " << r0.metrics.at("loss") << " -> " << last << "\n";
  EXPECT_LT(last, r0.metrics.at("loss"));
  c.step.loss_scale = 0x1p40;  // float16 activation gradients overflow at once: backs off, then trains
  Trainer high(dsgd::kImageClassifier, c);
  auto r = high.train({.num_steps = 40});
  std::cout << "from 2^40: " << r.metrics.at("skipped_steps") << " steps skipped, scale now "
            << r.metrics.at("loss_scale") << "\n";
  EXPECT_GT(r.metrics.at("skipped_steps"), 0.0);
  EXPECT_LT(r.metrics.at("skipped_steps"), 40.0);
  EXPECT_LT(r.metrics.at("loss_scale"), 0x1p40);
}

// ZeRO stage 1 with the parameters on the GPU (the shares summed through the host copy, as the
// gradients are): two processes sharing the GPU end where plain allreduce does, the GPT with
// AdamW. The bound allows for LibTorch's fused attention, whose backward on CUDA adds in no fixed
// order; replicas that kept the others' old parameters would be ~1e-2 apart.
TEST(TrainerGpu, ZeroStage1OnTheGpuEqualsPlainAllreduce) {
  SKIP_WITHOUT_CUDA();
  testing::TempDir dir;
  TrainerConfig c = language_model_job(dir, 800, 20);
  c.device = "cuda";
  expect_zero_equals_plain(c, kLanguageModel, 20, 1e-4);
}

}  // namespace
}  // namespace dsgd
