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
#include "dsgd/torch/activation_checkpoint.h"

namespace dsgd::torch_glue {
namespace {

int shard_rank(strategy::GradientStrategy* strategy, int shards) {
  if (shards < 2) return 0;
  require_checked(strategy != nullptr && strategy->sharing() != nullptr && strategy->sharing()->size() == shards,
                  "ZeRO over strategy allreduce only, sharded over its whole group (validate_zero)");
  return strategy->sharing()->rank();
}

}  // namespace

GradSync::GradSync(std::vector<torch::Tensor> params, size_t grad_shard_bytes,
                   std::shared_ptr<strategy::GradientStrategy> strategy, bool overlap, size_t deferred, size_t ring,
                   int shards)
    : params_(std::move(params)),
      strategy_(std::move(strategy)),
      // Servers that update parameters take them packed in logical order.
      buffer_(params_, grad_shard_bytes, strategy_, ring, !(strategy_ && strategy_->server_updates()), shards,
              shard_rank(strategy_.get(), shards)),
      deferred_(std::make_unique<DeferredBuckets>(params_, buffer_.slots(), buffer_.plan(),
                                                  [this](size_t b) { return buffer_.average_ok(b); })),
      overlap_(overlap) {
  const auto& plan = buffer_.plan();
  bw_.got_grad.assign(params_.size(), false);
  bw_.works.resize(plan.buckets().size());
  bw_.ok.assign(plan.buckets().size(), true);
  for (const auto& b : plan.buckets()) bw_.missing.push_back(b.params.size());
  if (buffer_.shards().sharded()) {
    require_checked(deferred == 0 && !strategy_->server_updates() && !strategy_->error_feedback(),
                    "ZeRO over allreduce, without compression or comm.forward_overlap_buckets (validate_zero)");
    shard_ = std::make_unique<ShardBuffer>(buffer_.shards(), buffer_.device());
  }
  if (buffer_.ring() > 0) {
    if (buffer_.staged()) {  // device auto found a GPU here (device cuda is refused by validate_zero)
      throw ConfigError("step.zero_stage 2 and 3 run on the CPU only for now, and device auto found a GPU: use "
                        "stage 1, or device cpu",
                        "step.zero_stage");
    }
    require_checked(shard_ != nullptr, "stage 2's ring over several replicas (ZeroShare::ring_buckets)");
    ring_.holder.assign(buffer_.ring(), -1);
    ring_.consumed.assign(plan.buckets().size(), 0);
    ring_.stash.resize(params_.size());
  }
  if (buffer_.staged() && strategy_ && strategy_->server_updates()) {
    throw ConfigError("strategy " + strategy_->name() + " updates parameters on its servers, which hold them on the " +
                      "CPU; with CUDA use allreduce, simple or ps without ps_update_on_shards");
  }
  if (buffer_.staged() && deferred > 0) {
    throw ConfigError("forward_overlap_buckets is CPU-only: set it to 0 with device cuda");
  }
  set_deferred_buckets(deferred);
  if (strategy_ && strategy_->error_feedback()) feedback_ = std::make_unique<FeedbackState>(plan, params_);
  if (strategy_ && strategy_->server_updates()) {
    servers_ = std::make_unique<ServerSteps>(params_, plan, *strategy_->server_updates());
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const unsigned id = params_[i].register_hook([this, i](torch::Tensor grad) { return on_grad(i, grad); });
    hooks_.emplace_back(params_[i], id);
  }
  if (buffer_.staged()) {  // last: nothing after it throws
    stager_ = std::make_unique<HostStager>(buffer_.device(), [this](size_t bucket) { on_staged(bucket); });
  }
}

GradSync::~GradSync() {
  stager_.reset();  // every staged bucket handed to the strategy
  deferred_->discard();
  for (auto& w : bw_.works) {  // a backward that failed part-way left its other buckets in flight
    if (!w) continue;
    try {
      w->wait();  // they write into the buffer; an aborted group ends them at once
    } catch (...) {
    }
  }
  for (auto& [param, id] : hooks_) param.remove_hook(id);
  // The strategy's memory goes with it (a re-formed group): .grad keeps a copy, or, after a
  // backward that failed part-way (a lost peer), none: its gradients are torn, the step is redone,
  // and the copy would delay the recovery (0.1 s for gpt-base's 344 MB).
  buffer_.release_grads(params_, failed_.empty() && !torn_);
}

GradSync::Times GradSync::take_times() {
  const auto deferred = deferred_->take_times();
  std::lock_guard<std::mutex> lock(mutex_);
  Times t = std::exchange(waits_.times, Times{});
  t.wait_s += deferred.wait_s;
  t.deferred_wait_s = deferred.wait_s;
  t.deferred_step_s = deferred.step_s;
  return t;
}

double GradSync::total_wait_s() const {
  const double deferred = deferred_->total_wait_s();
  std::lock_guard<std::mutex> lock(mutex_);
  return waits_.total_s + deferred;
}

void GradSync::throw_if_an_average_failed_locked() {
  // From the first launched bucket not yet seen done, in launch order, up to one still running
  // (an aborted group fails them all): a few checks a hook, not one per bucket.
  while (bw_.checked < bw_.next_launch) {
    const auto& work = bw_.works[deferred_->schedule().launch_order[bw_.checked]];
    if (!work && buffer_.staged()) return;  // still on its way to the host
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

namespace {

// Runs `work`, then `end` (if any) whatever `work` did; `work`'s error is the one thrown.
void then_tell(const std::function<void()>& work, const std::function<void()>& end) {
  try {
    work();
  } catch (...) {
    try {
      if (end) end();
    } catch (...) {
    }
    throw;
  }
  if (end) end();
}

}  // namespace

torch::Tensor GradSync::on_grad(size_t param, const torch::Tensor& grad) {
  if (recomputing_checkpointed_unit()) return grad;  // handed on: it comes here from the outer backward
  if (listener_.grad) listener_.grad(param);  // stage 3: the unit before this one gathered first
  std::unique_lock<std::mutex> lock(mutex_);
  // A backward that throws here never finalizes (autograd drops its callbacks), and the
  // replicas' sequences of buckets no longer match: later backwards fail too, not silently.
  auto fail = [this](const std::string& message) {
    failed_ = message;
    throw Error(message);
  };
  if (!failed_.empty()) fail(failed_);
  throw_if_an_average_failed_locked();
  const size_t bucket = buffer_.plan().slot(param).bucket;
  if (deferred_->pending(bucket)) {
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
    torch::autograd::Engine::get_default_engine().queue_callback(
        [this] { then_tell([this] { buffer_.ring() > 0 ? finalize_ring() : finalize(); }, listener_.end); });
  }
  bw_.got_grad[param] = true;
  if (buffer_.ring() > 0) {
    try {
      return on_grad_ring_locked(lock, param, grad);
    } catch (const std::exception& e) {  // a bucket's average failed: this backward never finalizes
      failed_ = e.what();
      throw;
    }
  }
  // Copied (times the weight) and checked in one pass; the rare other gradient is copied by
  // LibTorch, then checked in its slot. Added to earlier held ones, the sum is checked.
  auto& slot = buffer_.slot(param);
  if (buffer_.staged()) {  // checked on the host, once staged
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
    ok = check_gradient(slot);
  } else {
    ok = GradientBuffer::fill_checked(slot, grad, weight_);
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

void GradSync::launch_ready_locked(bool after_backward) {
  const auto& buckets = buffer_.plan().buckets();
  while (bw_.next_launch < buckets.size()) {
    const size_t i = deferred_->schedule().launch_order[bw_.next_launch];
    // The deferred wait for backward's end.
    if (bw_.missing[i] != 0 || (!after_backward && deferred_->schedule().deferred[i])) break;
    comm::timeline::instant("launch", static_cast<int64_t>(i));
    comm::timeline::BucketScope scope(static_cast<int64_t>(i));  // the strategy's operations name it
    if (servers_) {  // the servers check the averages themselves
      bw_.works[i] = servers_->launch(i, buffer_.host_data(i), bw_.next_launch == 0);
    } else if (buffer_.staged()) {
      stager_->stage(i, buffer_.host_part(i), buffer_.device_part(i));
    } else {
      float* data = buffer_.host_data(i);
      buffer_.zero_padding(i);  // a block past the gradients reduces zeros
      if (!bw_.ok[i]) mark_not_finite(i, data);
      bw_.works[i] = average_async(i, data);
    }
    ++bw_.next_launch;
  }
}

std::shared_ptr<comm::Work> GradSync::average_async(size_t bucket, float* data) {
  if (feedback_) return feedback_->average_async(*strategy_->error_feedback(), bucket, data);
  if (shard_) {
    const size_t block = buffer_.shards().block(bucket);
    if (block == 0) {  // a bucket of empty parameters
      auto done = std::make_shared<comm::Work>("empty bucket");
      done->complete();
      return done;
    }
    return strategy_->sharing()->reduce_scatter_async(data, reduce_out_locked(bucket), block);
  }
  return strategy_->average_async(data, buffer_.plan().buckets()[bucket].count);
}

void GradSync::on_staged(size_t bucket) {
  const size_t count = buffer_.plan().buckets()[bucket].count;
  float* data = buffer_.host_data(bucket);
  const bool ok = comm::copy_scaled_below(data, data, count, 1.0f, kGradLimit);
  buffer_.zero_padding(bucket);
  if (!ok) mark_not_finite(bucket, data);
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

void GradSync::set_deferred_buckets(size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bw_.running || bw_.next_launch != 0) {
    throw Error("GradSync: the deferred buckets cannot change during a backward");
  }
  deferred_->set_count(count);
}

void GradSync::set_micro_batch(bool first, bool last) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bw_.running || bw_.next_launch != 0) throw Error("GradSync: micro-batches cannot change during a backward");
  if (first) {  // a new step: whatever an interrupted one held is dropped
    acc_.held = false;
    ring_.finite = true;
  }
  const bool hold = !last;
  if (hold && (deferred_->count() > 0 || servers_)) {
    throw Error("GradSync: gradient accumulation needs the replicas' own step: not with deferred buckets or updates "
                "on the servers");
  }
  acc_.hold = hold;
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
  const auto& buckets = buffer_.plan().buckets();
  for (size_t b = 0; b < buckets.size(); ++b) bw_.missing[b] = buckets[b].params.size();
  std::fill(bw_.ok.begin(), bw_.ok.end(), true);
}

void GradSync::finalize() {
  // Steps still pending from the last backward belong to parameters this forward did not use
  // (on_grad throws for the others): taken before their slots are overwritten.
  deferred_->flush();
  std::unique_lock<std::mutex> lock(mutex_);
  const auto& plan = buffer_.plan();
  // Parameters without a gradient in this backward contribute zeros (to a held sum: nothing,
  // and the sum is checked here).
  for (size_t i = 0; i < params_.size(); ++i) {
    if (bw_.got_grad[i]) continue;
    if (!acc_.held) {
      buffer_.slot(i).zero_();
    } else if (!buffer_.staged() && !check_gradient(buffer_.slot(i))) {
      bw_.ok[plan.slot(i).bucket] = false;
    }
    if (!acc_.hold) --bw_.missing[plan.slot(i).bucket];
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
  if (deferred_->take_gates(bw_.got_grad) && !servers_) {
    deferred_->hold(bw_.works);
    reset_backward_locked();
    lock.unlock();
    last_finite_ = true;  // each bucket's step checks its own
    deferred_->begin();
    return;
  }
  wait_staged(lock);  // every staged bucket handed to the strategy
  std::vector<std::shared_ptr<comm::Work>> works;
  for (size_t i : deferred_->schedule().launch_order) works.push_back(std::move(bw_.works[i]));
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
      params_[i].copy_(buffer_.slot(i));
      params_[i].mutable_grad() = torch::Tensor();
    }
    return;
  }
  last_finite_ = true;
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    last_finite_ = last_finite_ && (shard_ ? shard_->block_ok(b) : buffer_.average_ok(b));
  }
  if (shard_) {  // the pieces' averages, in the shard; no parameter's .grad (ZeroShare gives the pieces theirs)
    for (size_t b = 0; b < plan.buckets().size(); ++b) shard_->to_device(b);
    return;
  }
  buffer_.to_device();  // staged: in the device's queue, before the optimizer's kernels
  // The averages are in the slots: each slot becomes its parameter's .grad, with no copy.
  for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = buffer_.slot(i);
}

}  // namespace dsgd::torch_glue
