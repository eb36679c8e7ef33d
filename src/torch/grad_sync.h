// Gradient averaging inside backward: the LibTorch side of a strategy.
//
//   GradSync sync(model.parameters(), 10 << 20, strategy);
//   loss.backward();          // hooks launch buckets as they fill; returns with averaged .grad
//
// Each parameter's gradient hook copies the gradient (times weight(), for uneven batch splits)
// into its slot of a flat float32 buffer packed by strategy::BucketPlan (reverse registration
// order), and clears .grad so AccumulateGrad takes the new gradient as it is. When a bucket's
// last gradient arrives, the bucket goes to the strategy at once, so communication of later
// layers overlaps backward of earlier ones. Buckets are launched in index order on every replica
// (the strategy's ordering contract). A final autograd callback launches what is left
// (parameters that got no gradient in this backward contribute zeros), waits for every bucket,
// and makes each slot, now holding the average, its parameter's .grad: a tensor sharing the flat
// buffer (c10d's gradient_as_bucket_view), so nothing is copied back. That .grad is overwritten
// by the next backward; keep a clone to hold on to it. The gradient of one backward is
// averaged, whatever .grad held before it (accumulating gradients over several backwards is not
// supported). One GradSync per model; a backward that gives none of its parameters a gradient
// launches nothing. Parameters must be float32 and on the CPU.
//
// With a strategy that updates on its servers (ps with update on shards, ps_async; after
// set_server_optimizer), each bucket's gradient goes to update_async instead, and after backward
// the parameters hold the servers' new values and .grad is left undefined, so the operator's
// optimizer.step() skips them (the step was taken on the servers).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "strategy/bucket_plan.h"
#include "strategy/strategy.h"

namespace dsgd::torch_glue {

class GradSync {
 public:
  // overlap false: buckets launch only after backward (for measuring what overlap buys).
  GradSync(std::vector<torch::Tensor> params, size_t grad_shard_bytes,
           std::shared_ptr<strategy::GradientStrategy> strategy, bool overlap = true);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // This replica's share of the global batch times the number of replicas (1 when even).
  void set_weight(double weight) { weight_ = weight; }
  // Whether the last averaged gradient was finite everywhere. A non-finite gradient on any
  // replica makes the average non-finite on every replica, so all of them agree on this.
  bool last_finite() const { return last_finite_; }
  // Seconds backward spent waiting for communication since the last call.
  double take_wait_seconds();
  size_t num_buckets() const { return plan_.buckets().size(); }
  // Fails communication in flight (from any thread).
  void abort(const std::string& reason) { strategy_->abort(reason); }

  // ---- update on the servers (strategy->updates_on_servers()) ----
  struct ServerOptimizer {
    std::function<strategy::SgdOptions()> options;                   // read at each step's start
    std::function<torch::Tensor(size_t param)> momentum;            // the optimizer's; undefined: none
    std::function<void(size_t param, torch::Tensor)> set_momentum;  // into its state; undefined: erase
  };
  // Required before the first backward when the strategy updates on its servers; `id` tells
  // this model's buckets from other models' (the same on every replica).
  void set_server_optimizer(uint32_t id, ServerOptimizer optimizer);
  bool updates_on_servers() const { return strategy_->updates_on_servers(); }
  strategy::GradientStrategy& strategy() { return *strategy_; }
  // The replica's parameters or optimizer state were replaced (checkpoint, snapshot): the
  // servers restart from them, at the next step or now (strategy->starts_servers_eagerly()).
  void restart_servers();
  // Collective over every replica, like a step: the servers' momentum into set_momentum, so the
  // optimizer's own state is whole again (for checkpoints). Nothing where the servers hold none.
  void gather_server_state();
  // Erases the optimizer's momentum for this model's parameters: the servers hold it. Done after
  // the step that started them and by the runtime once a gathered copy has been saved, so the
  // momentum lives once, split over the shards, not once per replica.
  void drop_optimizer_momentum();

 private:
  void on_grad(size_t param, const torch::Tensor& grad);
  void launch_ready_locked();
  void launch_update_locked(size_t bucket);
  void start_servers_now();
  void copy_state_flat(torch::Tensor& params, torch::Tensor& momentum);  // momentum undefined: not all have one
  void finalize();

  std::vector<torch::Tensor> params_;
  strategy::BucketPlan plan_;
  std::shared_ptr<strategy::GradientStrategy> strategy_;
  torch::Tensor flat_;                          // plan_.total_elements() floats
  std::vector<torch::Tensor> slots_;            // flat_'s storage, one per parameter, shaped like it
  double weight_ = 1.0;
  const bool overlap_;

  std::mutex mutex_;
  bool in_backward_ = false;                    // a finalize callback is queued
  std::vector<bool> got_grad_;                  // per parameter, this backward
  std::vector<size_t> missing_;                 // per bucket
  size_t next_launch_ = 0;                      // buckets launch in index order
  std::vector<std::shared_ptr<comm::Work>> works_;
  double wait_s_ = 0;
  bool last_finite_ = true;
  std::vector<std::pair<torch::Tensor, unsigned>> hooks_;  // (param, hook id) to remove

  // Update on the servers.
  uint32_t server_id_ = 0;
  ServerOptimizer server_;
  bool init_servers_ = true;                    // the next step starts the servers from this replica
  strategy::SgdOptions step_sgd_;               // this step's, read at its first launch
  torch::Tensor init_params_, init_momentum_;   // flat copies for the servers' start (init steps only)
  std::unique_ptr<bool[]> applied_;             // per bucket, written by the strategy
};

}  // namespace dsgd::torch_glue
