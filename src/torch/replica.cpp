#include "torch/replica.h"

#include <ATen/Parallel.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <unordered_set>

#include "comm/timeline.h"
#include "dsgd/error.h"

namespace dsgd::torch_glue {
namespace {

using Clock = std::chrono::steady_clock;

// The seed's epoch permutation; runtime/local_job.cpp draws the same one.
torch::Tensor epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  auto gen = at::detail::createCPUGenerator(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch + 1));
  return torch::randperm(n, gen);
}

// The key torch::optim::Optimizer files a parameter's state under.
std::string state_key(const torch::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

// Model `m`'s parameters on the servers: the torch::optim::SGD param group holding them all,
// whose options each step reads and whose state receives the servers' momentum.
GradSync::ServerOptimizer server_optimizer(const std::vector<std::unique_ptr<torch::optim::Optimizer>>& optimizers,
                                           size_t m, const std::vector<torch::Tensor>& params) {
  auto contains = [](const std::vector<torch::Tensor>& group, const torch::Tensor& p) {
    return std::any_of(group.begin(), group.end(),
                       [&](const torch::Tensor& q) { return q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl(); });
  };
  for (const auto& opt : optimizers) {
    for (size_t g = 0; g < opt->param_groups().size(); ++g) {
      const auto& group = opt->param_groups()[g].params();
      if (!contains(group, params[0])) continue;
      auto* sgd = dynamic_cast<torch::optim::SGD*>(opt.get());
      const bool all = std::all_of(params.begin(), params.end(), [&](const torch::Tensor& p) { return contains(group, p); });
      if (sgd == nullptr || !all) {
        throw ConfigError("the ps servers apply SGD themselves (ps_update_on_shards, ps_async), so model " +
                          std::to_string(m) + "'s parameters must all be in one param group of a " +
                          "torch::optim::SGD; " +
                          (sgd == nullptr ? "its optimizer is another kind" : "they are spread over several groups") +
                          ". Use SGD, or allreduce or ps without update on shards");
      }
      GradSync::ServerOptimizer o;
      o.options = [sgd, g] {
        const auto& x = static_cast<const torch::optim::SGDOptions&>(sgd->param_groups()[g].options());
        return strategy::SgdOptions{static_cast<float>(x.lr()), static_cast<float>(x.momentum()),
                                    static_cast<float>(x.dampening()), static_cast<float>(x.weight_decay()),
                                    x.nesterov()};
      };
      o.momentum = [sgd, params](size_t i) {
        auto it = sgd->state().find(state_key(params[i]));
        if (it == sgd->state().end()) return torch::Tensor();
        return static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
      };
      o.set_momentum = [sgd, params](size_t i, torch::Tensor t) {
        if (!t.defined()) {
          sgd->state().erase(state_key(params[i]));
          return;
        }
        auto state = std::make_unique<torch::optim::SGDParamState>();
        state->momentum_buffer(std::move(t));
        sgd->state()[state_key(params[i])] = std::move(state);
      };
      return o;
    }
  }
  throw ConfigError("the ps servers apply SGD themselves (ps_update_on_shards, ps_async), but model " +
                    std::to_string(m) + "'s parameters are in no optimizer; register a torch::optim::SGD for them "
                    "in setup");
}

}  // namespace

ReplicaRuntime::ReplicaRuntime(std::unique_ptr<TrainingOperator> op, const ReplicaOptions& options)
    : op_(std::move(op)), options_(options) {
  op_->runtime_ = this;
  op_->info_ = options.info;
}

ReplicaRuntime::~ReplicaRuntime() {
  syncs_.clear();  // hooks off before the models go
  check_.reset();
}

void ReplicaRuntime::setup(const nlohmann::json& config) {
  at::set_num_threads(options_.threads);
  torch::manual_seed(options_.seed);
  op_->setup(config);
  if (op_->models_.empty()) {
    throw ConfigError("the operator's setup() registered no model; call register_model() in setup()");
  }
  for (auto& s : op_->schedules_) {
    if (s.optimizer >= op_->optimizers_.size()) {
      throw ConfigError("a scheduler was registered for optimizer " + std::to_string(s.optimizer) + " but only " +
                        std::to_string(op_->optimizers_.size()) + " optimizer(s) exist");
    }
    for (auto& g : op_->optimizers_[s.optimizer]->param_groups()) s.base_lrs.push_back(g.options().get_lr());
  }
  if (op_->train_data_.defined() && op_->train_data_.size(0) < options_.info.world_size) {
    throw ConfigError("the training data has " + std::to_string(op_->train_data_.size(0)) +
                      " samples, fewer than the " + std::to_string(options_.info.world_size) + " replicas");
  }
  step_schedules_to(0);
}

std::string ReplicaRuntime::signature() const {
  std::ostringstream out;
  for (size_t m = 0; m < op_->models_.size(); ++m) {
    for (const auto& item : op_->models_[m]->named_parameters()) {
      out << "model" << m << "." << item.key() << " " << item.value().sizes() << " " << item.value().dtype() << "\n";
    }
    for (const auto& item : op_->models_[m]->named_buffers()) {
      out << "model" << m << "." << item.key() << " " << item.value().sizes() << " " << item.value().dtype()
          << " (buffer)\n";
    }
  }
  return out.str();
}

void ReplicaRuntime::set_info(int rank, int world_size, int worker) {
  options_.info.rank = rank;
  options_.info.world_size = world_size;
  options_.info.worker = worker;
  op_->info_ = options_.info;
}

void ReplicaRuntime::attach(std::shared_ptr<strategy::GradientStrategy> strategy) {
  syncs_.clear();
  check_.reset();
  deferred_.clear();
  gate_index_.clear();
  if (!strategy) {
    std::vector<torch::Tensor> params;
    for (auto& m : op_->models_) {
      for (auto& p : m->parameters()) params.push_back(p);
    }
    check_ = std::make_unique<GradCheck>(std::move(params));
    return;
  }
  // The servers take the step themselves under these: nothing to defer. Chosen per call (-1):
  // gated from the start, T 0 until set_forward_overlap_buckets.
  const bool gated = !strategy->updates_on_servers() && options_.forward_overlap_buckets != 0;
  const size_t deferred = gated ? static_cast<size_t>(std::max<int64_t>(0, options_.forward_overlap_buckets)) : 0;
  for (size_t m = 0; m < op_->models_.size(); ++m) {
    std::vector<torch::Tensor> params;
    for (auto& p : op_->models_[m]->parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    if (params.empty()) continue;
    const size_t s = syncs_.size();
    syncs_.push_back(std::make_unique<GradSync>(params, options_.grad_shard_bytes, strategy, options_.overlap, deferred));
    if (strategy->updates_on_servers()) {
      syncs_.back()->set_server_optimizer(static_cast<uint32_t>(m), server_optimizer(op_->optimizers_, m, params));
    }
    if (gated) {
      for (size_t i = 0; i < params.size(); ++i) gate_index_[params[i].unsafeGetTensorImpl()] = {s, i};
      syncs_.back()->set_deferred_step(
          {[this, s] { begin_deferred(s); },
           [this, s](const std::vector<size_t>& idx, bool finite) { apply_deferred(s, idx, finite); }});
    }
    deferred_.emplace_back();
  }
}

double ReplicaRuntime::steady_step_seconds() const {
  std::vector<double> gaps;
  for (size_t i = 1; i < batch_ends_.size(); ++i) {
    gaps.push_back(std::chrono::duration<double>(batch_ends_[i] - batch_ends_[i - 1]).count());
  }
  if (gaps.empty()) return 0;
  std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
  return gaps[gaps.size() / 2];
}

void ReplicaRuntime::set_forward_overlap_buckets(size_t buckets) {
  if (gate_index_.empty()) return;  // not gated: the strategy steps on its servers, or T is fixed at 0
  for (auto& s : syncs_) s->set_deferred_buckets(buckets);
}

void ReplicaRuntime::wait(const torch::Tensor& parameter) {
  const auto it = gate_index_.find(parameter.unsafeGetTensorImpl());
  if (it == gate_index_.end()) return;
  const auto t0 = profiling_ ? Clock::now() : Clock::time_point{};
  syncs_[it->second.first]->wait_for(it->second.second);
  if (profiling_) gate_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

void ReplicaRuntime::begin_deferred(size_t sync) {
  auto& d = deferred_[sync];
  d.lrs.clear();
  for (const auto& opt : op_->optimizers_) {
    d.lrs.emplace_back();
    for (const auto& g : opt->param_groups()) d.lrs.back().push_back(g.options().get_lr());
  }
  d.where = "epoch " + std::to_string(position_.epoch + 1) + ", batch " + std::to_string(position_.batch + 1);
  d.skipped = false;
}

void ReplicaRuntime::apply_deferred(size_t sync, const std::vector<size_t>& params, bool finite) {
  auto& d = deferred_[sync];
  if (!finite) {
    if (options_.nonfinite == NonfinitePolicy::kError) {
      throw Error("non-finite gradient at " + d.where + " (a NaN or infinite loss on some replica); lower the " +
                  "learning rate, check the data, or set nonfinite_policy \"skip\"");
    }
    if (!d.skipped) {
      d.skipped = true;
      ++skipped_this_call_;
      if (options_.info.rank == 0) {
        std::cerr << "dsgd: warning: non-finite gradient at " << d.where << ": the buckets holding it skipped the "
                  << "step on every replica (with forward overlap each bucket steps on its own)\n";
      }
    }
    return;
  }
  std::unordered_set<const void*> mine;
  for (size_t i : params) mine.insert(syncs_[sync]->param(i).unsafeGetTensorImpl());
  // Each optimizer holding some of these parameters steps with only theirs visible (the others'
  // .grad hidden meanwhile), at the learning rates of the step they belong to.
  for (size_t k = 0; k < op_->optimizers_.size(); ++k) {
    auto& groups = op_->optimizers_[k]->param_groups();
    bool owns = false;
    for (const auto& g : groups) {
      for (const auto& p : g.params()) owns = owns || mine.count(p.unsafeGetTensorImpl()) > 0;
    }
    if (!owns) continue;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> hidden;
    std::vector<double> lrs;
    for (size_t g = 0; g < groups.size(); ++g) {
      for (auto& p : groups[g].params()) {
        if (mine.count(p.unsafeGetTensorImpl()) == 0 && p.grad().defined()) {
          hidden.emplace_back(p, p.grad());
          p.mutable_grad() = torch::Tensor();
        }
      }
      lrs.push_back(groups[g].options().get_lr());
      if (k < d.lrs.size() && g < d.lrs[k].size()) groups[g].options().set_lr(d.lrs[k][g]);
    }
    auto restore = [&] {
      for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(lrs[g]);
      for (auto& [p, grad] : hidden) p.mutable_grad() = grad;
    };
    try {
      op_->optimizers_[k]->step();
    } catch (...) {
      restore();
      throw;
    }
    restore();
  }
}

void ReplicaRuntime::gather_server_state() {
  for (auto& s : syncs_) s->gather_server_state();
}

void ReplicaRuntime::drop_server_state_copy() {
  for (auto& s : syncs_) {
    if (s->updates_on_servers()) s->drop_optimizer_momentum();
  }
}

int64_t ReplicaRuntime::batches_per_epoch() const {
  const int64_t n = op_->num_train_samples();
  const int64_t b = options_.global_batch;
  const int64_t full = n / b;
  return full + ((n % b) >= options_.info.world_size ? 1 : 0);
}

void ReplicaRuntime::start_epoch_order() {
  if (order_epoch_ == position_.epoch) return;
  order_ = epoch_order(op_->num_train_samples(), options_.seed, position_.epoch);
  order_epoch_ = position_.epoch;
}

std::pair<int64_t, int64_t> ReplicaRuntime::my_part(int64_t batch) const {
  const int64_t n = op_->num_train_samples();
  const int64_t start = batch * options_.global_batch;
  const int64_t size = std::min(n, start + options_.global_batch) - start;
  const int64_t w = options_.info.world_size;
  const int64_t r = options_.info.rank;
  const int64_t base = size / w, extra = size % w;
  const int64_t begin = start + r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

bool ReplicaRuntime::next_batch(Batch& batch, int64_t max_batches) {
  if (!op_->train_data_.defined()) {
    throw ConfigError("train_epoch needs training data: call register_data() in setup() or override train_epoch");
  }
  if (position_.batch >= batches_per_epoch()) return false;
  if (max_batches > 0 && taken_this_call_ >= max_batches) return false;
  start_epoch_order();
  comm::timeline::Span span("next batch");
  const auto [begin, end] = my_part(position_.batch);
  const int64_t global = std::min(op_->num_train_samples(), (position_.batch + 1) * options_.global_batch) -
                         position_.batch * options_.global_batch;
  auto idx = order_.slice(0, begin, end);
  batch.data = op_->train_data_.index_select(0, idx);
  batch.target = op_->train_targets_.defined() ? op_->train_targets_.index_select(0, idx) : torch::Tensor();
  const double weight = static_cast<double>(end - begin) * options_.info.world_size / static_cast<double>(global);
  for (auto& s : syncs_) s->set_weight(weight);
  ++taken_this_call_;
  return true;
}

void ReplicaRuntime::after_batch() {
  batch_ends_.push_back(Clock::now());
  ++position_.batch;
  ++progress_.batches;
  if (check_) check_->take();  // a batch that did not ask leaves nothing for the next
  if (options_.scheduler_step_freq == SchedulerStepFreq::kBatch) step_schedules();
}

void ReplicaRuntime::step_schedules() { step_schedules_to(schedule_t_ + 1); }

void ReplicaRuntime::step_schedules_to(int64_t t) {
  schedule_t_ = t;
  for (auto& s : op_->schedules_) {
    auto& groups = op_->optimizers_[s.optimizer]->param_groups();
    const double f = s.factor(t);
    for (size_t g = 0; g < groups.size() && g < s.base_lrs.size(); ++g) groups[g].options().set_lr(s.base_lrs[g] * f);
  }
}

bool ReplicaRuntime::check_gradients() {
  bool finite = true;
  if (!syncs_.empty()) {
    for (auto& s : syncs_) finite = finite && s->last_finite();
  } else if (check_) {
    finite = check_->take();  // checked as backward made them
  } else {
    // As GradSync does: one sum per gradient, one host sync (isfinite().all() per parameter
    // cost the MLP ~20% of its step).
    std::vector<torch::Tensor> sums;
    for (auto& m : op_->models_) {
      for (auto& p : m->parameters()) {
        if (p.grad().defined()) sums.push_back(p.grad().sum());
      }
    }
    if (!sums.empty()) finite = std::isfinite(torch::stack(sums).sum().item<double>());
  }
  if (finite) return true;
  const std::string where = "epoch " + std::to_string(position_.epoch + 1) + ", batch " +
                            std::to_string(position_.batch + 1);
  if (options_.nonfinite == NonfinitePolicy::kError) {
    throw Error("non-finite gradient at " + where + " (a NaN or infinite loss on some replica); lower the learning "
                "rate, check the data, or set nonfinite_policy \"skip\"");
  }
  ++skipped_this_call_;
  if (options_.info.rank == 0) {
    const bool on_servers = !syncs_.empty() && syncs_[0]->updates_on_servers();
    std::cerr << "dsgd: warning: non-finite gradient at " << where
              << (on_servers ? ": the ps shards it reached skipped the step (the others took it)\n"
                             : ": step skipped on every replica\n");
  }
  return false;
}

void ReplicaRuntime::add_phase(const char* name, double seconds) { phase_s_[name] += seconds; }

Metrics ReplicaRuntime::train(int64_t max_batches, bool profile) {
  profiling_ = profile;
  phase_s_.clear();
  taken_this_call_ = 0;
  skipped_this_call_ = 0;
  for (auto& s : syncs_) s->take_times();
  gate_s_ = 0;
  batch_ends_.clear();
  const auto t0 = Clock::now();
  comm::timeline::set_thread_name("replica " + std::to_string(options_.info.rank));
  Metrics m;
  {
    // The forward overlap's gate, for this thread, while the operator trains; the steps still
    // pending at the end are taken before train() returns.
    ParameterGate* const previous = set_thread_parameter_gate(gate_index_.empty() ? nullptr : this);
    try {
      m = op_->train_epoch(max_batches);
      for (auto& s : syncs_) s->flush();
    } catch (...) {
      set_thread_parameter_gate(previous);
      throw;
    }
    set_thread_parameter_gate(previous);
  }
  const double epoch_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const int64_t batches = taken_this_call_;
  if (position_.batch >= batches_per_epoch()) {
    ++position_.epoch;
    position_.batch = 0;
    if (options_.scheduler_step_freq == SchedulerStepFreq::kEpoch) step_schedules();
  }
  if (profile) {
    GradSync::Times t;
    for (auto& s : syncs_) {
      const auto x = s->take_times();
      t.wait_s += x.wait_s;
      t.deferred_wait_s += x.deferred_wait_s;
      t.deferred_step_s += x.deferred_step_s;
    }
    const double n = static_cast<double>(std::max<int64_t>(1, batches));
    for (const auto& [k, v] : phase_s_) m[k] = v / n;
    m["comm_wait_s"] = t.wait_s / n;
    // Each phase its own work only: backward without its wait for communication; with a forward
    // overlap, forward without the parameter gate's waits and steps, and the deferred steps
    // counted as the optimizer's.
    auto less = [&m](const char* phase, double s) {
      if (m.count(phase)) m[phase] = std::max(0.0, m[phase] - s);
    };
    less("backward_s", (t.wait_s - t.deferred_wait_s) / n);
    less("forward_s", gate_s_ / n);
    if (m.count("optimizer_s")) m["optimizer_s"] += t.deferred_step_s / n;
    m["epoch_s"] = epoch_s;
  }
  m["batches"] = static_cast<double>(batches);
  m["skipped_steps"] = static_cast<double>(skipped_this_call_);
  if (!syncs_.empty() && syncs_[0]->strategy().starts_servers_eagerly()) {  // asynchronous: how stale
    const auto st = syncs_[0]->strategy().take_staleness();
    m["staleness_mean"] = st.updates > 0 ? static_cast<double>(st.sum) / static_cast<double>(st.updates) : 0.0;
    m["staleness_max"] = static_cast<double>(st.max);
  }
  profiling_ = false;
  return m;
}

Metrics ReplicaRuntime::validate() { return op_->validate(); }

std::string ReplicaRuntime::save_state() const {
  // Straight into one string (an ostringstream copies the 10s of MB again as it grows and in str()).
  std::string bytes;
  write_state([&bytes](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  return bytes;
}

size_t ReplicaRuntime::gradient_bytes() const {
  size_t bytes = 0;
  for (const auto& m : op_->models_) {  // as attach() makes a GradSync per model with trainable parameters
    size_t floats = 0;
    for (const auto& p : m->parameters()) {
      if (p.requires_grad()) floats += static_cast<size_t>(p.numel());
    }
    bytes += (floats * sizeof(float) + 63) / 64 * 64;
  }
  return bytes;
}

size_t ReplicaRuntime::state_bytes() const {
  size_t bytes = 0;
  write_state([&bytes](const void*, size_t n) {
    bytes += n;
    return n;
  });
  return bytes;
}

void ReplicaRuntime::write_state(const std::function<size_t(const void*, size_t)>& writer) const {
  torch::serialize::OutputArchive archive;
  for (size_t i = 0; i < op_->models_.size(); ++i) {
    torch::serialize::OutputArchive sub;
    op_->models_[i]->save(sub);
    archive.write("model" + std::to_string(i), sub);
  }
  for (size_t i = 0; i < op_->optimizers_.size(); ++i) {
    torch::serialize::OutputArchive sub;
    op_->optimizers_[i]->save(sub);
    archive.write("optimizer" + std::to_string(i), sub);
  }
  archive.write("position", torch::tensor({position_.epoch, position_.batch, schedule_t_}, torch::kInt64));
  torch::serialize::OutputArchive extra;
  op_->state_dict(extra);
  archive.write("extra", extra);
  archive.save_to(writer);
}

void ReplicaRuntime::load_state(const std::string& bytes) {
  for (auto& s : syncs_) s->discard_pending();
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  for (size_t i = 0; i < op_->models_.size(); ++i) {
    torch::serialize::InputArchive sub;
    if (!archive.try_read("model" + std::to_string(i), sub)) {
      throw ConfigError("the state has no model " + std::to_string(i) + "; it was saved by an operator with fewer models");
    }
    op_->models_[i]->load(sub);
  }
  for (size_t i = 0; i < op_->optimizers_.size(); ++i) {
    torch::serialize::InputArchive sub;
    if (!archive.try_read("optimizer" + std::to_string(i), sub)) continue;
    // Loading only sets the per-parameter state the archive has: state saved before the first
    // step (no momentum buffers yet) would leave this replica's buffers in place, and the
    // replicas would drift apart. Start from none, as the saver had.
    op_->optimizers_[i]->state().clear();
    op_->optimizers_[i]->load(sub);
  }
  torch::Tensor pos;
  archive.read("position", pos);
  position_.epoch = pos[0].item<int64_t>();
  position_.batch = pos[1].item<int64_t>();
  step_schedules_to(pos[2].item<int64_t>());
  torch::serialize::InputArchive extra;
  if (archive.try_read("extra", extra)) op_->load_state_dict(extra);
  for (auto& s : syncs_) s->restart_servers();
}

std::vector<std::pair<std::string, torch::Tensor>> ReplicaRuntime::named_tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t m = 0; m < op_->models_.size(); ++m) {
    const std::string prefix = m == 0 ? "" : "model" + std::to_string(m) + ".";
    for (const auto& item : op_->models_[m]->named_parameters()) out.emplace_back(prefix + item.key(), item.value());
    for (const auto& item : op_->models_[m]->named_buffers()) out.emplace_back(prefix + item.key(), item.value());
  }
  return out;
}

}  // namespace dsgd::torch_glue
