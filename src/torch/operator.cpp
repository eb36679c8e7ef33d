// TrainingOperator's defaults (the usual supervised loop) and the operator registry.
#include "dsgd/torch/operator.h"

#include <torch/nn/functional/loss.h>
#include <torch/types.h>

#include <mutex>
#include <typeindex>
#include <unordered_map>

#include "comm/timeline.h"
#include "dsgd/common/error.h"
#include "torch/replica/host.h"

namespace dsgd {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sums metrics weighted by num_samples; mean() divides back.
class MetricsMean {
 public:
  void add(const Metrics& m) {
    const double w = m.count("num_samples") ? m.at("num_samples") : 1.0;
    weight_ += w;
    for (const auto& [k, v] : m) {
      if (k != "num_samples") sums_[k] += v * w;
    }
  }
  Metrics mean() const {
    Metrics out;
    for (const auto& [k, v] : sums_) out[k] = weight_ > 0 ? v / weight_ : 0;
    out["num_samples"] = weight_;
    return out;
  }

 private:
  std::map<std::string, double> sums_;
  double weight_ = 0;
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, OperatorFactory> factories;
  std::map<std::string, OperatorConfigCheck> config_checks;
  std::map<std::string, OperatorMetricsDerivation> derived_metrics;
  std::unordered_map<std::type_index, std::string> names;
};

Registry& registry() {
  static Registry r;
  return r;
}

// A copy of what `name` registered in `table` (empty where it registered nothing), taken under
// the lock and called outside it.
template <typename F>
F registered(std::map<std::string, F> Registry::*table, const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = (r.*table).find(name);
  return it == (r.*table).end() ? F() : it->second;
}

}  // namespace

LossFn cross_entropy_loss() {
  return [](const torch::Tensor& output, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(output, target);
  };
}

TrainingOperator::~TrainingOperator() = default;

torch::optim::Optimizer& TrainingOperator::register_optimizer(std::unique_ptr<torch::optim::Optimizer> optimizer) {
  if (!optimizer) throw ConfigError("register_optimizer: null optimizer");
  optimizers_.push_back(std::move(optimizer));
  return *optimizers_.back();
}

void TrainingOperator::register_loss(LossFn loss) { loss_ = std::move(loss); }

void TrainingOperator::register_scheduler(LrLambda factor, size_t optimizer) {
  if (!factor) throw ConfigError("register_scheduler: empty schedule function");
  schedules_.push_back({std::move(factor), optimizer, {}});
}

void TrainingOperator::register_data(torch::Tensor train_data, torch::Tensor train_targets,
                                     torch::Tensor validation_data, torch::Tensor validation_targets) {
  if (!train_data.defined() || train_data.dim() == 0 || train_data.size(0) == 0) {
    throw ConfigError("register_data: the training data is empty");
  }
  if (train_targets.defined() && train_targets.size(0) != train_data.size(0)) {
    throw ConfigError("register_data: " + std::to_string(train_data.size(0)) + " training samples but " +
                      std::to_string(train_targets.size(0)) + " targets");
  }
  if (validation_data.defined() && validation_targets.defined() &&
      validation_targets.size(0) != validation_data.size(0)) {
    throw ConfigError("register_data: " + std::to_string(validation_data.size(0)) + " validation samples but " +
                      std::to_string(validation_targets.size(0)) + " targets");
  }
  train_data_ = std::move(train_data);
  train_targets_ = std::move(train_targets);
  val_data_ = std::move(validation_data);
  val_targets_ = std::move(validation_targets);
  train_set_ = val_set_ = nullptr;
}

void TrainingOperator::register_dataset(std::shared_ptr<const Dataset> train,
                                        std::shared_ptr<const Dataset> validation) {
  if (train == nullptr || train->size() <= 0) throw ConfigError("register_dataset: the training dataset is empty");
  train_set_ = std::move(train);
  val_set_ = std::move(validation);
  train_data_ = train_targets_ = val_data_ = val_targets_ = torch::Tensor();
}

int64_t TrainingOperator::num_train_samples() const {
  if (train_data_.defined()) return train_data_.size(0);
  return train_set_ ? train_set_->size() : 0;
}

namespace {

class TensorDataset final : public Dataset {
 public:
  TensorDataset(torch::Tensor data, torch::Tensor targets) : data_(std::move(data)), targets_(std::move(targets)) {
    if (!data_.defined() || data_.dim() == 0) throw ConfigError("tensor_dataset: the data is empty");
    if (targets_.defined() && targets_.size(0) != data_.size(0)) {
      throw ConfigError("tensor_dataset: " + std::to_string(data_.size(0)) + " samples but " +
                        std::to_string(targets_.size(0)) + " targets");
    }
  }
  int64_t size() const override { return data_.size(0); }
  Batch get_batch(const torch::Tensor& indices) const override {
    return {data_.index_select(0, indices), targets_.defined() ? targets_.index_select(0, indices) : torch::Tensor()};
  }

 private:
  torch::Tensor data_, targets_;
};

}  // namespace

std::shared_ptr<const Dataset> tensor_dataset(torch::Tensor data, torch::Tensor targets) {
  return std::make_shared<TensorDataset>(std::move(data), std::move(targets));
}

torch::nn::Module& TrainingOperator::model(size_t i) const {
  if (i >= models_.size()) {
    throw ConfigError("model " + std::to_string(i) + " requested but " + std::to_string(models_.size()) +
                      " registered");
  }
  return *models_[i];
}

void TrainingOperator::add_model(std::shared_ptr<torch::nn::Module> model, ForwardFn forward) {
  if (!model) throw ConfigError("register_model: null model");
  models_.push_back(std::move(model));
  forwards_.push_back(std::move(forward));
}

torch::Tensor TrainingOperator::forward(const torch::Tensor& x, size_t i) const {
  model(i);  // range check
  if (!forwards_[i]) {
    throw ConfigError("model " + std::to_string(i) + " has no forward(Tensor); override train_batch and " +
                      "validate_batch to call it your way");
  }
  return forwards_[i](x);
}

torch::optim::Optimizer& TrainingOperator::optimizer(size_t i) const {
  if (i >= optimizers_.size()) {
    throw ConfigError("optimizer " + std::to_string(i) + " requested but " + std::to_string(optimizers_.size()) +
                      " registered");
  }
  return *optimizers_[i];
}

const LossFn& TrainingOperator::loss() const {
  if (!loss_) throw ConfigError("no loss registered: call register_loss() in setup() or override train_batch");
  return loss_;
}

torch_glue::ReplicaHost& TrainingOperator::host(const char* call) const {
  if (host_ == nullptr) {
    throw ConfigError(std::string(call) + ": this operator is not being run by a Trainer (one made with " +
                      "make_operator has no sampler, schedules or gradient check); call it from train_epoch or " +
                      "train_batch while dsgd trains it");
  }
  return *host_;
}

bool TrainingOperator::next_train_batch(Batch& batch, int64_t max_batches) {
  return host("next_train_batch").next_batch(batch, max_batches);
}
void TrainingOperator::after_batch() { host("after_batch").after_batch(); }
void TrainingOperator::step_schedulers() { host("step_schedulers").step_schedules(); }
bool TrainingOperator::check_gradients() { return host("check_gradients").check_gradients(); }
torch::Tensor TrainingOperator::scale_loss(const torch::Tensor& loss) { return host("scale_loss").scale_loss(loss); }
int64_t TrainingOperator::batches_per_epoch() const { return host("batches_per_epoch").batches_per_epoch(); }

Metrics TrainingOperator::train_epoch(int64_t max_batches) {
  MetricsMean mean;
  Batch batch;
  for (auto& m : models_) m->train();
  while (next_train_batch(batch, max_batches)) {
    mean.add(train_batch(batch));
    after_batch();
  }
  return mean.mean();
}

Metrics TrainingOperator::train_batch(const Batch& batch) {
  auto& opt = optimizer(0);
  auto& runtime = host("train_batch");
  const bool prof = runtime.profiling();
  auto t = Clock::now();
  torch::Tensor output, loss_value;
  {
    comm::timeline::Span span("forward");
    opt.zero_grad();
    output = forward(batch.data);
    loss_value = loss()(output, batch.target);
  }
  if (prof) runtime.add_phase("forward_s", since(t));
  t = Clock::now();
  {
    comm::timeline::Span span("backward");
    runtime.scale_loss(loss_value).backward();
  }
  if (prof) runtime.add_phase("backward_s", since(t));
  t = Clock::now();
  {
    comm::timeline::Span span("optimizer");
    if (check_gradients()) opt.step();  // a non-finite gradient skips the step everywhere, or throws
  }
  if (prof) runtime.add_phase("optimizer_s", since(t));
  Metrics m{{"loss", loss_value.item<double>()}, {"num_samples", static_cast<double>(batch.size())}};
  if (output.dim() == 2 && batch.target.defined() && batch.target.dim() == 1 &&
      batch.target.scalar_type() == torch::kInt64) {
    m["accuracy"] = output.argmax(1).eq(batch.target).sum().item<double>() / static_cast<double>(batch.size());
  }
  runtime.report_loss(m["loss"]);
  return m;
}

Metrics TrainingOperator::validate() {
  if (!val_data_.defined() && val_set_ == nullptr) return {};
  torch::NoGradGuard no_grad;
  for (auto& m : models_) m->eval();
  // This replica's contiguous share of the validation set.
  const int64_t n = val_data_.defined() ? val_data_.size(0) : val_set_->size();
  const int64_t w = info_.world_size, r = info_.rank;
  const int64_t begin = r * (n / w) + std::min(r, n % w);
  const int64_t end = begin + n / w + (r < n % w ? 1 : 0);
  MetricsMean mean;
  constexpr int64_t kBatch = 1000;
  for (int64_t s = begin; s < end; s += kBatch) {
    const int64_t e = std::min(end, s + kBatch);
    Batch b;
    if (val_data_.defined()) {
      b = {val_data_.slice(0, s, e), val_targets_.defined() ? val_targets_.slice(0, s, e) : torch::Tensor()};
    } else {
      b = val_set_->get_batch(torch::arange(s, e, torch::kInt64));
    }
    b.data = b.data.to(info_.device, /*non_blocking=*/true);
    if (b.target.defined()) b.target = b.target.to(info_.device, /*non_blocking=*/true);
    mean.add(validate_batch(b));
  }
  for (auto& m : models_) m->train();
  return mean.mean();
}

Metrics TrainingOperator::validate_batch(const Batch& batch) {
  auto output = forward(batch.data);
  Metrics m{{"loss", loss()(output, batch.target).item<double>()}, {"num_samples", static_cast<double>(batch.size())}};
  if (output.dim() == 2 && batch.target.defined() && batch.target.dim() == 1) {
    m["accuracy"] = output.argmax(1).eq(batch.target).sum().item<double>() / static_cast<double>(batch.size());
  }
  return m;
}

// ---- registry ----

void register_operator(const std::string& name, OperatorFactory factory) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[name] = std::move(factory);
}

void register_operator_type(const std::type_info& type, const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.names[std::type_index(type)] = name;
}

std::string operator_name(const std::type_info& type) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.names.find(std::type_index(type));
  if (it == r.names.end()) {
    throw ConfigError(std::string("operator type ") + type.name() +
                      " is not registered; add DSGD_REGISTER_OPERATOR(YourOperator) to a .cpp of the binary");
  }
  return it->second;
}

void register_operator_config_check(const std::string& name, OperatorConfigCheck check) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.config_checks[name] = std::move(check);
}

void register_operator_derived_metrics(const std::string& name, OperatorMetricsDerivation derive) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.derived_metrics[name] = std::move(derive);
}

void derive_operator_metrics(const std::string& name, Metrics& whole) {
  if (const auto derive = registered(&Registry::derived_metrics, name)) derive(whole);
}

void check_operator_config(const std::string& name, const nlohmann::json& config) {
  if (const auto check = registered(&Registry::config_checks, name)) check(config);
}

bool has_operator(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.factories.count(name) > 0;
}

std::vector<std::string> operator_names() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& [name, f] : r.factories) out.push_back(name);
  return out;
}

std::unique_ptr<TrainingOperator> make_operator(const std::string& name) {
  OperatorFactory factory;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) {
      std::string known;
      for (const auto& [n, f] : r.factories) known += (known.empty() ? "" : ", ") + n;
      throw ConfigError("unknown operator '" + name + "'; registered in this binary: " +
                        (known.empty() ? "none" : known) + " (register with DSGD_REGISTER_OPERATOR)");
    }
    factory = it->second;
  }
  return factory();
}

}  // namespace dsgd
