// ReplicaRuntime's state in and out (replica.h): as bytes for snapshots and checkpoints
// (save_state, load_state, with each replica's error feedback beside), and from a survivor
// straight into a standby over the group (share_state, torch/state/broadcast.h).
#include <algorithm>
#include <cstring>

#include "dsgd/common/log.h"
#include "torch/replica/replica.h"
#include "torch/state/broadcast.h"

namespace dsgd::torch_glue {

ReplicaState ReplicaRuntime::state() const {
  ReplicaState s{cursor_.position(), schedule_t_};
  if (scaler_) {
    s.loss_scale = scaler_->scale();
    s.loss_scale_good_steps = scaler_->good_steps();
  }
  return s;
}

std::string ReplicaRuntime::save_state() const {
  zero_.require_whole("save_state");  // stage 3: gather_server_state first
  return save_replica_state(*op_, state());
}

size_t ReplicaRuntime::state_bytes() const {
  if (!zero_.gathers()) return replica_state_bytes(*op_, state());
  // Stage 3: the parameters are not here whole to serialise; what a gathered save would write,
  // about (the snapshot schedule's size).
  const auto world = static_cast<size_t>(std::max(1, options_.info.world_size));
  size_t bytes = static_cast<size_t>(optimizer_state_bytes(*op_)) * world;
  for (const auto& [name, t] : torch_glue::named_tensors(*op_)) bytes += static_cast<size_t>(t.nbytes());
  return bytes;
}

void ReplicaRuntime::load_state(const std::string& bytes, const std::string& feedback) {
  for (auto& s : syncs_) s->deferred().discard();
  zero_.prepare_load();  // zero: the state comes whole, for the parameters
  restored(load_replica_state(*op_, bytes, options_.info.device));
  torch_glue::load_feedback(syncs_, feedback, options_.info.rank == 0);
}

size_t ReplicaRuntime::share_state(strategy::Sharing& sharing, int root, bool load) {
  if (zero_.gathers()) {  // the driver recovers stage 3 from its snapshot (Recovery::replicas_hold_whole_state)
    throw Error("share_state under step.zero_stage 3: each replica holds only its block of the parameters, which "
                "a replica behind or new does not hold for this step; recover from the snapshot instead");
  }
  if (load) {
    for (auto& s : syncs_) s->deferred().discard();
    if (sharing.rank() != root) zero_.prepare_load();
  }
  const SharedState shared = broadcast_replica_state(*op_, state(), sharing, root, load, &spares_);
  if (load && sharing.rank() != root) {
    restored(shared.state);
    for (auto& s : syncs_) {
      if (auto* feedback = s->feedback()) feedback->clear();
    }
  }
  return shared.bytes;
}

void ReplicaRuntime::make_spare_state() { spares_ = torch_glue::make_spare_state(*op_); }

void ReplicaRuntime::restored(const ReplicaState& state) {
  spares_.clear();  // what share_state did not take
  cursor_.set_position(state.position);
  times_.progress().step = cursor_.step();
  cursor_.restart_step();  // a step interrupted part-way starts again
  lone_.clear();
  boundary_.clear();
  step_schedules_to(state.schedule_t);
  // A state saved without loss scaling leaves the scale where it is.
  if (scaler_ && state.loss_scale > 0) scaler_->restore(state.loss_scale, state.loss_scale_good_steps);
  for (auto& s : syncs_) {
    if (auto* servers = s->servers()) servers->restart();
  }
  zero_.drop_unowned();  // zero: the state loaded is whole; this replica keeps its share
  zero_.forget_step();
}

std::string ReplicaRuntime::save_feedback() const { return torch_glue::save_feedback(syncs_); }

}  // namespace dsgd::torch_glue
