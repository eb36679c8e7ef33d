// dsgd/torch/operator.h — what the user writes: a TrainingOperator says how to build and train one
// replica; dsgd runs one per replica and keeps them in step.
//
//   class MnistOperator : public dsgd::TrainingOperator {
//    public:
//     void setup(const nlohmann::json& config) override {
//       auto net = register_model(std::make_shared<Net>());
//       register_optimizer(std::make_unique<torch::optim::SGD>(net->parameters(), config.value("lr", 0.01)));
//       register_loss(dsgd::cross_entropy_loss());
//       register_data(train_images, train_labels, test_images, test_labels);
//     }
//   };
//   DSGD_REGISTER_OPERATOR(MnistOperator);   // workers construct it by this name
//
// The defaults run the usual supervised loop: train_epoch walks this replica's share of each
// global batch (see sampler()), train_batch does zero_grad, forward, loss, backward (of
// scale_loss(loss)), check_gradients, step.
// Gradients are averaged over every replica inside backward(): autograd hooks hand each bucket
// to the strategy as soon as its last gradient is ready, and backward returns with the average
// in every parameter's .grad. Custom train_batch code therefore looks like single-process code
// (zero the gradients each step; gradient accumulation across backward calls is not averaged).
// Several models and optimizers may be registered (GANs); a custom train_batch decides the loop.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include "dsgd/torch/dataset.h"
#include "dsgd/torch/metrics.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <typeinfo>
#include <vector>

namespace dsgd {

using LossFn = std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;
LossFn cross_entropy_loss();

// A learning-rate schedule: lr = base_lr * factor(t), t counted in batches or epochs
// (Trainer's scheduler_step_freq). Its state (t) is saved in checkpoints.
using LrLambda = std::function<double(int64_t t)>;

// In-memory tensors as a Dataset (samples along dimension 0; targets may be undefined).
std::shared_ptr<const Dataset> tensor_dataset(torch::Tensor data, torch::Tensor targets = {});

// Where a replica stands, for operators that want to know.
struct ReplicaInfo {
  int rank = 0;          // 0..world_size-1, over every replica of every worker
  int world_size = 1;
  int worker = 0;        // the worker process
  int local_replica = 0; // replica within the worker (devices_per_worker)
  uint64_t seed = 1;     // the job's seed (LibTorch is seeded with it before setup)
  // Where this replica computes (TrainerConfig::device, resolved). The runtime moves the
  // registered models and data there after setup(); tensors that train_batch makes itself
  // belong there too.
  torch::Device device = torch::kCPU;
};

namespace torch_glue {
class ReplicaHost;
struct OperatorAccess;
}  // namespace torch_glue

class TrainingOperator {
 public:
  virtual ~TrainingOperator();

  // Builds models, optimizers, loss, schedules and data from the job's config (any JSON).
  virtual void setup(const nlohmann::json& config) = 0;

  // One pass over this replica's share of the training data (or `max_batches` batches when > 0).
  // Returns metrics averaged over batches weighted by their samples.
  virtual Metrics train_epoch(int64_t max_batches);
  // One step on this replica's part of the global batch: zero_grad, forward, loss, backward
  // (gradients averaged over replicas), optimizer step. Returns loss, accuracy, num_samples.
  virtual Metrics train_batch(const Batch& batch);
  // Evaluates on this replica's share of the validation data.
  virtual Metrics validate();
  virtual Metrics validate_batch(const Batch& batch);
  // Extra state of the operator, saved in and restored from checkpoints.
  virtual void state_dict(torch::serialize::OutputArchive& archive) const {}
  virtual void load_state_dict(torch::serialize::InputArchive& archive) {}

  // ---- registration, in setup(); each returns what it registered ----
  // A model: a torch::nn::Module (shared_ptr or ModuleHolder). If it has forward(Tensor), the
  // default train_batch and validate_batch use it (through forward()).
  template <typename M>
  std::shared_ptr<M> register_model(std::shared_ptr<M> model) {
    add_model(model, forward_of(model.get()));
    return model;
  }
  template <typename H>
    requires requires(H h) { h.ptr(); }
  H register_model(H holder) {
    add_model(holder.ptr(), forward_of(holder.ptr().get()));
    return holder;
  }
  torch::optim::Optimizer& register_optimizer(std::unique_ptr<torch::optim::Optimizer> optimizer);
  void register_loss(LossFn loss);
  // A schedule for optimizer `optimizer` (its param groups' learning rates at registration are
  // the base rates).
  void register_scheduler(LrLambda factor, size_t optimizer = 0);
  // In-memory tensors: samples along dimension 0. Targets and the validation pair may be
  // undefined (then the operator overrides what needs them).
  void register_data(torch::Tensor train_data, torch::Tensor train_targets = {}, torch::Tensor validation_data = {},
                     torch::Tensor validation_targets = {});
  // Datasets read by index instead (dsgd/torch/dataset.h): nothing is loaded up front; the
  // validation set may be null. Replaces data registered before, and the other way round.
  void register_dataset(std::shared_ptr<const Dataset> train, std::shared_ptr<const Dataset> validation = nullptr);

  // ---- access ----
  torch::nn::Module& model(size_t i = 0) const;
  const std::vector<std::shared_ptr<torch::nn::Module>>& models() const { return models_; }
  torch::optim::Optimizer& optimizer(size_t i = 0) const;
  size_t num_optimizers() const { return optimizers_.size(); }
  const LossFn& loss() const;
  // Model i's forward(x); ConfigError if its type has no forward(Tensor).
  torch::Tensor forward(const torch::Tensor& x, size_t i = 0) const;
  const ReplicaInfo& replica() const { return info_; }
  // The next batches of this replica for the current epoch (set up by the runtime).
  int64_t num_train_samples() const;
  // The registered datasets (null where tensors were registered, or nothing).
  const std::shared_ptr<const Dataset>& train_dataset() const { return train_set_; }
  const std::shared_ptr<const Dataset>& validation_dataset() const { return val_set_; }
  const torch::Tensor& train_data() const { return train_data_; }
  const torch::Tensor& train_targets() const { return train_targets_; }
  const torch::Tensor& validation_data() const { return val_data_; }
  const torch::Tensor& validation_targets() const { return val_targets_; }

  // For custom train_epoch code, while a Trainer runs the operator (ConfigError otherwise: an
  // operator made with make_operator has no sampler or schedules). next_train_batch fills `batch` with this replica's
  // part of the next global batch of the epoch (never empty) and returns false at the end of the epoch or once
  // `max_batches` (> 0) were taken by this call of train_epoch. Call after_batch() after each step: it advances the
  // sampler position and steps per-batch schedules.
  bool next_train_batch(Batch& batch, int64_t max_batches = 0);
  void after_batch();
  // After backward, before the optimizer step: true if every replica's gradients are finite. If
  // not, per the job's nonfinite_policy, counts a skipped step ("skipped_steps" in the results)
  // and returns false (skip: do not step), or throws dsgd::Error naming the step (error). Every
  // replica gets the same answer. Checked as backward makes the gradients: changes made to
  // .grad after backward are not. With step.accumulate_steps > 1 each batch is a micro-batch:
  // false, with nothing counted, before the step's last one (its gradients are summed aside:
  // do not step; zero_grad before each is fine), and the last one's answer covers the sum.
  bool check_gradients();
  // The loss to call backward() on: `loss` times the loss scale where the job scales losses
  // (TrainerConfig::step.loss_scale; precision fp16 by default; under accumulation also times
  // the micro-batch's share of the step's samples), `loss` itself otherwise. The
  // runtime unscales the averaged gradients, and check_gradients() skips the step and backs
  // the scale off when they overflowed. Custom train_batch code: scale_loss(loss).backward(),
  // then check_gradients() before each optimizer step.
  torch::Tensor scale_loss(const torch::Tensor& loss);
  // Steps every registered schedule once (for scheduler_step_freq "manual"; the runtime does it
  // per batch or per epoch otherwise).
  void step_schedulers();
  // Global batches in an epoch (the last partial one is dropped when it has fewer samples than
  // there are replicas).
  int64_t batches_per_epoch() const;

 private:
  friend struct torch_glue::OperatorAccess;
  torch_glue::ReplicaHost& host(const char* call) const;  // ConfigError when there is none
  using ForwardFn = std::function<torch::Tensor(const torch::Tensor&)>;
  template <typename M>
  static ForwardFn forward_of(M* m) {
    if constexpr (requires(M& mm, torch::Tensor x) { { mm.forward(x) } -> std::convertible_to<torch::Tensor>; }) {
      return [m](const torch::Tensor& x) { return m->forward(x); };
    } else {
      return {};
    }
  }
  void add_model(std::shared_ptr<torch::nn::Module> model, ForwardFn forward);
  std::vector<std::shared_ptr<torch::nn::Module>> models_;
  std::vector<ForwardFn> forwards_;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers_;
  LossFn loss_;
  struct Schedule {
    LrLambda factor;
    size_t optimizer = 0;
    std::vector<double> base_lrs;
  };
  std::vector<Schedule> schedules_;
  torch::Tensor train_data_, train_targets_, val_data_, val_targets_;
  std::shared_ptr<const Dataset> train_set_, val_set_;
  ReplicaInfo info_;
  torch_glue::ReplicaHost* host_ = nullptr;  // the runtime running this operator, set before setup
};

// ---- registry: workers construct operators by name, never from anything else received ----
using OperatorFactory = std::function<std::unique_ptr<TrainingOperator>()>;
void register_operator(const std::string& name, OperatorFactory factory);
std::unique_ptr<TrainingOperator> make_operator(const std::string& name);  // ConfigError if unknown
bool has_operator(const std::string& name);
std::vector<std::string> operator_names();
// An operator's own check of its config (TrainerConfig::config), run by the Trainer's validation
// in the driver before any process starts (and by dsgd::validate_config): throws ConfigError
// naming the key that is wrong. Optional; without one, the config is the operator's setup()'s
// business alone.
using OperatorConfigCheck = std::function<void(const nlohmann::json& config)>;
void register_operator_config_check(const std::string& name, OperatorConfigCheck check);
// Runs `name`'s config check, if it registered one.
void check_operator_config(const std::string& name, const nlohmann::json& config);
// An operator's metrics computed from others over a whole split (the language model's perplexity,
// exp of its mean loss per token), which averaging per-replica values would get wrong: run on a
// split's metrics once they are whole (dsgd::Evaluator's). Optional.
using OperatorMetricsDerivation = std::function<void(Metrics& whole)>;
void register_operator_derived_metrics(const std::string& name, OperatorMetricsDerivation derive);
// Adds `name`'s derived metrics to `whole`, if it registered any.
void derive_operator_metrics(const std::string& name, Metrics& whole);

// The name DSGD_REGISTER_OPERATOR(T) registered T under ("T"). ConfigError if T was not registered.
std::string operator_name(const std::type_info& type);
template <typename T>
std::string operator_of() {
  return operator_name(typeid(T));
}
void register_operator_type(const std::type_info& type, const std::string& name);

}  // namespace dsgd

// At namespace scope in a .cpp of the binary: makes `Class` constructible by name ("Class").
#define DSGD_REGISTER_OPERATOR(Class)                                                                    \
  static const bool dsgd_operator_registered_##Class = [] {                                             \
    ::dsgd::register_operator(#Class, [] { return std::unique_ptr<::dsgd::TrainingOperator>(new Class()); }); \
    ::dsgd::register_operator_type(typeid(Class), #Class);                                               \
    return true;                                                                                         \
  }()
