// A replica's state as bytes, and what else is read off its operator's models: what checkpoints,
// snapshots and the driver's model.pt are made of.
//
//   std::string bytes = save_replica_state(op, {position, schedule_t});
//   ReplicaState s = load_replica_state(op, bytes);          // models and optimizers restored
//
// The archive (torch::serialize) holds "model<i>" and "optimizer<i>" for every registered model
// and optimizer, "position" (epoch, next batch, schedule step), "loss_scale" (scale and good
// steps, with loss scaling on), "extra" (the operator's own
// state_dict) and "cpu_rng" (the process's default CPU generator, which dropout draws from: the
// saver's, restored on load, so steps redone after a recovery draw what they drew before; one
// per process, so replicas that draw unequal amounts, an uneven batch split, are restored to the
// saver's). Throws ConfigError where the bytes lack one of this operator's models.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dsgd/torch/operator.h"

namespace dsgd::torch_glue {

struct Position {
  int64_t epoch = 0;       // 0-based epoch in progress
  int64_t batch = 0;       // next global batch within it
};

struct ReplicaState {
  Position position;
  int64_t schedule_t = 0;  // learning-rate schedule steps taken
  // Dynamic loss scaling (LossScaler): its scale (0: off, or a state saved without it) and the
  // finite steps since its last change.
  double loss_scale = 0;
  int64_t loss_scale_good_steps = 0;
};

// The archive's entries besides the models and optimizers ("position", "loss_scale", "extra",
// "cpu_rng"), written into `archive`; and read back: the operator's extra state and the CPU
// generator restored, the rest returned.
void write_state_extras(const TrainingOperator& op, const ReplicaState& state,
                        torch::serialize::OutputArchive& archive);
ReplicaState read_state_extras(TrainingOperator& op, torch::serialize::InputArchive& archive);
// The archive, handed to `writer` piece by piece (it returns the bytes it took).
void write_replica_state(const TrainingOperator& op, const ReplicaState& state,
                         const std::function<size_t(const void*, size_t)>& writer);
std::string save_replica_state(const TrainingOperator& op, const ReplicaState& state);
// save_replica_state(...).size() without keeping the bytes (a serialisation all the same).
size_t replica_state_bytes(const TrainingOperator& op, const ReplicaState& state);
// Loads models, optimizers (their per-parameter state replaced, not merged) and the operator's
// extra state; returns the position and schedule step for the caller to restore.
// Tensors are read onto `device` (the replica's), whatever device saved them.
// LibTorch's optimizer load sets the per-parameter state only: each param group's options (lr,
// momentum, ...) stay as the operator's setup made them.
ReplicaState load_replica_state(TrainingOperator& op, const std::string& bytes,
                                torch::Device device = torch::kCPU);

// Every model's parameters and buffers: model 0's under their own names, model m's prefixed
// "model<m>.".
std::vector<std::pair<std::string, torch::Tensor>> named_tensors(const TrainingOperator& op);
// "model<m>.<name> <sizes> <dtype>" per parameter and buffer, one per line: equal on replicas
// that built the same models.
std::string model_signature(const TrainingOperator& op);
// Bytes of the tensors in the registered optimizers' state (SGD, Adam, AdamW, RMSprop, Adagrad;
// other kinds count 0): what each replica's optimizers hold (step.zero_stage shards it).
int64_t optimizer_state_bytes(const TrainingOperator& op);
// Bytes of each model's trainable float32 parameters, each model's rounded up to 64 (under ZeRO
// each bucket padded for `shards` replicas); with `ring` > 0 (stage 2), each model's GradSync
// ring instead (ring_elements, sync/gradient_buffer.h).
size_t gradient_bytes(const TrainingOperator& op, size_t grad_shard_bytes, size_t ring, int shards = 0);

// What one replica will hold before activations, at step.zero_stage `stage` over `world`
// replicas (under 2: stage 0): its models' parameters and buffers (stage 3: the trainable
// parameters' shard, without the units gathered whole as forward and backward go); its GradSyncs' gradients (the
// flat buffer, or stage 2's ring, and under zero the block of averages); its optimizers' state,
// from their kinds and settings (SGD with momentum 4 bytes a trainable element, Adam and AdamW 8,
// 12 with amsgrad, RMSprop 4 to 12, Adagrad 4; other kinds 0), 1/world of it under zero. What
// the train metrics then say (gradient_bytes, optimizer_state_bytes), known before any step.
struct MemoryNeed {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0;
  int64_t total() const { return parameters + gradients + optimizer_state; }
};
MemoryNeed memory_need(TrainingOperator& op, size_t grad_shard_bytes, int stage, int world);

}  // namespace dsgd::torch_glue
