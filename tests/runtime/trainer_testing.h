// What the Trainer's tests share (tests/runtime/trainer_*_test.cpp): small operators that each
// change one thing of a seeded regression, the synthetic CNN job and its one-process reference,
// and the checks that compare a distributed run with it. The operators are registered (and the
// worker functions the tests call through foreach_worker defined) in trainer_testing.cpp.
#pragma once

#include <gtest/gtest.h>

#include <ATen/Version.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <thread>

#include "dsgd/common/error.h"
#include "dsgd/runtime/fit.h"
#include "dsgd/apps/image_classifier.h"
#include "dsgd/apps/language_model.h"
#include "dsgd/torch/operator.h"
#include "dsgd/data/text.h"
#include "dsgd/runtime/trainer.h"
#include "runtime/driver/checkpoint.h"
#include "runtime/launch/spawn.h"
#include "runtime/worker/cpu_kernels.h"
#include "testing/params.h"
#include "testing/proc.h"
#include "testing/temp_dir.h"
#include "torch/sync/grad_sync.h"
#include "torch/replica/replica.h"

namespace dsgd::trainer_testing {

using json = nlohmann::json;

using std::chrono::milliseconds;

using Clock = std::chrono::steady_clock;

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

// With Adam: the ps shards cannot apply it.
class AdamOperator : public RegressionOperator {
  std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<torch::Tensor> params) override {
    return std::make_unique<torch::optim::Adam>(std::move(params), 0.01);
  }
};

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

// Kills its replica in state_dict (the driver's snapshot) while the file named by
// DSGD_TEST_DIE_IN_SNAPSHOT exists, removing it first: it dies once.
class DiesInSnapshotOperator : public RegressionOperator {
  void state_dict(torch::serialize::OutputArchive&) const override {
    const char* armed = std::getenv("DSGD_TEST_DIE_IN_SNAPSHOT");
    if (armed != nullptr && std::filesystem::remove(armed)) ::raise(SIGKILL);
  }
};

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

// Refuses a config key in setup(), in the worker: it registers no config check of its own.
class PickyOperator : public RegressionOperator {
  void setup(const json& config) override {
    if (config.contains("modle")) throw ConfigError("unknown picky config key 'modle'");
    RegressionOperator::setup(config);
  }
};

// Every running_mean and running_var buffer of model 0 (BatchNorm's statistics), in order.
// Two models and two optimizers in one operator, as a GAN trains them (examples/downstream/gan.cpp):
// a custom train_batch steps the discriminator, then the generator, each after a backward of its
// own. The generator's input is a fixed function of each real sample, not random noise, so a
// run is a function of the data order alone: 2 workers and 1 can be compared, and a checkpoint
// continues exactly.
class TwoModelOperator : public TrainingOperator {
 public:
  void setup(const json&) override {
    generator_ = register_model(two_layers(4, 1));
    discriminator_ = register_model(two_layers(1, 1));
    g_opt_ = &register_optimizer(std::make_unique<torch::optim::Adam>(generator_->parameters(), 2e-3));
    d_opt_ = &register_optimizer(std::make_unique<torch::optim::Adam>(discriminator_->parameters(), 2e-3));
    auto gen = at::detail::createCPUGenerator(replica().seed);
    register_data(3.0 + 0.5 * torch::randn({1024, 1}, gen));
  }
  Metrics train_batch(const Batch& batch) override {
    const auto bce = [](const torch::Tensor& logits, double label) {
      return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, label));
    };
    const auto input = torch::sin(batch.data * torch::arange(1, 5, torch::kFloat32));
    const auto fake = generator_->forward(input);
    d_opt_->zero_grad();
    const auto d_loss =
        bce(discriminator_->forward(batch.data), 1.0) + bce(discriminator_->forward(fake.detach()), 0.0);
    d_loss.backward();
    d_opt_->step();
    g_opt_->zero_grad();
    const auto g_loss = bce(discriminator_->forward(fake), 1.0);
    g_loss.backward();
    g_opt_->step();
    return {{"d_loss", d_loss.item<double>()},
            {"g_loss", g_loss.item<double>()},
            {"num_samples", static_cast<double>(batch.size())}};
  }

 private:
  static torch::nn::Sequential two_layers(int64_t in, int64_t out) {
    return torch::nn::Sequential(torch::nn::Linear(in, 16), torch::nn::Tanh(), torch::nn::Linear(16, out));
  }
  torch::nn::Sequential generator_{nullptr}, discriminator_{nullptr};
  torch::optim::Optimizer* g_opt_ = nullptr;
  torch::optim::Optimizer* d_opt_ = nullptr;
};

inline std::vector<float> running_stats(torch::nn::Module& model) {
  std::vector<float> out;
  for (const auto& b : model.named_buffers()) {
    if (b.key().find("running_") == std::string::npos || !b.value().is_floating_point()) continue;
    const auto t = b.value().to(torch::kCPU).contiguous().reshape({-1});
    out.insert(out.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  }
  return out;
}

// Small enough to train 20 steps in a second, with several buckets and several layers.
inline json synthetic_config() {
  return {{"model", "cnn"}, {"dataset", "synthetic"}, {"synthetic_samples", 4096}, {"synthetic_image_size", 28},
          {"lr", 0.01},     {"momentum", 0.9},        {"dropout", false}};
}

inline TrainerConfig base_config(int workers, const std::string& strategy, int64_t batch) {
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
inline Params single_process(int64_t batch, int64_t steps, const json& config = synthetic_config(),
                             const StepConfig& step = {}, Metrics* metrics = nullptr,
                             std::vector<float>* stats = nullptr) {
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

// Data parallelism's claim: the replicas' weighted average of their shards' gradients is the
// global batch's gradient. In float32 they round differently from one process's single batch; on
// an AVX2 machine 20 steps ended 2.6e-6 apart (8.3e-6 for the uneven split), a drift that depends
// on the CPU's kernels (40 steps: 5.5e-5 on one machine, under 1e-5 on another). 5e-5 leaves room
// for that and still fails any real error: weighting the uneven split's 32 and 31 samples alike
// ends 4.8e-3 apart, and a lost or unaveraged gradient further.
inline void expect_equivalent(TrainerConfig config, int64_t steps = 20) {
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

// gpt-tiny, 2 workers, on a token file of `lines` lines of text written into `dir`, with AdamW,
// 5 warmup steps and cosine decay over `decay_steps`, stepped per batch.
inline TrainerConfig language_model_job(const testing::TempDir& dir, int lines, int64_t decay_steps) {
  std::string text;
  for (int i = 0; i < lines; ++i) text += "verse " + std::to_string(i * 7919 % 1000) + " of the text\n";
  data::write_token_file(dir.file("train.tok"), data::encode_bytes(text), 256);
  TrainerConfig c{.num_workers = 2, .batch_size = 16, .device = "cpu", .seed = 7, .threads_per_worker = 1};
  c.config = {{"model", "gpt-tiny"}, {"train_tokens", dir.file("train.tok")},
              {"context", 32},       {"lr", 1e-3},
              {"warmup_steps", 5},   {"decay_steps", decay_steps}};
  c.step.scheduler_step_freq = SchedulerStepFreq::kBatch;
  return c;
}

// step.zero_stage 1: each replica's optimizer holds state for its pieces of the parameters only
// (a flat block of every bucket) and steps only those; the buckets are reduce-scattered before
// the step and the pieces allgathered after it. Stage 2 also keeps only its block's averages, the
// gradients passing through a ring of 8 buckets (small buckets here, so that the ring turns over
// many times a backward). The parameters must be those of plain allreduce (the same averaged
// gradients, the same optimizer arithmetic per element), and each replica's optimizer state 1/N
// of plain's. Stage 3 also keeps only its block of the parameters, gathering each layer as
// forward and backward reach it. Fails if the pieces are not gathered (replicas keep the
// others' old values), if a piece is stepped twice or viewed in the wrong place, if the state is
// not sharded, if a ring buffer is reused before its bucket is reduced, if stage 2 keeps every
// gradient, if stage 3 keeps every parameter or computes with a layer not gathered (released
// memory, or the values before the step).
inline void expect_zero_equals_plain(TrainerConfig c, const std::string& op, int64_t steps, double tolerance = 1e-6,
                                     bool balanced = false) {
  c.comm.grad_shard_bytes = 64 << 10;
  struct Run {
    testing::Params params;
    double state_bytes, gradient_bytes, comm_bytes;
  };
  const auto run = [&](int stage) {
    c.step.zero_stage = stage;
    Trainer t(op, c);
    const auto r = t.train({.num_steps = steps});
    EXPECT_EQ(r.batch, steps);
    const auto comm = r.metrics.find("comm_bytes_per_step");  // sent across hosts
    const auto model = t.get_model();
    double params = 0, buffers = 0;  // stages 1 and 2 keep every parameter, stage 3 its block
    for (const auto& p : model->parameters()) params += static_cast<double>(p.nbytes());
    for (const auto& b : model->buffers()) buffers += static_cast<double>(b.nbytes());
    if (stage < 3) {
      EXPECT_EQ(r.metrics.at("parameter_bytes"), params + buffers) << "stage " << stage;
    } else {  // each bucket padded to a multiple of N floats
      const double n = c.num_workers;
      EXPECT_NEAR(r.metrics.at("parameter_bytes"), buffers + params / n, params / n * 0.02 + 4096) << "stage 3";
    }
    return Run{params_of(*model), r.metrics.at("optimizer_state_bytes"), r.metrics.at("gradient_bytes"),
               comm != r.metrics.end() ? comm->second : 0.0};
  };
  const double ring_bytes = [&] {  // stage 2's ring: 8 buffers, each as large as its largest bucket
    Trainer t(op, c);
    std::vector<size_t> counts;
    for (const auto& p : t.get_model()->parameters()) counts.push_back(static_cast<size_t>(p.numel()));
    return 4.0 * static_cast<double>(torch_glue::ring_elements(counts, c.comm.grad_shard_bytes));
  }();
  const Run plain = run(0);
  const double n = c.num_workers;
  EXPECT_GT(plain.state_bytes, 0);
  for (int stage : {1, 2, 3}) {
    const Run zero = run(stage);
    const double difference = max_difference(plain.params, zero.params);
    std::printf(
        "%s, %d workers: zero %d %.2g from plain allreduce; optimizer state %.0f bytes a replica (plain "
        "%.0f), gradients %.0f bytes (plain %.0f), %.0f bytes a step across hosts (plain %.0f)\n",
        op.c_str(), c.num_workers, stage, difference, zero.state_bytes, plain.state_bytes, zero.gradient_bytes,
        plain.gradient_bytes, zero.comm_bytes, plain.comm_bytes);
    // Accumulating, stage 2 averages each micro-batch by itself and adds the averages, where plain
    // averages the sum: another rounding (9.6e-7 and 8.5e-7 from plain with AdamW after 20 steps,
    // as the GPT's kernels round; stage 1, summing as plain does, within clipping's 8.1e-7).
    const double limit = stage >= 2 && c.step.accumulate_steps > 1 ? 3 * tolerance : tolerance;
    EXPECT_LT(difference, limit) << "stage " << stage;
    EXPECT_LT(zero.state_bytes, plain.state_bytes / n * 1.35) << "the state is not sharded at stage " << stage;
    EXPECT_GT(zero.state_bytes, plain.state_bytes / n * 0.65) << "stage " << stage;
    // A reduce-scatter and an allgather send one allreduce's bytes across hosts; here the host of
    // one replica is padded to the other's two (4/3). An allreduce of zero-padded shares after the
    // gradients' would send 2x. Accumulating, stage 2 reduces every micro-batch.
    // Stage 3 gathers each layer twice (forward, backward): 1.5 allreduces, ZeRO's figure.
    if (plain.comm_bytes > 0 && !(stage >= 2 && c.step.accumulate_steps > 1)) {
      const double allreduces = stage == 3 ? 1.5 : 1.0;
      EXPECT_LT(zero.comm_bytes, plain.comm_bytes * 1.4 * allreduces) << "stage " << stage << " sends too much";
      if (stage == 3) EXPECT_GT(zero.comm_bytes, plain.comm_bytes * 1.2) << "stage 3 gathers no layer";
    }
    // Stage 1 keeps every gradient and its block of the averages beside (1/N more, and each
    // bucket padded to a multiple of N floats).
    if (stage == 1) {
      EXPECT_GE(zero.gradient_bytes, plain.gradient_bytes * (1 + 1 / n));
      EXPECT_LT(zero.gradient_bytes, plain.gradient_bytes * (1 + 1 / n) * 1.01);
    }
    // The image classifier's largest layer is most of it, and its owner keeps its gradient: only
    // a model of many like-sized tensors shows the share.
    if (stage >= 2 && balanced) {
      EXPECT_LT(zero.gradient_bytes, plain.gradient_bytes / n * 1.35 + ring_bytes) << "every gradient is kept";
      EXPECT_LT(zero.gradient_bytes, plain.gradient_bytes * 0.85);
    }
  }
}

// ps: shards inside the workers; pseudo-hosts put the shard exchange on Gloo, as across machines.
inline TrainerConfig ps_config(int workers, int hosts, int shards, int64_t batch = 64) {
  auto c = base_config(workers, "ps", batch);
  c.launch.local_hosts = hosts;
  c.ps.shards = shards;
  return c;
}

// ps with update on shards: the owners apply SGD (momentum 0.9) to their slices.
inline TrainerConfig ps_update_config(int workers, int hosts, int shards, int64_t batch = 64) {
  auto c = ps_config(workers, hosts, shards, batch);
  c.ps.update_on_shards = true;
  return c;
}

// ps with the shards in processes of their own (spawned by the driver), in both update modes.
inline TrainerConfig ps_processes_config(int workers, int hosts, int shards, bool update_on_shards,
                                         int64_t batch = 64) {
  auto c = ps_config(workers, hosts, shards, batch);
  c.ps.placement = "processes";
  c.ps.update_on_shards = update_on_shards;
  return c;
}

// ps_async: 2 workers on 2 pseudo-hosts, 2 shards, worker 1 sleeping 40 ms per step.
struct SlowRun {
  double fast_s, slow_s, slow_staleness_max;
  std::vector<double> weight_sums;
};

inline SlowRun run_with_a_slow_worker(const std::string& strategy, int max_staleness) {
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
  SlowRun out{r.per_worker.at(0).at("epoch_s"),
              r.per_worker.at(1).at("epoch_s"),
              r.per_worker.at(1).count("staleness_max") ? r.per_worker.at(1).at("staleness_max") : -1.0,
              {}};
  for (const auto& w : t.foreach_worker("weight_sum")) out.weight_sums.push_back(w.get<double>());
  return out;
}

// Trains `from` 10 steps, saves, loads into a fresh `to` job; both go on 5 steps and must agree.
// The momentum (0.9) must come along: without it the two part at once.
inline void expect_checkpoint_moves(const TrainerConfig& from, const TrainerConfig& to) {
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

// `base` (2 workers or more) trained in float32 and under `precision` from the same start, on
// Fashion-MNIST with the CNN: the loss over the first `probe` steps and over `probe` steps after
// `steps` more. Float32's loss must fall by at least 0.5 (so there is something to compare), the
// other precision's end within `share` of that fall from float32's, every replica of a run must
// hold the same weights, and the parameters of the two runs must differ (autocast did change the
// arithmetic).
inline void expect_trains_like_fp32(TrainerConfig base, Precision precision, int64_t probe, int64_t steps,
                                    double share) {
  EXPECT_GE(base.num_workers, 2) << "one worker cannot show that the replicas agree";
  base.config = {{"model", "cnn"}, {"dataset", "fashion-mnist"}, {"lr", 0.05}, {"momentum", 0.9}, {"dropout", false}};
  struct Run {
    double first, last;
    Params params;
  };
  std::map<Precision, Run> runs;
  for (const auto p : {Precision::kFp32, precision}) {
    auto c = base;
    c.step.precision = p;
    Trainer t(dsgd::kImageClassifier, c);
    const double first = t.train({.num_steps = probe}).metrics.at("loss");
    t.train({.num_steps = steps});
    const double last = t.train({.num_steps = probe}).metrics.at("loss");
    const std::string name = Choice<Precision>(p).name();
    std::cout << name << ": loss " << first << " -> " << last << "\n";
    const auto prints = t.foreach_worker("weight_sum");
    for (const auto& w : prints) EXPECT_EQ(w, prints[0]) << "replicas differ under " << name;
    runs[p] = {first, last, params_of(*t.get_model())};
  }
  const Run& fp32 = runs[Precision::kFp32];
  const Run& other = runs[precision];
  const double fall = fp32.first - fp32.last;
  EXPECT_GT(fall, 0.5) << "float32 hardly trained: nothing to compare";
  EXPECT_LT(other.last, other.first - (1 - share) * fall) << "it fell less than float32 did";
  EXPECT_NEAR(other.last, fp32.last, share * fall);
  EXPECT_GT(max_difference(other.params, fp32.params), 1e-5) << "ran as float32";
}

inline void expect_config_error(const std::string& op, TrainerConfig c, const std::string& needle) {
  const auto t0 = Clock::now();
  try {
    Trainer t(op, c);
    FAIL() << "accepted; expected an error mentioning '" << needle << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, milliseconds(500)) << "the check should come before any process starts";
}

// NanOperator's jobs: 16 samples per worker.
inline TrainerConfig nan_config(int workers) {
  TrainerConfig c;
  c.num_workers = workers;
  c.batch_size = 16 * workers;
  return c;
}

// This process's live children with `flag` on their command line.
inline std::vector<int> child_pids_with(const std::string& flag) {
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
inline std::vector<int> shard_process_pids() { return child_pids_with("--dsgd-ps-server"); }

inline std::vector<int> worker_pids() { return child_pids_with("--dsgd-worker"); }

// 2 workers of a regression operator that kills a replica itself (DiesAtStepOperator,
// DiesInSnapshotOperator), a snapshot exactly every `every_steps`, one standby.
inline TrainerConfig self_killing_config(int64_t batch, int64_t every_steps) {
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
inline void await_standby(Trainer& t) {
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
inline Results train_through_fault(TrainerConfig c, int sig, std::vector<int>* victims = nullptr,
                                   double tolerance = 1e-7, bool shard_victim = false,
                                   const std::function<void(Trainer&)>& after = {},
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

// The call's scale-up, if it had one.
inline std::optional<RecoveryEvent> scale_up_in(const Results& r) {
  for (const auto& ev : r.recoveries) {
    if (ev.kind == "scale_up") return ev;
  }
  return std::nullopt;
}

// Trains 5 steps a call until the job scales back up (for up to 60 s), adding the steps to *steps.
inline std::optional<RecoveryEvent> train_until_scale_up(Trainer& t, int64_t* steps) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    auto r = t.train({.num_steps = 5});
    *steps += static_cast<int64_t>(r.metrics.at("batches"));
    if (auto ev = scale_up_in(r)) return ev;
  }
  return std::nullopt;
}

#define SKIP_WITHOUT_CUDA()                                                                        \
  if (!torch::cuda::is_available()) {                                                              \
    GTEST_SKIP() << "LibTorch sees no CUDA device (Debian's LibTorch has no CUDA): runs on a GPU " \
                    "machine (bench/gpu/run.sh)";                                                  \
  }

inline TrainerConfig gpu_config(int workers, const std::string& model) {
  TrainerConfig c = base_config(workers, "allreduce", 64);
  c.device = "cuda";
  c.config["model"] = model;
  return c;
}

}  // namespace dsgd::trainer_testing
