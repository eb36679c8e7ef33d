#include "torch/sync/grad_sync.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/engine.h>

#include <thread>

#include "comm/reduce_kernels.h"
#include "comm/timeline.h"
#include "dsgd/common/error.h"

namespace dsgd::torch_glue {
namespace {

std::vector<size_t> element_counts(const std::vector<torch::Tensor>& params) {
  std::vector<size_t> counts;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (p.scalar_type() != torch::kFloat32 || !(p.device().is_cpu() || p.device().is_cuda())) {
      throw ConfigError("parameter " + std::to_string(i) + " is " + std::string(c10::toString(p.scalar_type())) +
                        " on " + p.device().str() + "; dsgd averages float32 parameters on the CPU or CUDA (convert " +
                        "the model with ->to(torch::kFloat32))");
    }
    if (p.device() != params[0].device()) {
      throw ConfigError("parameter " + std::to_string(i) + " is on " + p.device().str() + ", parameter 0 on " +
                        params[0].device().str() + "; a model's parameters must share one device");
    }
    counts.push_back(static_cast<size_t>(p.numel()));
  }
  return counts;
}

torch::Device device_of(const std::vector<torch::Tensor>& params) {
  return params.empty() ? torch::Device(torch::kCPU) : params[0].device();
}

// The host buffer the strategy averages: its memory for gradients where it has some (zeroed, and
// keeping the strategy, whose memory it is, alive), else a tensor of its own (pinned when it
// stages a GPU's gradients, so copies to and from the device are asynchronous).
torch::Tensor host_buffer(const std::shared_ptr<strategy::GradientStrategy>& strategy, size_t count, bool pinned,
                          bool* shared) {
  float* p = strategy ? strategy->gradient_buffer(count) : nullptr;
  *shared = p != nullptr;
  if (p == nullptr) {
    return torch::zeros({static_cast<int64_t>(count)}, torch::TensorOptions(torch::kFloat32).pinned_memory(pinned));
  }
  std::fill_n(p, count, 0.0f);
  return torch::from_blob(p, {static_cast<int64_t>(count)}, [keep = strategy](void*) {}, torch::kFloat32);
}

}  // namespace

GradSync::GradSync(std::vector<torch::Tensor> params, size_t grad_shard_bytes,
                   std::shared_ptr<strategy::GradientStrategy> strategy, bool overlap, size_t deferred, size_t ring)
    : params_(std::move(params)),
      plan_(element_counts(params_), sizeof(float), grad_shard_bytes),
      strategy_(std::move(strategy)),
      device_(device_of(params_)),
      staged_(device_.is_cuda()),
      host_(host_buffer(strategy_, ring > 0 ? ring_elements(element_counts(params_), grad_shard_bytes, ring)
                                            : plan_.total_elements(),
                        staged_, &flat_shared_)),
      flat_(staged_ ? torch::zeros({static_cast<int64_t>(plan_.total_elements())},
                                   torch::TensorOptions(torch::kFloat32).device(device_))
                    : host_),
      overlap_(overlap),
      gated_(params_.size(), false),
      pending_(plan_.buckets().size()),
      ring_(std::min(ring, plan_.buckets().size())) {
  bw_.got_grad.assign(params_.size(), false);
  bw_.works.resize(plan_.buckets().size());
  bw_.ok.assign(plan_.buckets().size(), true);
  if (ring_ > 0) {
    if (staged_) {  // device auto found a GPU here (device cuda is refused by validate_zero)
      throw ConfigError("step.zero_stage 2 runs on the CPU only for now, and device auto found a GPU: use stage 1, "
                        "or device cpu",
                        "step.zero_stage");
    }
    require_checked(deferred == 0 && strategy_ && !strategy_->server_updates() && !strategy_->error_feedback(),
                    "ZeRO over allreduce, without compression or comm.forward_overlap_buckets (validate_zero)");
    ring_offsets_ = ring_offsets(plan_, ring_);
    ring_holder_.assign(ring_, -1);
    consumed_.assign(plan_.buckets().size(), 0);
    owned_grads_.resize(params_.size());
    stash_.resize(params_.size());
  }
  if (staged_ && strategy_ && strategy_->server_updates()) {
    throw ConfigError("strategy " + strategy_->name() + " updates parameters on its servers, which hold them on the " +
                      "CPU; with CUDA use allreduce, simple or ps without ps_update_on_shards");
  }
  if (staged_ && deferred > 0) {
    throw ConfigError("forward_overlap_buckets is CPU-only: set it to 0 with device cuda");
  }
  set_deferred_buckets(deferred);
  if (strategy_ && strategy_->error_feedback()) feedback_ = std::make_unique<FeedbackState>(plan_, params_);
  if (strategy_ && strategy_->server_updates()) {
    servers_ = std::make_unique<ServerSteps>(params_, plan_, *strategy_->server_updates());
  }
  torch::NoGradGuard no_grad;
  // Averages are elementwise, so a slot may keep its parameter's layout (channels_last: the
  // optimizer's multi-tensor kernels want gradients laid out as their parameters, as c10d's
  // Reducer does it). Servers that update parameters take them packed in logical order.
  const bool param_layout = !(strategy_ && strategy_->server_updates());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& s = plan_.slot(i);
    const auto& p = params_[i];
    const bool own = param_layout && p.is_non_overlapping_and_dense();
    // set_ rather than narrow(): the slot shares flat_'s storage without being an autograd view,
    // so Optimizer::zero_grad() may detach_() it once it is the parameter's .grad.
    slots_.push_back(torch::empty({0}, torch::TensorOptions(torch::kFloat32).device(device_))
                         .set_(flat_.storage(), static_cast<int64_t>(bucket_base(s.bucket) + s.offset -
                                                                     plan_.buckets()[s.bucket].offset),
                               p.sizes(), own ? p.strides() : p.contiguous().strides()));
    const unsigned id = params_[i].register_hook([this, i](torch::Tensor grad) { return on_grad(i, grad); });
    hooks_.emplace_back(params_[i], id);
  }
  for (const auto& b : plan_.buckets()) bw_.missing.push_back(b.params.size());
  if (staged_) {  // last: nothing after it throws
    stager_ = std::make_unique<HostStager>(device_, [this](size_t bucket) { on_staged(bucket); });
  }
}

GradSync::~GradSync() {
  stager_.reset();  // every staged bucket handed to the strategy
  discard_pending();
  for (auto& w : bw_.works) {  // a backward that failed part-way left its other buckets in flight
    if (!w) continue;
    try {
      w->wait();  // they write into flat_; an aborted group ends them at once
    } catch (...) {
    }
  }
  for (auto& [param, id] : hooks_) param.remove_hook(id);
  // The strategy's memory goes with it (a re-formed group): .grad keeps a copy, or, after a
  // backward that failed part-way (a lost peer), none: its gradients are torn, the step is redone,
  // and the copy would delay the recovery (0.1 s for gpt-base's 344 MB).
  if (flat_shared_ && !staged_) {
    for (auto& p : params_) {
      auto& g = p.mutable_grad();
      if (g.defined() && g.storage().is_alias_of(flat_.storage())) {
        g = failed_.empty() && !torn_ ? g.detach().clone() : torch::Tensor();
      }
    }
  }
}

GradSync::Times GradSync::take_times() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(waits_.times, Times{});
}

double GradSync::total_wait_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waits_.total_s;
}

void GradSync::throw_if_an_average_failed_locked() {
  // From the first launched bucket not yet seen done, in launch order, up to one still running
  // (an aborted group fails them all): a few checks a hook, not one per bucket.
  while (bw_.checked < bw_.next_launch) {
    const auto& work = bw_.works[schedule_.launch_order[bw_.checked]];
    if (!work && staged_) return;  // still on its way to the host
    if (work && !work->test()) return;
    if (auto error = work ? work->error() : nullptr) {  // (null: the ring's, waited for already)
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        failed_ = e.what();
        throw;
      }
    }
    ++bw_.checked;
  }
}

torch::Tensor GradSync::on_grad(size_t param, const torch::Tensor& grad) {
  std::unique_lock<std::mutex> lock(mutex_);
  // A backward that throws here never finalizes (autograd drops its callbacks), and the
  // replicas' sequences of buckets no longer match: later backwards fail too, not silently.
  auto fail = [this](const std::string& message) {
    failed_ = message;
    throw Error(message);
  };
  if (!failed_.empty()) fail(failed_);
  throw_if_an_average_failed_locked();
  const size_t bucket = plan_.slot(param).bucket;
  if (pending_[bucket]) {
    fail("parameter " + std::to_string(param) + " was used in forward while its update from the last step was " +
         "still pending: with forward_overlap_buckets, forward must call dsgd::wait_for_parameters on every layer " +
         "before using it, on every path (or set forward_overlap_buckets to 0)");
  }
  if (bw_.got_grad[param]) {
    fail("parameter " + std::to_string(param) + " received two gradients in one backward; dsgd averages one " +
         "gradient per parameter per backward (gradient accumulation is not supported)");
  }
  if (!bw_.running) {
    bw_.running = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { ring_ > 0 ? finalize_ring() : finalize(); });
  }
  bw_.got_grad[param] = true;
  if (ring_ > 0) {
    try {
      return on_grad_ring_locked(lock, param, grad);
    } catch (const std::exception& e) {  // a bucket's average failed: this backward never finalizes
      failed_ = e.what();
      throw;
    }
  }
  // Copied (times the weight) and checked in one pass; the rare other gradient is copied by
  // LibTorch, then checked in its slot. Added to earlier held ones, the sum is checked.
  auto& slot = slots_[param];
  float* dst = slot.data_ptr<float>();
  const size_t n = static_cast<size_t>(slot.numel());
  if (staged_) {  // checked on the host, once staged
    if (acc_.held) {
      slot.add_(grad, weight_);
    } else {
      torch::mul_out(slot, grad, weight_);
    }
    params_[param].mutable_grad() = torch::Tensor();
    if (!acc_.hold) {
      --bw_.missing[bucket];
      if (overlap_) launch_ready_locked(false);
    }
    return slot.detach();
  }
  bool ok;
  if (acc_.held) {
    slot.add_(grad, weight_);
    ok = comm::copy_scaled_below(dst, dst, n, 1.0f, kGradLimit);
  } else {
    ok = fill_checked(slot, grad);
  }
  if (!ok) bw_.ok[bucket] = false;
  // AccumulateGrad runs after this hook, with what it returns: with no .grad it takes the slot
  // as it is (no sum into an old .grad, no copy), and autograd's own gradient is freed now, not
  // held in .grad until backward's end (a whole model's gradients more at the peak).
  // finalize() then makes the slot, holding the average, the .grad.
  params_[param].mutable_grad() = torch::Tensor();
  if (!acc_.hold) {  // held: summed only, launched by the next backward not held
    --bw_.missing[bucket];
    if (overlap_) launch_ready_locked(false);
  }
  return slot.detach();
}

bool GradSync::fill_checked(torch::Tensor& dst, const torch::Tensor& grad) const {
  float* out = dst.data_ptr<float>();
  const size_t n = static_cast<size_t>(dst.numel());
  if (grad.scalar_type() == torch::kFloat32 && grad.device().is_cpu() && grad.layout() == torch::kStrided &&
      grad.is_contiguous() && dst.is_contiguous() && grad.numel() == dst.numel()) {
    return comm::copy_scaled_below(out, grad.data_ptr<float>(), n, static_cast<float>(weight_), kGradLimit);
  }
  torch::mul_out(dst, grad, weight_);
  return comm::copy_scaled_below(out, out, n, 1.0f, kGradLimit);
}

void GradSync::launch_ready_locked(bool after_backward) {
  const auto& buckets = plan_.buckets();
  while (bw_.next_launch < buckets.size()) {
    const size_t i = schedule_.launch_order[bw_.next_launch];
    if (bw_.missing[i] != 0 || (!after_backward && schedule_.deferred[i])) break;  // the deferred wait for the end
    comm::timeline::instant("launch", static_cast<int64_t>(i));
    comm::timeline::BucketScope scope(static_cast<int64_t>(i));  // the strategy's operations name it
    if (servers_) {  // the servers check the averages themselves
      bw_.works[i] = servers_->launch(i, flat_.data_ptr<float>() + buckets[i].offset, bw_.next_launch == 0);
    } else if (staged_) {
      const auto n = static_cast<int64_t>(buckets[i].count), offset = static_cast<int64_t>(buckets[i].offset);
      stager_->stage(i, host_.narrow(0, offset, n), flat_.narrow(0, offset, n));
    } else {
      float* data = flat_.data_ptr<float>() + bucket_base(i);
      // Tells every replica: the average's first element is then NaN everywhere.
      if (!bw_.ok[i] && buckets[i].count > 0) data[0] = std::numeric_limits<float>::quiet_NaN();
      bw_.works[i] = average_async(i, data);
    }
    ++bw_.next_launch;
  }
}

std::shared_ptr<comm::Work> GradSync::average_async(size_t bucket, float* data) {
  if (feedback_) return feedback_->average_async(*strategy_->error_feedback(), bucket, data);
  return strategy_->average_async(data, plan_.buckets()[bucket].count);
}

void GradSync::on_staged(size_t bucket) {
  const auto& b = plan_.buckets()[bucket];
  float* data = host_.data_ptr<float>() + b.offset;
  const bool ok = comm::copy_scaled_below(data, data, b.count, 1.0f, kGradLimit);
  // Tells every replica: the average's first element is then NaN everywhere.
  if (!ok && b.count > 0) data[0] = std::numeric_limits<float>::quiet_NaN();
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    comm::timeline::BucketScope scope(static_cast<int64_t>(bucket));
    bw_.works[bucket] = average_async(bucket, data);
  } catch (...) {
    auto failed = std::make_shared<comm::Work>("staged bucket " + std::to_string(bucket));
    failed->complete(std::current_exception());
    bw_.works[bucket] = failed;
  }
}

void GradSync::wait_for(size_t param) {
  gated_[param] = true;
  const size_t bucket = plan_.slot(param).bucket;
  if (pending_[bucket]) apply_pending(bucket);
}

void GradSync::set_deferred_buckets(size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bw_.running || bw_.next_launch != 0) {
    throw Error("GradSync: the deferred buckets cannot change during a backward");
  }
  deferred_count_ = std::min(count, plan_.buckets().size());
  schedule_ = strategy::overlap_schedule(plan_.buckets().size(), deferred_count_);
}

void GradSync::set_micro_batch(bool first, bool last) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bw_.running || bw_.next_launch != 0) throw Error("GradSync: micro-batches cannot change during a backward");
  if (first) {  // a new step: whatever an interrupted one held is dropped
    acc_.held = false;
    ring_finite_ = true;
  }
  const bool hold = !last;
  if (hold && (deferred_count_ > 0 || servers_)) {
    throw Error("GradSync: gradient accumulation needs the replicas' own step: not with deferred buckets or updates "
                "on the servers");
  }
  acc_.hold = hold;
}

void GradSync::flush() {
  for (size_t i : schedule_.launch_order) {
    if (pending_[i]) apply_pending(i);
  }
}

void GradSync::apply_pending(size_t bucket) {
  auto work = std::move(pending_[bucket]);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    comm::timeline::Span span("wait", static_cast<int64_t>(bucket));
    work->wait();
  } catch (...) {
    discard_pending();
    throw;
  }
  comm::timeline::Span step_span("deferred step", static_cast<int64_t>(bucket));
  const auto t1 = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const double waited = std::chrono::duration<double>(t1 - t0).count();
    waits_.count(waited);
    waits_.times.deferred_wait_s += waited;
  }
  torch::NoGradGuard no_grad;
  const auto& b = plan_.buckets()[bucket];
  const bool finite = average_ok(bucket);
  for (size_t i : b.params) params_[i].mutable_grad() = slots_[i];
  try {
    deferred_.apply(b.params, finite);
  } catch (...) {
    for (size_t i : b.params) params_[i].mutable_grad() = torch::Tensor();
    discard_pending();
    throw;
  }
  for (size_t i : b.params) params_[i].mutable_grad() = torch::Tensor();
  std::lock_guard<std::mutex> lock(mutex_);
  waits_.times.deferred_step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
}

void GradSync::discard_pending() {
  for (auto& w : pending_) {
    if (!w) continue;
    try {
      w->wait();  // it writes into flat_
    } catch (...) {
    }
    w.reset();
  }
}

bool GradSync::average_ok(size_t bucket) const {
  return plan_.buckets()[bucket].count == 0 || std::isfinite(host_.data_ptr<float>()[bucket_base(bucket)]);
}

size_t GradSync::bucket_base(size_t bucket) const {
  return ring_ > 0 ? ring_offsets_[bucket % ring_] : plan_.buckets()[bucket].offset;
}

void GradSync::wait_staged(std::unique_lock<std::mutex>& lock) {
  if (!stager_) return;
  lock.unlock();  // the stager's hand-over takes it
  stager_->wait_idle();
  lock.lock();
}

void GradSync::reset_backward_locked() {
  bw_.running = false;
  // The hooks made each slot (or a copy aside) its parameter's .grad: not a result (yet).
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  bw_.next_launch = bw_.checked = 0;
  std::fill(bw_.got_grad.begin(), bw_.got_grad.end(), false);
  for (size_t b = 0; b < plan_.buckets().size(); ++b) bw_.missing[b] = plan_.buckets()[b].params.size();
  std::fill(bw_.ok.begin(), bw_.ok.end(), true);
}

void GradSync::finalize() {
  // Steps still pending from the last backward belong to parameters this forward did not use
  // (on_grad throws for the others): taken before their slots are overwritten.
  flush();
  std::unique_lock<std::mutex> lock(mutex_);
  // Parameters without a gradient in this backward contribute zeros (to a held sum: nothing,
  // and the sum is checked here).
  for (size_t i = 0; i < params_.size(); ++i) {
    if (bw_.got_grad[i]) continue;
    if (!acc_.held) {
      slots_[i].zero_();
    } else if (!staged_) {
      float* p = slots_[i].data_ptr<float>();
      if (!comm::copy_scaled_below(p, p, static_cast<size_t>(slots_[i].numel()), 1.0f, kGradLimit))
        bw_.ok[plan_.slot(i).bucket] = false;
    }
    if (!acc_.hold) --bw_.missing[plan_.slot(i).bucket];
  }
  if (acc_.hold) {  // nothing sent: the next backward adds to the sum
    acc_.held = true;
    wait_staged(lock);
    reset_backward_locked();
    last_finite_ = true;
    return;
  }
  acc_.held = false;
  launch_ready_locked(true);
  bool defer = deferred_count_ > 0 && deferred_.apply && !servers_;
  for (size_t i = 0; i < params_.size(); ++i) defer = defer && (!bw_.got_grad[i] || gated_[i]);
  std::fill(gated_.begin(), gated_.end(), false);
  if (defer) {
    pending_.swap(bw_.works);
    reset_backward_locked();
    lock.unlock();
    last_finite_ = true;  // each bucket's step checks its own
    if (deferred_.begin) deferred_.begin();
    return;
  }
  wait_staged(lock);  // every staged bucket handed to the strategy
  std::vector<std::shared_ptr<comm::Work>> works;
  for (size_t i : schedule_.launch_order) works.push_back(std::move(bw_.works[i]));
  lock.unlock();
  const auto t0 = std::chrono::steady_clock::now();
  std::exception_ptr error;
  comm::timeline::Span span("wait for every bucket");
  for (auto& w : works) {
    try {
      if (w) w->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  lock.lock();
  waits_.count(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  reset_backward_locked();  // ready for the next backward whatever happened
  torn_ = error != nullptr;
  lock.unlock();
  if (error) std::rethrow_exception(error);
  torch::NoGradGuard no_grad;
  if (servers_) {
    // The slots hold the servers' new parameters; .grad stays undefined, so the optimizer skips them.
    last_finite_ = servers_->finish_step();
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].copy_(slots_[i]);
      params_[i].mutable_grad() = torch::Tensor();
    }
    return;
  }
  last_finite_ = true;
  for (size_t b = 0; b < plan_.buckets().size(); ++b) last_finite_ = last_finite_ && average_ok(b);
  if (staged_) flat_.copy_(host_, /*non_blocking=*/true);  // in the device's queue, before the optimizer's kernels
  // The averages are in the slots: each slot becomes its parameter's .grad, with no copy.
  for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = slots_[i];
}

}  // namespace dsgd::torch_glue
