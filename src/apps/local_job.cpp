#include "dsgd/local_job.h"

#include <ATen/Parallel.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "apps/classifier_loss.h"
#include "dsgd/data.h"
#include "dsgd/error.h"
#include "dsgd/models.h"

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

// The training and test splits the job's options name. The synthetic dataset is drawn once and
// split 4:1, so both splits share its teacher. No test split without evaluation.
std::pair<data::ImageDataset, std::optional<data::ImageDataset>> load_splits(const LocalJobOptions& o) {
  const int64_t synthetic_test = std::max<int64_t>(1, o.synthetic_samples / 4);
  std::optional<data::ImageDataset> synthetic;
  if (o.dataset == "synthetic") {
    synthetic.emplace(data::make_synthetic({.num_samples = o.synthetic_samples + synthetic_test,
                                            .channels = o.synthetic_channels,
                                            .image_size = o.synthetic_image_size,
                                            .seed = o.seed}));
  }
  auto split = [&](data::Split which) {
    if (!synthetic) return data::load_fashion_mnist(o.data_dir, which);
    auto rows = which == data::Split::kTrain ? synthetic->images().slice(0, 0, o.synthetic_samples)
                                             : synthetic->images().slice(0, o.synthetic_samples);
    auto labels = which == data::Split::kTrain ? synthetic->labels().slice(0, 0, o.synthetic_samples)
                                               : synthetic->labels().slice(0, o.synthetic_samples);
    return data::ImageDataset(rows.contiguous(), labels.contiguous(), synthetic->num_classes());
  };
  std::optional<data::ImageDataset> test;
  if (o.evaluate) test.emplace(split(data::Split::kTest));
  return {split(data::Split::kTrain), std::move(test)};
}

std::shared_ptr<models::Classifier> make_job_model(const LocalJobOptions& o, const data::ImageDataset& train) {
  models::ModelOptions mo;
  mo.in_channels = train.images().size(1);
  mo.image_size = train.images().size(2);
  mo.num_classes = train.num_classes();
  mo.dropout = o.dropout;
  mo.sim_parameters = o.sim_parameters;
  mo.sim_layers = o.sim_layers;
  mo.sim_step_ms = o.sim_step_ms;
  auto model = models::make_model(o.model, mo);
  model->train();
  return model;
}

// One job's epochs: the model, its optimizer and data, and what has been done so far.
class LocalJob {
 public:
  LocalJob(const LocalJobOptions& o, ProgressListener* listener)
      : o_(o), listener_(listener), data_(load_splits(o)), model_(make_job_model(o, data_.first)),
        optimizer_(model_->parameters(), torch::optim::SGDOptions(o.lr).momentum(o.momentum)),
        loss_(apps::classifier_loss(o.loss, data_.first.num_classes())) {
    result_.parameters = models::parameter_count(*model_);
    n_ = data_.first.length();
    batches_ = (n_ + o.batch_size - 1) / o.batch_size;
    total_steps_ = o.max_steps > 0 ? std::min(o.max_steps, batches_ * o.epochs) : batches_ * o.epochs;
  }

  LocalJobResult run() {
    for (int64_t epoch = 1; epoch <= o_.epochs && result_.steps < total_steps_; ++epoch) {
      EpochSummary summary = train_epoch(epoch);
      if (data_.second) {
        auto ev = evaluate(*model_, loss_, *data_.second);
        summary.test_loss = ev.loss;
        summary.test_accuracy = ev.accuracy;
      }
      result_.history.push_back(summary);
      for (auto& group : optimizer_.param_groups()) {
        auto& options = static_cast<torch::optim::SGDOptions&>(group.options());
        options.lr(options.lr() * o_.lr_decay);
      }
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
      auto batch = data_.first.batch(indices);
      optimizer_.zero_grad();
      auto loss = loss_(model_->forward(batch.data), batch.target);
      loss.backward();
      optimizer_.step();
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
  std::pair<data::ImageDataset, std::optional<data::ImageDataset>> data_;  // training, test
  std::shared_ptr<models::Classifier> model_;
  torch::optim::SGD optimizer_;
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
