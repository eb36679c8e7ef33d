// ReplicaRuntime's optimizer state where it is split (replica.h): over the ps servers (their
// momentum gathered back for a save) or over the replicas (ZeRO: torch/replica/zero_share.h).
#include "torch/replica/replica.h"

namespace dsgd::torch_glue {

void ReplicaRuntime::gather_server_state(bool keep) {
  for (auto& s : syncs_) {
    if (auto* servers = s->servers()) servers->gather_state();
  }
  zero_.gather_state(keep);
}

void ReplicaRuntime::drop_server_state_copy() {
  for (auto& s : syncs_) {
    if (auto* servers = s->servers()) servers->drop_optimizer_momentum();
  }
  zero_.drop_unowned();
}

}  // namespace dsgd::torch_glue
