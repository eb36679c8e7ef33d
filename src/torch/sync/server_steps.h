// One GradSync's buckets over a strategy that updates parameters on its servers (ps with
// ps_update_on_shards, ps_async; strategy::ServerUpdates): each bucket goes out as a gradient and
// comes back as the servers' new parameters. The servers start from a replica's parameters and
// momentum (at its first step, after a restore, or at once where they start eagerly) and hand
// their momentum back for checkpoints, so between those it lives once, split over the shards,
// not once per replica.
//
//   ServerSteps steps(params, plan, *strategy->server_updates());
//   steps.set_optimizer(model, server_optimizer(op, model, params));  // server_optimizer.h
//   work = steps.launch(bucket, data, /*first=*/true);   // data: the bucket's gradient, then parameters
//   bool applied = steps.finish_step();                  // after every bucket's work completed
//
// Not thread-safe: GradSync calls it under its lock (launch) or between backwards.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "strategy/bucket_plan.h"
#include "strategy/strategy.h"

namespace dsgd::torch_glue {

class ServerSteps {
 public:
  // What the steps need of the operator's optimizer for one model.
  struct Optimizer {
    std::function<strategy::SgdOptions()> options;                   // read at each step's start
    std::function<torch::Tensor(size_t param)> momentum;            // the optimizer's; undefined: none
    std::function<void(size_t param, torch::Tensor)> set_momentum;  // into its state; undefined: erase
  };
  // `params` and `plan`: the GradSync's, which outlive this.
  ServerSteps(const std::vector<torch::Tensor>& params, const strategy::BucketPlan& plan,
              strategy::ServerUpdates& servers);

  // Required before the first backward; `id` tells this model's buckets from other models' (the
  // same on every replica).
  void set_optimizer(uint32_t id, Optimizer optimizer);
  // Starts `bucket`'s update: its gradient at `data` (its count floats), where the new parameters
  // are when the work completes. `first`: the step's first launch, which reads the step's options.
  std::shared_ptr<comm::Work> launch(size_t bucket, float* data, bool first);
  // After every bucket of the step completed: whether every shard applied its update (false: a
  // non-finite average, the step skipped on the servers).
  bool finish_step();
  // The replica's parameters or optimizer state were replaced (checkpoint, snapshot): the
  // servers restart from them, at the next step or now (ServerUpdates::starts_servers_eagerly).
  void restart();
  // Collective over every replica, like a step: the servers' momentum into the optimizer's
  // state, so it is whole again (for checkpoints); asynchronous servers' newer parameters too.
  void gather_state();
  // Erases the optimizer's momentum for this model's parameters: the servers hold it. Done after
  // the step that started them and by the runtime once a gathered copy has been saved.
  void drop_optimizer_momentum();

 private:
  uint64_t key(size_t bucket) const { return (uint64_t{id_} << 32) | bucket; }
  void start_now();
  void copy_state_flat(torch::Tensor& params, torch::Tensor& momentum);  // momentum undefined: not all have one

  const std::vector<torch::Tensor>& params_;
  const strategy::BucketPlan& plan_;
  strategy::ServerUpdates& servers_;
  uint32_t id_ = 0;
  Optimizer optimizer_;
  bool init_ = true;                           // the next step starts the servers from this replica
  strategy::SgdOptions step_sgd_;              // this step's, read at its first launch
  torch::Tensor init_params_, init_momentum_;  // flat copies for the servers' start (init steps only)
  std::unique_ptr<bool[]> applied_;            // per bucket, written by the strategy
};

}  // namespace dsgd::torch_glue
