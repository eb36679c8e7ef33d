// Gradient averaging inside backward: the LibTorch side of a strategy.
//
//   GradSync sync(model.parameters(), 10 << 20, strategy);
//   loss.backward();          // hooks launch buckets as they fill; returns with averaged .grad
//
// GradSync runs the backward: the hooks, the launch order, the waits at its end. Its parts own
// the rest, each in its own file of this folder: GradientBuffer (the flat buffer, its slots, the
// check), DeferredBuckets (steps held back into the next forward), FeedbackState (compression's
// error feedback), ServerSteps (strategies that update on their servers), HostStager (CUDA's
// copies to the host); grad_sync_zero.cpp is its part in ZeRO.
//
// Each parameter's gradient hook copies the gradient (times weight(), for uneven batch splits)
// into its slot of a flat float32 buffer packed by strategy::BucketPlan (reverse registration
// order), checking it in the same pass, clears .grad and hands AccumulateGrad the slot, which it
// takes as the .grad with no copy: autograd's gradient is freed at once, so a backward holds one
// model's gradients (the flat buffer), not two. The check: NaN, infinity, or a magnitude of
// 2^111 or more (below that a sum over up to 2^16 replicas cannot leave the float range). A
// replica whose bucket fails it
// sets the bucket's first element to NaN before sending it, so the average's first element is
// NaN on every replica: last_finite() reads one float per bucket, no second pass over the
// gradients, and every replica gets the same answer. When a bucket's
// last gradient arrives, the bucket goes to the strategy at once, so communication of later
// layers overlaps backward of earlier ones. Buckets are launched in one order, the same on every
// replica (the strategy's ordering contract): strategy::overlap_schedule's (index order, the
// deferred ones last). A final autograd callback launches what is left
// (parameters that got no gradient in this backward contribute zeros), waits for every bucket,
// and makes each slot, now holding the average, its parameter's .grad: a tensor sharing the flat
// buffer (c10d's gradient_as_bucket_view), so nothing is copied back. That .grad is overwritten
// by the next backward; keep a clone to hold on to it. The gradient of one backward is
// averaged, whatever .grad held before it; to accumulate over several backwards (micro-batches),
// hold the earlier ones: see set_hold. One GradSync per model; a backward that gives none of its parameters a gradient
// launches nothing. Parameters must be float32, all on the CPU or all on one CUDA device. The flat buffer is the
// strategy's gradient_buffer where it offers one (a host's shared memory, which the allreduce then reads in place); a
// .grad still sharing it when the GradSync goes is replaced by a copy.
//
// On a CUDA device the flat buffer lives on the device and the strategy averages a host copy
// (staging, HostStager): each full bucket is copied to pinned host memory (or the strategy's
// shared memory) in the device's queue, and a staging thread hands it to the strategy once the
// copy is done, checked, so backward goes on meanwhile; after the waits the averages go back to the device in
// one copy, queued before the optimizer's kernels. Not with strategies that update on their
// servers, nor with deferred buckets (ConfigError).
//
// With a strategy that updates on its servers (ps with update on shards, ps_async; after
// servers()->set_optimizer), each bucket's gradient goes to the servers instead (ServerSteps),
// and after backward the parameters hold the servers' new values and .grad is left undefined,
// so the operator's optimizer.step() skips them (the step was taken on the servers).
//
// With a strategy that compresses with error feedback, each bucket is averaged with its share
// of feedback() (FeedbackState), which the replica saves and loads with its state.
//
// With deferred buckets (Trainer's forward_overlap_buckets), communication also overlaps the
// next forward: see set_deferred_step.
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strategy/bucket_plan.h"
#include "strategy/strategy.h"
#include "torch/sync/deferred_buckets.h"
#include "torch/sync/feedback_state.h"
#include "torch/sync/gradient_buffer.h"
#include "torch/sync/host_stager.h"
#include "torch/sync/server_steps.h"
#include "torch/sync/shard_buffer.h"

namespace dsgd::torch_glue {

class GradSync {
 public:
  // overlap false: buckets launch only after backward (for measuring what overlap buys).
  // deferred: see set_deferred_step (0: off). shards > 1: ZeRO over that many replicas (see
  // below). ring > 0: ZeRO stage 2: the gradients pass through `ring` bucket-sized buffers
  // instead of a flat buffer for all of them.
  GradSync(std::vector<torch::Tensor> params, size_t grad_shard_bytes,
           std::shared_ptr<strategy::GradientStrategy> strategy, bool overlap = true, size_t deferred = 0,
           size_t ring = 0, int shards = 0);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // This replica's share of the global batch times the number of replicas (1 when even).
  void set_weight(double weight) { weight_ = weight; }
  // Gradient accumulation (DDP's no_sync), said before each backward: which micro-batch of the
  // step comes. Before the last, a backward's gradients (times the weight) are added into the
  // flat buffer (the first's copied) and nothing is sent (under stage 2 each is averaged: see
  // ZeRO below), nor is .grad set (it stays undefined); the last adds its own and averages the
  // sum, checked as a whole. (true, true),
  // the default, is a step of one backward. Holding needs neither deferred buckets nor server
  // updates (throws dsgd::Error).
  void set_micro_batch(bool first, bool last);
  // Whether every replica's gradient of the last backward passed the check (header comment);
  // the same answer on every replica. Where it did not, .grad holds the average with a NaN put
  // in: skip the step.
  bool last_finite() const { return last_finite_; }
  // Where time went since the last call, for profiles. `wait_s`: every wait for communication
  // (at backward's end, and for deferred steps); `deferred_wait_s`: the part of it spent on
  // deferred steps (in forward's wait_for, flush); `deferred_step_s`: applying them (the
  // optimizer's work, done outside optimizer.step() with deferred buckets).
  struct Times {
    double wait_s = 0, deferred_wait_s = 0, deferred_step_s = 0;
  };
  Times take_times();
  // Every wait for communication since construction (Times::wait_s, never reset): stragglers.
  double total_wait_s() const;
  size_t num_buckets() const { return buffer_.plan().buckets().size(); }
  const torch::Tensor& param(size_t i) const { return params_[i]; }
  size_t num_params() const { return params_.size(); }
  // Fails communication in flight (from any thread).
  void abort(const std::string& reason) { strategy_->abort(reason); }
  // The error feedback of a strategy that compresses (strategy::GradientStrategy::error_feedback),
  // in the flat buffer's layout; null otherwise.
  FeedbackState* feedback() { return feedback_.get(); }

  // ---- the deferred step: communication overlapped with the next forward ----
  // With T > 0 deferred buckets, T buckets spread over the layers (strategy::overlap_schedule)
  // are launched after backward, first layer first, the others as they fill. A backward whose
  // forward called deferred().wait_for for every parameter that then got a gradient returns
  // without waiting: .grad stays undefined (so the operator's optimizer.step() skips them), and
  // each bucket's step (every bucket's, deferred or not) is taken by the step's `apply` when the
  // next forward asks for one of its parameters (wait_for), or at the latest at flush() or at
  // the next backward's end. Any other backward waits, as with T = 0. A forward that uses a
  // parameter whose update is still pending, without wait_for, makes the next backward throw
  // (its result would be stale). See DeferredBuckets.
  DeferredBuckets& deferred() { return *deferred_; }
  // Changes T between backwards (the forward overlap's automatic choice tries several); every
  // replica must change it before the same backward. Capped at the number of buckets. Throws
  // dsgd::Error during a backward.
  void set_deferred_buckets(size_t count);

  // ---- ZeRO (strategy->sharing(), constructed with shards > 1) ----
  // Each bucket is cut into one block a replica (shards(): strategy::ShardLayout), and each
  // replica steps its pieces of the parameters only. A bucket is reduce-scattered
  // (Sharing::reduce_scatter_async): this replica gets the average of its block, piece_grad(i)
  // of each of its pieces, and no parameter's .grad is set; after the step, share_parameters
  // gathers every replica's block back into every replica's parameters. Together the traffic of
  // one allreduce. CPU and CUDA (staged: the host copies reduce and gather), stage 1 only on CUDA.
  //
  // Stage 2 (ring > 0): no buffer holds every gradient. Bucket b is filled in ring buffer
  // b % ring (shared memory where the strategy offers it) and reduce-scattered into this
  // replica's block; the buffer is free again once that is done (or at backward's end). A replica
  // holds 4 bytes a parameter of gradients for its share and `ring` buckets for the rest. Buckets
  // launch as they fill whatever `overlap` says (a ring buffer is reused only once its bucket's
  // reduction is done). A gradient whose ring buffer still holds an earlier bucket that is not
  // yet launched waits aside, in a copy; one whose buffer holds a later bucket takes it back (the
  // later bucket's gradients go aside). Accumulation reduces every micro-batch (DeepSpeed's way)
  // and sums the averages in the block: the traffic of a step per micro-batch, for no buffer of
  // every gradient. last_finite() says whether every micro-batch's averages were finite.
  // (The ring's layout: ring_offsets, kRingBuckets buffers unless told.)
  bool ring() const { return buffer_.ring() > 0; }
  bool sharded() const { return shard_ != nullptr; }
  const strategy::ShardLayout& shards() const { return buffer_.shards(); }
  // The average of this replica's piece of parameter `param` (1-D, in the parameter's memory
  // order: memory_view), after backward; undefined where it has none.
  const torch::Tensor& piece_grad(size_t param) const { return shard_->grad(param); }
  // Bytes this GradSync keeps for gradients: its flat buffer (or ring) and its shard.
  size_t gradient_bytes() const;
  // Collective, after the step: every replica's pieces to every replica, bucket by bucket (this
  // replica's block packed, Sharing::allgather_async into the bucket's place in the buffer,
  // copied into the parameters). The averages in the shard are gone afterwards.
  void share_parameters();
  // Stage 3 (ShardedParameters: the parameters themselves sharded; nothing to share after the
  // step): told of each parameter's gradient as it arrives, on backward's thread before the hook
  // takes it, and of backward's end after its last wait (torch/replica/unit_gathers.h).
  struct Listener {
    std::function<void(size_t param)> grad;
    std::function<void()> end;
  };
  void set_listener(Listener listener) { listener_ = std::move(listener); }
  const strategy::BucketPlan& plan() const { return buffer_.plan(); }

  // ---- update on the servers (strategy->server_updates()) ----
  // Null unless the strategy updates on its servers; then its set_optimizer is required before
  // the first backward.
  ServerSteps* servers() { return servers_.get(); }
  bool updates_on_servers() const { return servers_ != nullptr; }
  strategy::GradientStrategy& strategy() { return *strategy_; }

 private:
  torch::Tensor on_grad(size_t param, const torch::Tensor& grad);  // what AccumulateGrad takes: the slot
  // ZeRO (grad_sync_zero.cpp): where a bucket's reduction goes; NaN at every block's start.
  float* reduce_out_locked(size_t bucket);
  void mark_not_finite(size_t bucket, float* data) const;
  // Stage 2 (grad_sync_zero.cpp): the hook's work, the ring's claims and what backward's end does.
  torch::Tensor on_grad_ring_locked(std::unique_lock<std::mutex>& lock, size_t param, const torch::Tensor& grad);
  // Makes `bucket` its ring buffer's holder: waits for an earlier holder launched, evicts a later
  // one; false while an earlier one still fills it.
  bool claim_ring_locked(std::unique_lock<std::mutex>& lock, size_t bucket);
  void consume_locked(std::unique_lock<std::mutex>& lock, size_t bucket);  // waits; its buffer free
  void evict_locked(size_t bucket);   // its gradients aside, its ring buffer free
  void unstash_locked(size_t bucket);  // its gradients set aside into its (claimed) ring buffer
  void finalize_ring();
  // An average of this backward already failed (a peer lost, the group aborted): the step is
  // over, and the rest of backward (seconds at gpt-base) would only delay the recovery. Throws
  // its error (its type kept: CommError); autograd then runs none of the graph's remaining nodes.
  void throw_if_an_average_failed_locked();
  void launch_ready_locked(bool after_backward);
  void finalize();
  std::shared_ptr<comm::Work> average_async(size_t bucket, float* data);  // with its feedback, if kept
  void on_staged(size_t bucket);         // CUDA, on the stager's thread: its host copy is done
  void wait_staged(std::unique_lock<std::mutex>& lock);  // every staged bucket handed on (unlocks meanwhile)
  void reset_backward_locked();          // after a backward's end, for the next one; .grad cleared

  std::vector<torch::Tensor> params_;
  std::shared_ptr<strategy::GradientStrategy> strategy_;
  GradientBuffer buffer_;
  std::unique_ptr<FeedbackState> feedback_;     // if the strategy keeps error feedback
  std::unique_ptr<ServerSteps> servers_;        // if it updates on its servers
  std::unique_ptr<DeferredBuckets> deferred_;   // launch order; steps held back past backward
  double weight_ = 1.0;
  const bool overlap_;

  mutable std::mutex mutex_;
  std::string failed_;                          // why a backward threw (every later one throws it too)
  bool torn_ = false;  // the last backward's averages failed: its gradients are nobody's
  // This backward's progress (guarded by mutex_), reset at its end.
  struct Backward {
    bool running = false;                        // a finalize callback is queued
    std::vector<bool> got_grad;                  // per parameter
    std::vector<size_t> missing;                 // per bucket: gradients still to come
    std::vector<char> ok;                        // per bucket: its gradients passed the check
    size_t next_launch = 0;                      // position in the launch order (DeferredBuckets::schedule)
    size_t checked = 0;  // launched buckets seen done, in launch order (throw_if_an_average_failed_locked)
    std::vector<std::shared_ptr<comm::Work>> works;  // per bucket
  } bw_;
  // Waits for communication (guarded by mutex_): the profile's since take_times, and the total.
  struct Waits {
    Times times;
    double total_s = 0;
    void count(double s) {
      times.wait_s += s;
      total_s += s;
    }
  } waits_;
  bool last_finite_ = true;
  // Accumulation (set_micro_batch).
  struct Accumulation {
    bool hold = false;  // this backward's gradients are only summed
    bool held = false;  // the flat buffer holds earlier backwards' sum
  } acc_;
  std::vector<std::pair<torch::Tensor, unsigned>> hooks_;  // (param, hook id) to remove
  std::unique_ptr<HostStager> stager_;          // CUDA: copies buckets to the host while backward goes on

  std::unique_ptr<ShardBuffer> shard_;          // ZeRO: this replica's block of every bucket
  Listener listener_;                           // stage 3
  // Stage 2 (guarded by mutex_).
  struct Ring {
    std::vector<int64_t> holder;                // per ring buffer: the bucket in it, -1 for none
    std::vector<char> consumed;                 // per bucket: averaged and copied out this backward
    bool finite = true;                         // every bucket consumed this backward was finite
    std::vector<torch::Tensor> stash;           // per parameter: its gradient kept aside, if any
  } ring_;
};

// Every GradSync's error feedback (compression) as bytes, "" where none keeps any; and back:
// bytes of another layout (bucket sizes, models) or none leave each at zero, with a notice
// where `announce` (the first replica).
std::string save_feedback(const std::vector<std::unique_ptr<GradSync>>& syncs);
void load_feedback(const std::vector<std::unique_ptr<GradSync>>& syncs, const std::string& feedback, bool announce);

}  // namespace dsgd::torch_glue
