// One replica: a TrainingOperator plus what dsgd adds around it — the distributed sampler, the
// gradient hooks (GradSync per model), learning-rate schedules, profiling and the state that
// goes into checkpoints. Worker processes hold devices_per_worker of these, one thread each.
//
// Sampler: each epoch's order is a permutation of the training set drawn from (seed, epoch)
// alone (the same one a single process with the same seed uses); global batch b is elements
// [b*B, (b+1)*B) of it, cut into world_size contiguous parts as even as possible, part r for
// rank r. Averaging each replica's mean gradient weighted by its part's size gives exactly the
// single-process gradient of the global batch. A last partial batch smaller than world_size is
// dropped. The position (epoch, next batch) is saved in checkpoints and is independent of the
// number of replicas, so a job saved with 2 workers resumes with 3 at the same sample.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsgd/choice.h"
#include "dsgd/operator.h"
#include "dsgd/parameter_gate.h"
#include "strategy/strategy.h"
#include "torch/grad_check.h"
#include "torch/grad_sync.h"

namespace dsgd::torch_glue {

struct ReplicaOptions {
  ReplicaInfo info;
  int64_t global_batch = 64;
  uint64_t seed = 1;
  size_t grad_shard_bytes = 10u << 20;
  Choice<SchedulerStepFreq> scheduler_step_freq = SchedulerStepFreq::kEpoch;
  int threads = 1;                             // intra-op threads of this replica
  bool overlap = true;                         // launch buckets during backward
  // > 0: this many buckets (spread over the layers) travel after backward and each bucket's
  // step is taken as the next forward reaches it (dsgd/parameter_gate.h; GradSync's deferred
  // buckets).
  // -1: chosen per train() call (set_forward_overlap_buckets; 0 until then).
  int64_t forward_overlap_buckets = 0;
  Choice<NonfinitePolicy> nonfinite = NonfinitePolicy::kSkip;  // non-finite gradients: skip the step, or fail
};

struct Position {
  int64_t epoch = 0;       // 0-based epoch in progress
  int64_t batch = 0;       // next global batch within it
};

class ReplicaRuntime : private ParameterGate {
 public:
  ReplicaRuntime(std::unique_ptr<TrainingOperator> op, const ReplicaOptions& options);
  ~ReplicaRuntime();

  // Seeds LibTorch, runs the operator's setup; throws ConfigError if it registered no model.
  void setup(const nlohmann::json& config);
  // "name shape dtype" per parameter and buffer of every model, one per line.
  std::string signature() const;
  // A new place in a re-formed job (after a worker was lost): rank, world size, worker.
  void set_info(int rank, int world_size, int worker);
  // Installs gradient hooks averaging through `strategy` (null: a lone replica, or the driver's
  // copy; then the hooks only check each gradient for NaN, see grad_check.h).
  // A strategy that updates on its servers takes each model's SGD from its optimizers (throws
  // ConfigError where a model's parameters are not all in one torch::optim::SGD param group).
  void attach(std::shared_ptr<strategy::GradientStrategy> strategy);
  // Collective, on every replica: the optimizer state the strategy's servers hold comes back
  // into the optimizers, so save_state() is whole (nothing to do for other strategies).
  void gather_server_state();
  // After the gathered state was saved (or where it is not needed): the optimizers let go of the
  // servers' momentum again, which lives on the servers only.
  void drop_server_state_copy();

  // Runs the operator's train_epoch from the current position for at most max_batches batches
  // (0 = to the end of the epoch); the epoch advances when finished. Adds profile times when
  // asked: forward_s, backward_s, comm_wait_s, optimizer_s (means per batch; as
  // TrainOptions::profile says), epoch_s.
  Metrics train(int64_t max_batches, bool profile);
  // Seconds per step of the last train() call in its steady state: the median time between the
  // ends of consecutive batches, so neither the call's start and end nor one slow step count
  // (0 with fewer than 2 batches).
  double steady_step_seconds() const;
  // With forward_overlap_buckets -1: T for the next train() calls (0 = off). Every replica must
  // set the same T before the same step.
  void set_forward_overlap_buckets(size_t buckets);
  size_t num_buckets() const { return syncs_.empty() ? 0 : syncs_[0]->num_buckets(); }
  Metrics validate();

  // Models, optimizers, schedules, position and the operator's extra state, as bytes.
  std::string save_state() const;
  // save_state().size(), without keeping the bytes (a serialisation all the same: 9 ms for a
  // 46 MB state here). The driver's snapshot schedule asks once the first steps have given the
  // optimizers their state.
  size_t state_bytes() const;
  // The shared memory its GradSyncs will ask the strategy for: each model's trainable float32
  // parameters, 64-byte aligned (comm::ShmOptions::shared_bytes for the replica's group).
  size_t gradient_bytes() const;
  void load_state(const std::string& bytes);  // drops steps still pending (forward overlap)
  // The models' named parameters and buffers ("model<i>.<name>" for i > 0).
  std::vector<std::pair<std::string, torch::Tensor>> named_tensors() const;

  const Position& position() const { return position_; }
  void step_schedules();  // one scheduler step (manual mode, or per the frequency)
  TrainingOperator& op() { return *op_; }
  const ReplicaOptions& options() const { return options_; }

  // ---- used by TrainingOperator ----
  bool next_batch(Batch& batch, int64_t max_batches);
  void after_batch();
  int64_t batches_per_epoch() const;
  // After backward: true if the (averaged) gradients are finite. Otherwise, per the policy,
  // counts a skipped step and warns (skip) or throws dsgd::Error naming the step (error).
  bool check_gradients();
  // Profiling: the default train_batch reports phases here.
  void add_phase(const char* name, double seconds);
  bool profiling() const { return profiling_; }

  // Live progress, read by the worker's heartbeat thread.
  struct Progress {
    std::atomic<int64_t> batches{0};
    std::atomic<double> loss{0};
  };
  Progress& progress() { return progress_; }

 private:
  // The state's archive (save_state's bytes), handed to `writer` piece by piece.
  void write_state(const std::function<size_t(const void*, size_t)>& writer) const;
  // The forward overlap: wait_for_parameters lands here during train(); each model's deferred
  // steps are taken with the learning rates of the step they belong to.
  void wait(const torch::Tensor& parameter) override;
  void begin_deferred(size_t sync);
  void apply_deferred(size_t sync, const std::vector<size_t>& params, bool finite);
  struct DeferredState {
    std::vector<std::vector<double>> lrs;     // per optimizer, per param group, at the step's backward
    std::string where;                        // "epoch E, batch B" of that step
    bool skipped = false;                     // a bucket of it was not finite
  };

  void start_epoch_order();
  void step_schedules_to(int64_t t);
  std::pair<int64_t, int64_t> my_part(int64_t batch) const;  // [start, end) in the order

  std::unique_ptr<TrainingOperator> op_;
  ReplicaOptions options_;
  std::vector<std::unique_ptr<GradSync>> syncs_;
  std::unique_ptr<GradCheck> check_;                                    // with no strategy
  std::vector<DeferredState> deferred_;                                 // per sync
  std::unordered_map<const void*, std::pair<size_t, size_t>> gate_index_;  // TensorImpl -> (sync, param)
  Position position_;
  torch::Tensor order_;              // the current epoch's permutation
  int64_t order_epoch_ = -1;
  int64_t taken_this_call_ = 0;
  int64_t schedule_t_ = 0;
  int64_t skipped_this_call_ = 0;
  bool profiling_ = false;
  std::map<std::string, double> phase_s_;
  double gate_s_ = 0;                // profiling: seconds in wait() (the forward overlap's gate)
  std::vector<std::chrono::steady_clock::time_point> batch_ends_;  // this call's
  Progress progress_;
};

}  // namespace dsgd::torch_glue
