#include "dsgd/apps/local_job.h"

#include <ATen/Parallel.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "apps/classifier_parts.h"
#include "dsgd/data/datasets.h"
#include "dsgd/common/error.h"
#include "dsgd/models/registry.h"

namespace dsgd {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

Evaluation evaluate(models::Classifier& model, const LossFn& loss, const data::ImageDataset& test) {
  torch::NoGradGuard no_grad;
  model.eval();
  constexpr int64_t kEvalBatch = 1000;
  const int64_t n = test.length();
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t start = 0; start < n; start += kEvalBatch) {
    const int64_t end = std::min(n, start + kEvalBatch);
    auto x = test.images().slice(0, start, end);
    auto y = test.labels().slice(0, start, end);
    auto logits = model.forward(x);
    loss_sum += loss(logits, y).item<double>() * static_cast<double>(end - start);  // the batch's mean
    correct += logits.argmax(1).eq(y).sum().item<int64_t>();
  }
  model.train();
  return {loss_sum / static_cast<double>(n), static_cast<double>(correct) / static_cast<double>(n)};
}

// The training and test splits the job's options name (no test split without evaluation), and
// the options of a model for them.
struct Splits {
  data::ImageDataset train;
  std::optional<data::ImageDataset> test;
  models::ModelOptions model;
};

Splits load_splits(const LocalJobOptions& o) {
  const apps::ClassifierData d = apps::classifier_data(o, o.seed);
  std::optional<data::ImageDataset> test;
  if (o.evaluate && d.test_x.defined()) test.emplace(d.test_x, d.test_y, d.num_classes);
  return {data::ImageDataset(d.train_x, d.train_y, d.num_classes), std::move(test),
          apps::classifier_model_options(o, d)};
}

std::shared_ptr<models::Classifier> make_job_model(const LocalJobOptions& o, const models::ModelOptions& mo) {
  auto model = models::make_model(o.model, mo);
  model->train();
  return model;
}

// One job's epochs: the model, its optimizer and data, and what has been done so far.
class LocalJob {
 public:
  LocalJob(const LocalJobOptions& o, ProgressListener* listener)
      : o_(o), listener_(listener), data_(load_splits(o)), model_(make_job_model(o, data_.model)),
        optimizer_(apps::classifier_optimizer(model_->parameters(), o)),
        loss_(apps::classifier_loss(o.loss, data_.model.num_classes)) {
    result_.parameters = models::parameter_count(*model_);
    n_ = data_.train.length();
    batches_ = (n_ + o.batch_size - 1) / o.batch_size;
    total_steps_ = o.max_steps > 0 ? std::min(o.max_steps, batches_ * o.epochs) : batches_ * o.epochs;
  }

  LocalJobResult run() {
    for (int64_t epoch = 1; epoch <= o_.epochs && result_.steps < total_steps_; ++epoch) {
      EpochSummary summary = train_epoch(epoch);
      if (data_.test) {
        auto ev = evaluate(*model_, loss_, *data_.test);
        summary.test_loss = ev.loss;
        summary.test_accuracy = ev.accuracy;
      }
      result_.history.push_back(summary);
      apps::scale_learning_rate(*optimizer_, o_.lr_decay);
      result_.epochs = epoch;
      result_.train_loss = summary.train_loss;
      result_.test_loss = summary.test_loss;
      result_.test_accuracy = summary.test_accuracy;
      if (listener_ != nullptr) listener_->on_epoch(summary);
    }
    result_.samples_per_s = result_.train_s > 0 ? static_cast<double>(result_.samples) / result_.train_s : 0;
    return result_;
  }

 private:
  EpochSummary train_epoch(int64_t epoch) {
    // A fresh permutation per epoch, derived from the seed alone so any process can recompute it.
    auto gen = at::detail::createCPUGenerator(o_.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch));
    auto order = torch::randperm(n_, gen);
    EpochSummary summary;
    summary.epoch = epoch;
    double loss_sum = 0;
    int64_t epoch_samples = 0;
    const auto epoch_start = Clock::now();
    for (int64_t b = 0; b < batches_ && result_.steps < total_steps_; ++b) {
      const auto step_start = Clock::now();
      auto indices = order.slice(0, b * o_.batch_size, std::min(n_, (b + 1) * o_.batch_size));
      auto batch = data_.train.batch(indices);
      optimizer_->zero_grad();
      auto loss = loss_(model_->forward(batch.data), batch.target);
      loss.backward();
      optimizer_->step();
      const double loss_value = loss.item<double>();
      const int64_t bs = indices.size(0);
      result_.train_s += seconds_since(step_start);
      result_.steps++;
      result_.samples += bs;
      loss_sum += loss_value * static_cast<double>(bs);
      epoch_samples += bs;
      if (listener_ != nullptr) {
        listener_->on_batch({.epoch = epoch, .epochs = o_.epochs, .batch = b + 1, .batches_per_epoch = batches_,
                             .step = result_.steps, .total_steps = total_steps_, .loss = loss_value,
                             .samples_per_s = static_cast<double>(result_.samples) / result_.train_s,
                             .elapsed_s = result_.train_s});
      }
    }
    summary.epoch_s = seconds_since(epoch_start);
    summary.train_loss = loss_sum / static_cast<double>(epoch_samples);
    summary.samples_per_s = static_cast<double>(epoch_samples) / summary.epoch_s;
    return summary;
  }

  const LocalJobOptions& o_;
  ProgressListener* listener_;
  Splits data_;
  std::shared_ptr<models::Classifier> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LossFn loss_;
  LocalJobResult result_;
  int64_t n_ = 0;            // training samples
  int64_t batches_ = 0;      // per epoch
  int64_t total_steps_ = 0;  // of the job
};

}  // namespace

LocalJobResult run_local_job(const LocalJobOptions& o, ProgressListener* listener) {
  validate(o);
  const auto wall_start = Clock::now();
  at::set_num_threads(o.threads);
  torch::manual_seed(o.seed);
  LocalJobResult result = LocalJob(o, listener).run();
  result.wall_s = seconds_since(wall_start);
  return result;
}

}  // namespace dsgd
