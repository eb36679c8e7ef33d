#include "torch/replica/replica.h"

#include "dsgd/common/log.h"

#include <ATen/Parallel.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/timeline.h"
#include "dsgd/comm/cuda.h"
#include "dsgd/common/error.h"
#include "dsgd/torch/activation_checkpoint.h"
#include "torch/replica/device.h"
#include "torch/sync/server_optimizer.h"

namespace dsgd::torch_glue {
namespace {

using Clock = std::chrono::steady_clock;

// clip_grad_norm_ over every model's gradients: scales them so that their global L2 norm is at
// most max_norm. Returns the norm before.
double clip_gradients(TrainingOperator& op, double max_norm) {
  std::vector<torch::Tensor> params;
  for (auto& m : op.models()) {
    for (auto& p : m->parameters()) {
      if (p.grad().defined()) params.push_back(p);
    }
  }
  return torch::nn::utils::clip_grad_norm_(params, max_norm);
}

}  // namespace

ReplicaRuntime::ReplicaRuntime(std::unique_ptr<TrainingOperator> op, const ReplicaOptions& options)
    : op_(std::move(op)), options_(options),
      deferred_(*op_, options.step.nonfinite_policy.value(), /*warn=*/options.info.rank == 0) {
  OperatorAccess::attach(*op_, this, options.info);
  if (options_.step.loss_scale > 0) {
    scaler_.emplace(LossScaler::Options{.init_scale = options_.step.loss_scale,
                                        .growth_interval = options_.step.loss_scale_growth_interval});
  }
}

ReplicaRuntime::~ReplicaRuntime() {
  syncs_.clear();  // hooks off before the models go
  check_.reset();
}

void ReplicaRuntime::setup(const nlohmann::json& config) {
  at::set_num_threads(options_.threads);
  torch::manual_seed(options_.seed);
  op_->setup(config);
  if (op_->models().empty()) {
    throw ConfigError("the operator's setup() registered no model; call register_model() in setup()");
  }
  for (auto& s : OperatorAccess::schedules(*op_)) {
    if (s.optimizer >= op_->num_optimizers()) {
      throw ConfigError("a scheduler was registered for optimizer " + std::to_string(s.optimizer) + " but only " +
                        std::to_string(op_->num_optimizers()) + " optimizer(s) exist");
    }
    for (auto& g : op_->optimizer(s.optimizer).param_groups()) s.base_lrs.push_back(g.options().get_lr());
  }
  if (op_->num_train_samples() > 0 && op_->num_train_samples() < options_.info.world_size) {
    throw ConfigError("the training data has " + std::to_string(op_->num_train_samples()) +
                      " samples, fewer than the " + std::to_string(options_.info.world_size) + " replicas");
  }
  to_device();
  if (options_.step.precision == Precision::kFp16 && !options_.info.device.is_cuda()) {
    throw ConfigError("precision fp16 needs CUDA, and this replica computes on " + options_.info.device.str() +
                      ": LibTorch's CPU autocast runs bfloat16 only. Use precision bf16 on the CPU");
  }
  step_schedules_to(0);
}

void ReplicaRuntime::to_device() {
  const torch::Device device = options_.info.device;
  if (device.is_cpu()) return;
  for (auto& m : op_->models()) m->to(device);  // in place: the optimizers keep their parameters
  auto data = OperatorAccess::data(*op_);
  size_t bytes = 0;
  for (auto* t : data) bytes += t->defined() ? static_cast<size_t>(t->nbytes()) : 0;
  size_t free = 0, total = 0;
  const bool resident = device.is_cuda() && comm::cuda_memory_info(device.index(), &free, &total) && bytes <= free / 4;
  for (auto* t : data) {
    if (t->defined()) *t = resident ? t->to(device) : t->pin_memory();
  }
  if (options_.info.rank == 0) {
    dsgd::log().info("replicas on {}: {:.1f} MB of data {}", device.str(), static_cast<double>(bytes) / 1e6,
                     resident ? "held on the device" : "pinned in host memory, copied per batch");
  }
}

std::string ReplicaRuntime::signature() const { return model_signature(*op_); }

void ReplicaRuntime::set_info(int rank, int world_size, int worker) {
  options_.info.rank = rank;
  options_.info.world_size = world_size;
  options_.info.worker = worker;
  OperatorAccess::set_info(*op_, options_.info);
  deferred_.set_warn(rank == 0);
}

void ReplicaRuntime::attach(std::shared_ptr<strategy::GradientStrategy> strategy) {
  syncs_.clear();
  check_.reset();
  gate_index_.clear();
  if (!strategy) {
    deferred_.reset(0);
    std::vector<torch::Tensor> params;
    for (auto& m : op_->models()) {
      for (auto& p : m->parameters()) params.push_back(p);
    }
    // On a GPU the hooks' per-gradient checks would each wait for the device: check_gradients
    // checks them all at once instead.
    if (options_.info.device.is_cpu()) check_ = std::make_unique<GradCheck>(std::move(params));
    return;
  }
  // The servers take the step themselves under these: nothing to defer. Chosen per call (-1):
  // gated from the start, T 0 until set_forward_overlap_buckets.
  const bool gated = !strategy->server_updates() && options_.forward_overlap_buckets != 0;
  const size_t deferred = gated ? static_cast<size_t>(std::max<int64_t>(0, options_.forward_overlap_buckets)) : 0;
  for (size_t m = 0; m < op_->models().size(); ++m) {
    std::vector<torch::Tensor> params;
    for (auto& p : op_->models()[m]->parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    if (params.empty()) continue;
    const size_t s = syncs_.size();
    syncs_.push_back(std::make_unique<GradSync>(params, options_.grad_shard_bytes, strategy, options_.overlap,
                                                deferred, zero_.ring_buckets(options_.info.world_size),
                                                zero_.shards(options_.info.world_size)));
    if (auto* servers = syncs_.back()->servers()) {
      servers->set_optimizer(static_cast<uint32_t>(m), server_optimizer(*op_, m, params));
    }
    if (gated) {
      for (size_t i = 0; i < params.size(); ++i) gate_index_[params[i].unsafeGetTensorImpl()] = {s, i};
      syncs_.back()->deferred().set_step(
          {[this, s] { deferred_.begin(s, cursor_.where()); },
           [this, s](const std::vector<size_t>& idx, bool finite) {
             std::vector<torch::Tensor> bucket;
             for (size_t i : idx) bucket.push_back(syncs_[s]->param(i));
             if (deferred_.apply(s, bucket, finite)) ++skipped_this_call_;
           }});
    }
  }
  deferred_.reset(syncs_.size());
  zero_.partition();
}

void ReplicaRuntime::set_forward_overlap_buckets(size_t buckets) {
  if (gate_index_.empty()) return;  // not gated: the strategy steps on its servers, or T is fixed at 0
  for (auto& s : syncs_) s->set_deferred_buckets(buckets);
}

void ReplicaRuntime::wait_layer(const std::vector<torch::Tensor>& parameters) {
  zero_.enter(parameters);
  if (gate_index_.empty()) return;
  const bool profiling = times_.profiling();
  const auto t0 = profiling ? Clock::now() : Clock::time_point{};
  for (const auto& p : parameters) {
    const auto it = gate_index_.find(p.unsafeGetTensorImpl());
    if (it != gate_index_.end()) syncs_[it->second.first]->deferred().wait_for(it->second.second);
  }
  if (profiling) times_.add_gate_wait(std::chrono::duration<double>(Clock::now() - t0).count());
}

bool ReplicaRuntime::next_batch(Batch& batch, int64_t max_batches) {
  if (!cursor_.next(batch, max_batches)) return false;
  if (options_.step.accumulate_steps > 1) {
    for (auto& sync : syncs_) sync->set_micro_batch(cursor_.micro() == 0, cursor_.last_micro_batch());
  }
  set_weights();
  return true;
}

void ReplicaRuntime::set_weights() {
  // The loss scale is a power of two: dividing by it is exact.
  const double w = scaler_ ? cursor_.weight() / scaler_->scale() : cursor_.weight();
  for (auto& sync : syncs_) sync->set_weight(w);
}

torch::Tensor ReplicaRuntime::scale_loss(const torch::Tensor& loss) {
  const double factor = scaler_ ? cursor_.loss_factor() * scaler_->scale() : cursor_.loss_factor();
  return factor != 1.0 ? loss * factor : loss;
}

void ReplicaRuntime::after_batch() {
  if (check_) check_->take();  // a batch that did not ask leaves nothing for the next
  if (cursor_.end_micro_batch()) return;  // the step goes on with its next micro-batch
  boundary_.begin_update();  // what follows shares the step's result
  zero_.after_step();
  sync_statistics();
  if (options_.step.precision != Precision::kFp32) AutocastScope::clear_cache();  // the step changed the weights
  double waited = 0;
  for (const auto& sync : syncs_) waited += sync->total_wait_s();
  cursor_.end_step();
  times_.step_ended(waited, cursor_.step());
  if (options_.step.scheduler_step_freq == SchedulerStepFreq::kBatch) step_schedules();
  boundary_.end_update();
  boundary_.remember();
}

void ReplicaRuntime::step_schedules() { step_schedules_to(schedule_t_ + 1); }

void ReplicaRuntime::step_schedules_to(int64_t t) {
  schedule_t_ = t;
  for (auto& s : OperatorAccess::schedules(*op_)) {
    auto& groups = op_->optimizer(s.optimizer).param_groups();
    const double f = s.factor(t);
    for (size_t g = 0; g < groups.size() && g < s.base_lrs.size(); ++g) groups[g].options().set_lr(s.base_lrs[g] * f);
  }
}

bool ReplicaRuntime::take_step() {
  boundary_.begin_update();
  if (const double max_norm = options_.step.max_grad_norm; max_norm > 0) {
    times_.add_value("grad_norm", zero_.active() ? zero_.clip(max_norm) : clip_gradients(*op_, max_norm));
  }
  zero_.before_step();  // zero: the optimizer steps this replica's pieces only
  return true;
}

bool ReplicaRuntime::lone_gradients_finite(bool summed) {
  std::vector<torch::Tensor> grads;
  if (scaler_ || !check_ || summed) {
    for (auto& m : op_->models()) {
      for (auto& p : m->parameters()) {
        if (p.grad().defined()) grads.push_back(p.grad());
      }
    }
  }
  if (scaler_) {
    torch::NoGradGuard no_grad;
    for (auto& g : grads) g.mul_(1.0 / scaler_->scale());
  }
  // Checked as backward made them; or, a lone replica on a GPU (or after the hooks were
  // detached), all gradients at once, one host sync (isfinite().all() per parameter cost the
  // MLP ~20% of its step).
  return check_ && !summed ? check_->take() : all_finite(grads);
}

bool ReplicaRuntime::check_gradients() {
  // Accumulating: before the step's last micro-batch nothing is checked and nothing steps (a
  // lone replica sums its gradients aside; the last one gets the sum back, checked whole).
  const bool accumulating = options_.step.accumulate_steps > 1;
  if (accumulating && !cursor_.last_micro_batch()) {
    if (syncs_.empty()) lone_.hold(*op_, false);
    return false;
  }
  const bool summed = syncs_.empty() && accumulating && lone_.hold(*op_, true);
  bool finite = true;
  if (!syncs_.empty()) {
    for (auto& s : syncs_) finite = finite && s->last_finite();  // unscaled by their weight
  } else {
    finite = lone_gradients_finite(summed);
  }
  const std::string where = cursor_.where();
  if (scaler_ && (finite || !scaler_->at_minimum())) {
    const double was = scaler_->scale();
    scaler_->update(finite);
    set_weights();
    if (finite) return take_step();
    ++skipped_this_call_;
    if (options_.info.rank == 0) {
      dsgd::log().debug("gradient overflow at {}: step skipped on every replica, loss scale {} -> {}", where, was,
                        scaler_->scale());
    }
    return false;
  }
  if (finite) return take_step();
  if (options_.step.nonfinite_policy == NonfinitePolicy::kError) {
    throw Error("non-finite gradient at " + where + " (a NaN or infinite loss on some replica); lower the learning "
                "rate, check the data, or set nonfinite_policy \"skip\"");
  }
  ++skipped_this_call_;
  if (options_.info.rank == 0) {
    const bool on_servers = !syncs_.empty() && syncs_[0]->updates_on_servers();
    dsgd::log().warn("non-finite gradient at {}: {}", where,
                     on_servers ? "the ps shards it reached skipped the step (the others took it)"
                                : "step skipped on every replica");
  }
  return false;
}

namespace {

// Installs a parameter gate and replica sums for the calling thread; the ones before come back
// when it goes.
class ThreadHooks {
 public:
  ThreadHooks(ParameterGate* gate, ReplicaSums* sums, bool checkpoint_all)
      : gate_(set_thread_parameter_gate(gate)),
        sums_(set_thread_replica_sums(sums)),
        checkpoint_all_(set_thread_checkpoint_all(checkpoint_all)) {}
  ~ThreadHooks() {
    set_thread_parameter_gate(gate_);
    set_thread_replica_sums(sums_);
    set_thread_checkpoint_all(checkpoint_all_);
  }
  ThreadHooks(const ThreadHooks&) = delete;
  ThreadHooks& operator=(const ThreadHooks&) = delete;

 private:
  ParameterGate* gate_;
  ReplicaSums* sums_;
  bool checkpoint_all_;
};

}  // namespace

Metrics ReplicaRuntime::train(int64_t max_batches, bool profile) {
  times_.begin_call(profile, cursor_.batches_per_epoch());
  cursor_.begin_call();
  skipped_this_call_ = 0;
  for (auto& s : syncs_) s->take_times();
  const int64_t bytes0 = syncs_.empty() ? -1 : syncs_[0]->strategy().cross_host_bytes();
  const auto t0 = Clock::now();
  const uint64_t units0 = thread_checkpointed_units();
  comm::timeline::set_thread_name("replica " + std::to_string(options_.info.rank));
  Metrics m;
  {
    // The forward overlap's gate and SyncBatchNorm's sums (over the replicas, where there are
    // others), for this thread, while the operator trains; the steps still pending at the end are
    // taken before train() returns.
    AutocastScope autocast(options_.info.device, options_.step.precision.value());
    boundary_.clear();
    boundary_.remember();
    try {
      const ThreadHooks hooks(gate_index_.empty() && !zero_.gathers() ? nullptr : this,
                              syncs_.empty() || options_.info.world_size == 1 ? nullptr : this,
                              options_.step.activation_checkpointing);
      m = op_->train_epoch(max_batches);
      for (auto& s : syncs_) s->deferred().flush();
    } catch (...) {  // the hooks gone, as before the call
      interrupted();
      throw;
    }
  }
  const double epoch_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (cursor_.end_epoch() && options_.step.scheduler_step_freq == SchedulerStepFreq::kEpoch) step_schedules();
  add_call_metrics(&m, cursor_.steps_taken(), epoch_s, bytes0);
  if (options_.step.activation_checkpointing) {
    const auto units = static_cast<double>(thread_checkpointed_units() - units0);
    m["checkpointed_units"] = units / static_cast<double>(std::max<int64_t>(1, cursor_.steps_taken()));
    static std::atomic<bool> warned{false};
    if (units == 0 && cursor_.steps_taken() > 0 && options_.info.rank == 0 && !warned.exchange(true)) {
      dsgd::log().warn("step.activation_checkpointing is on, but the model ran no unit through "
                       "dsgd::run_checkpointed (dsgd/torch/activation_checkpoint.h): nothing is recomputed");
    }
  }
  times_.end_call();
  return m;
}

void ReplicaRuntime::add_call_metrics(Metrics* out, int64_t batches, double epoch_s, int64_t bytes0) {
  Metrics& m = *out;
  if (times_.profiling()) {
    GradSync::Times t;
    for (auto& s : syncs_) {
      const auto x = s->take_times();
      t.wait_s += x.wait_s;
      t.deferred_wait_s += x.deferred_wait_s;
      t.deferred_step_s += x.deferred_step_s;
    }
    const double n = static_cast<double>(std::max<int64_t>(1, batches));
    times_.add_phase_means(&m, n);
    m["comm_wait_s"] = t.wait_s / n;
    // Each phase its own work only: backward without its wait for communication; with a forward
    // overlap, forward without the parameter gate's waits and steps, and the deferred steps
    // counted as the optimizer's.
    auto less = [&m](const char* phase, double s) {
      if (m.count(phase)) m[phase] = std::max(0.0, m[phase] - s);
    };
    less("backward_s", (t.wait_s - t.deferred_wait_s) / n);
    less("forward_s", times_.gate_seconds() / n);
    if (m.count("optimizer_s")) m["optimizer_s"] += t.deferred_step_s / n;
    m["epoch_s"] = epoch_s;
  }
  m["batches"] = static_cast<double>(batches);
  m["skipped_steps"] = static_cast<double>(skipped_this_call_);
  times_.add_value_means(&m);
  if (scaler_) m["loss_scale"] = scaler_->scale();
  m["optimizer_state_bytes"] = static_cast<double>(optimizer_state_bytes(*op_));
  double model_bytes = 0;
  for (const auto& [name, t] : torch_glue::named_tensors(*op_)) model_bytes += static_cast<double>(t.nbytes());
  m["parameter_bytes"] = zero_.held_bytes(model_bytes);  // stage 3: the shard, and what is whole now
  if (!syncs_.empty()) {  // what the GradSyncs keep
    double bytes = 0;
    for (const auto& s : syncs_) bytes += static_cast<double>(s->gradient_bytes());
    m["gradient_bytes"] = bytes;
  }
  if (bytes0 >= 0 && batches > 0) {  // what this replica sent to other hosts, per step
    m["comm_bytes_per_step"] =
        static_cast<double>(syncs_[0]->strategy().cross_host_bytes() - bytes0) / static_cast<double>(batches);
  }
  auto* servers = syncs_.empty() ? nullptr : syncs_[0]->strategy().server_updates();
  if (servers != nullptr && servers->starts_servers_eagerly()) {  // asynchronous: how stale
    const auto st = servers->take_staleness();
    m["staleness_mean"] = st.updates > 0 ? static_cast<double>(st.sum) / static_cast<double>(st.updates) : 0.0;
    m["staleness_max"] = static_cast<double>(st.max);
  }
}

void ReplicaRuntime::interrupted() {
  boundary_.interrupted();
  cursor_.restart_step();  // the step starts again from its first micro-batch
  lone_.clear();
  zero_.forget_step();
}

Metrics ReplicaRuntime::validate() {
  AutocastScope autocast(options_.info.device, options_.step.precision.value());
  if (!zero_.gathers()) return op_->validate();
  // Stage 3: whole for the call (replicas may validate different numbers of batches, so no
  // unit is gathered per batch), released after it.
  zero_.gather_parameters();
  struct Release {
    ZeroShare& zero;
    ~Release() { zero.release_parameters(); }
  } release{zero_};
  return op_->validate();
}

size_t ReplicaRuntime::gradient_bytes(int world_size) const {
  return torch_glue::gradient_bytes(*op_, options_.grad_shard_bytes, zero_.ring_buckets(world_size),
                                    zero_.shards(world_size));
}

std::vector<std::pair<std::string, torch::Tensor>> ReplicaRuntime::named_tensors() const {
  zero_.require_whole("named_tensors");  // stage 3: gather_server_state first
  return torch_glue::named_tensors(*op_);
}

}  // namespace dsgd::torch_glue
