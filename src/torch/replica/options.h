// What a replica is made with (ReplicaRuntime, torch/replica/replica.h): its place in the job,
// the batch, the seed, and what the step does, as the job spec carries them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dsgd/common/trainer_config.h"
#include "dsgd/torch/operator.h"

namespace dsgd::torch_glue {

struct ReplicaOptions {
  ReplicaInfo info;
  int64_t global_batch = 64;
  uint64_t seed = 1;
  size_t grad_shard_bytes = 10u << 20;
  // What the step does (TrainerConfig::step, as the job spec carries it): precision, loss
  // scaling (loss_scale resolved: > 0 = LossScaler from this scale), the non-finite policy,
  // when schedules step, clipping.
  StepConfig step;
  int threads = 1;      // intra-op threads of this replica
  bool overlap = true;  // launch buckets during backward
  // > 0: this many buckets (spread over the layers) travel after backward and each bucket's
  // step is taken as the next forward reaches it (dsgd/torch/parameter_gate.h; GradSync's deferred
  // buckets).
  // -1: chosen per train() call (set_forward_overlap_buckets; 0 until then).
  int64_t forward_overlap_buckets = 0;
};

}  // namespace dsgd::torch_glue
