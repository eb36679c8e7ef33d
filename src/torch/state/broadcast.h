// A replica's whole state moved from one replica of a group to the others over the group's
// broadcast (strategy::Sharing), tensor by tensor from the sender's memory into the receivers':
// no archive written, read or copied beside the state. What a standby takes from a survivor in a
// recovery (a gigabyte at gpt-base with AdamW).
//
//   ReplicaState s = broadcast_replica_state(op, mine, sharing, root, /*load=*/behind);  // collective
//
// First a small archive (torch::serialize) goes out: what save_replica_state writes besides the
// models and optimizers (position, schedule step, loss scale, the operator's extra state, the CPU
// generator) and, per optimizer, each parameter's state: its kind (LibTorch's SGD, Adam, AdamW,
// RMSprop or Adagrad), step and tensors' sizes and types. Then every model parameter and buffer
// and every optimizer-state tensor, in that order, each straight into the receiver's own tensor
// (state tensors the receiver lacks are made first), the small ones packed into one transfer.
// An optimizer whose state is of another kind: root's whole archive is broadcast instead
// (save_replica_state / load_replica_state), the same result more slowly.
//
// A standby can make its optimizers' state tensors ahead (make_spare_state): the receiver takes
// those for state tensors of their size and type, so that a recovery writes into memory already
// faulted in (at gpt-base, 688 MB of fresh pages cost ~0.3 s here) instead of allocating it.
#pragma once

#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "dsgd/torch/operator.h"
#include "strategy/strategy.h"
#include "torch/state/replica_state.h"

namespace dsgd::torch_glue {

struct SharedState {
  ReplicaState state;  // root's, on replicas that loaded; `mine` on the others
  size_t bytes = 0;    // what crossed: the header and every tensor (or the archive)
  bool archive = false;  // an optimizer of another kind: the archive went instead
};

// Tensors made ahead, by sizes and type.
using SpareTensors = std::multimap<std::pair<std::vector<int64_t>, c10::ScalarType>, torch::Tensor>;

// The state tensors LibTorch's SGD (with momentum), Adam, AdamW, RMSprop and Adagrad keep for
// `op`'s trainable parameters, by their options (amsgrad, momentum, centered), made and touched
// now; none for an optimizer of another kind. Nothing is put in the optimizers.
SpareTensors make_spare_state(const TrainingOperator& op);

// Collective: every replica of `sharing` calls it with the same root. Root sends `mine` and its
// operator's models and optimizers; replicas with `load` take them (models' tensors overwritten
// in place, each optimizer's per-parameter state replaced, the operator's extra state and the CPU
// generator loaded); the others take part and keep their own. Throws Error where the models'
// tensors differ in size between root and a receiver (no state is half loaded then: the check
// comes before any tensor moves), CommError / TimeoutError from the group.
// A receiver takes state tensors from `spares` (if given) before it makes new ones.
SharedState broadcast_replica_state(TrainingOperator& op, const ReplicaState& mine, strategy::Sharing& sharing,
                                    int root, bool load, SpareTensors* spares = nullptr);

}  // namespace dsgd::torch_glue
