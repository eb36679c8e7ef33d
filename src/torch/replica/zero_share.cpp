// A replica's share under step.zero_stage (torch/replica/zero_share.h).
#include "torch/replica/zero_share.h"

#include <cmath>

#include "dsgd/common/error.h"
#include "torch/memory/cpu_allocator.h"
#include "torch/sync/shard_buffer.h"

namespace dsgd::torch_glue {
namespace {

bool same_layout(const Pieces& a, const Pieces& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [impl, piece] : a) {
    const auto it = b.find(impl);
    if (it == b.end() || it->second.begin != piece.begin || it->second.count != piece.count) return false;
  }
  return true;
}

}  // namespace

int ZeroShare::shards(int world_size) const { return options_.step.zero_stage > 0 && world_size >= 2 ? world_size : 0; }

size_t ZeroShare::ring_buckets(int world_size) const {
  return options_.step.zero_stage >= 2 && world_size >= 2 ? kRingBuckets : 0;
}

Pieces ZeroShare::make_pieces() const {
  Pieces pieces;
  for (size_t k = 0; k < syncs_.size(); ++k) {
    const auto& s = syncs_[k];
    if (!s->sharded()) continue;
    const ShardedParameters* shard = k < params_.size() ? params_[k].get() : nullptr;
    for (size_t i = 0; i < s->num_params(); ++i) {
      const auto& p = s->shards().piece(i);
      const auto& param = s->param(i);
      auto view = shard != nullptr ? shard->piece(i)  // stage 3: the shard's, not the parameter's
                  : p.count > 0    ? memory_view(param, p.begin, p.count)
                                   : torch::Tensor();
      pieces[param.unsafeGetTensorImpl()] = {std::move(view), p.begin, p.count};
    }
  }
  return pieces;
}

bool ZeroShare::shard_parameters() {
  const bool third = options_.step.zero_stage == 3;
  std::vector<std::unique_ptr<ShardedParameters>> kept(syncs_.size());
  std::vector<std::vector<torch::Tensor>> params(syncs_.size());
  for (size_t s = 0; s < syncs_.size(); ++s) {
    for (size_t i = 0; i < syncs_[s]->num_params(); ++i) params[s].push_back(syncs_[s]->param(i));
    if (!third || !syncs_[s]->sharded()) continue;
    for (auto& old : params_) {
      if (old && old->same_layout(params[s], syncs_[s]->shards())) {
        kept[s] = std::move(old);
        break;
      }
    }
  }
  units_.reset({}, {});
  params_.clear();  // the others' parameters take memory of their own again before new shards read them
  bool made = false;
  std::vector<ShardedParameters*> shards(syncs_.size(), nullptr);
  for (size_t s = 0; s < syncs_.size(); ++s) {
    if (!third || !syncs_[s]->sharded()) continue;
    if (!kept[s]) {
      kept[s] = std::make_unique<ShardedParameters>(params[s], syncs_[s]->plan(), syncs_[s]->shards());
      made = true;
    }
    kept[s]->set_sharing(syncs_[s]->strategy().sharing());
    shards[s] = kept[s].get();
    syncs_[s]->set_listener({[this, s](size_t i) { units_.on_grad(s, i); }, [this, s] { units_.on_backward_end(s); }});
  }
  params_ = std::move(kept);
  units_.reset(shards, params);
  units_.release_all();  // 1/N held from here on; whatever reads them whole gathers first
  // The parameters' own memory, now in the buckets' buffers, waits in the CPU cache: back to the
  // system, or the replica would hold the whole model still.
  if (made && cpu_cache_installed()) release_cpu_cache();
  return made;
}

void ZeroShare::partition() {
  share_after_step_ = false;
  const bool made = shard_parameters();
  Pieces fresh = make_pieces();
  if (stepping_pieces_ && !made && same_layout(fresh, pieces_)) return;  // the pieces' state is still theirs
  if (stepping_pieces_) drop_pieces(op_, pieces_, whole_);      // another layout: a load brings the state
  stepping_pieces_ = false;
  pieces_ = std::move(fresh);
  if (pieces_.empty()) return;
  whole_ = optimizer_params(op_);
  check_shardable(op_, pieces_);
  to_pieces(op_, pieces_, whole_);  // a state loaded whole keeps only this replica's pieces
  stepping_pieces_ = true;
}

void ZeroShare::before_step() {
  if (!stepping_pieces_) return;
  for (auto& s : syncs_) {
    for (size_t i = 0; i < s->num_params(); ++i) {
      const auto& piece = pieces_.at(s->param(i).unsafeGetTensorImpl());
      if (piece.count > 0) piece.view.mutable_grad() = s->piece_grad(i);
    }
  }
  share_after_step_ = true;
}

void ZeroShare::after_step() {
  if (!share_after_step_) return;
  if (gathers()) {
    units_.release_all();  // the next forward gathers the new values
  } else {
    for (auto& s : syncs_) s->share_parameters();
  }
  for (auto& [impl, piece] : pieces_) {
    if (piece.view.defined()) piece.view.mutable_grad() = torch::Tensor();  // the shard holds parameters now
  }
  share_after_step_ = false;
}

double ZeroShare::clip(double max_norm) {
  // clip_grad_norm_'s arithmetic: each trainable parameter's gradient norm (here the root of its
  // pieces' sums of squares, summed over the replicas), then the norm of their stack and one
  // clamped coefficient.
  std::vector<float> squares;
  std::vector<torch::Tensor> grads;
  for (auto& s : syncs_) {
    for (size_t i = 0; i < s->num_params(); ++i) {
      const auto& g = s->piece_grad(i);
      const float norm = g.defined() ? g.norm(2).item<float>() : 0.0f;
      squares.push_back(norm * norm);
      if (g.defined()) grads.push_back(g);
    }
  }
  if (squares.empty()) return 0;
  syncs_[0]->strategy().sharing()->sum_async(squares.data(), squares.size())->wait();
  for (auto& x : squares) x = std::sqrt(x);
  const auto stacked = torch::from_blob(squares.data(), {static_cast<int64_t>(squares.size())}, torch::kFloat32);
  const auto total = squares.size() == 1 ? stacked[0].clone() : stacked.norm(2);
  const auto coef = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  torch::NoGradGuard no_grad;
  for (auto& g : grads) g.mul_(coef.to(g.device()));
  return total.item<double>();
}

void ZeroShare::gather_state(bool keep) {
  if (!stepping_pieces_) return;
  if (keep) {
    units_.gather_all();
  } else {
    units_.pass_all();  // the keeper's gathers, one bucket whole here at a time
  }
  gather_whole(op_, pieces_, whole_, *syncs_[0]->strategy().sharing(), keep);
  if (keep) {
    stepping_pieces_ = false;
  } else {
    units_.release_all();
  }
}

void ZeroShare::drop_unowned() {
  if (!active() || stepping_pieces_) return;
  for (auto& p : params_) {  // stage 3: what the parameters hold now is the shard's
    if (p) p->store();
  }
  units_.release_all();
  // A load may have given the parameters new storage (Module::load's set_): views of it anew.
  pieces_ = make_pieces();
  to_pieces(op_, pieces_, whole_);
  stepping_pieces_ = true;
}

void ZeroShare::prepare_load() {
  for (auto& p : params_) {
    if (p) p->allocate_all();
  }
  if (!stepping_pieces_) return;
  drop_pieces(op_, pieces_, whole_);
  stepping_pieces_ = false;
}

double ZeroShare::held_bytes(double whole) const {
  if (!gathers()) return whole;
  for (const auto& s : syncs_) {
    if (!s->sharded()) continue;
    for (size_t i = 0; i < s->num_params(); ++i) whole -= static_cast<double>(s->param(i).nbytes());
  }
  return whole + static_cast<double>(units_.bytes());
}

void ZeroShare::require_whole(const char* what) const {
  for (const auto& p : params_) {
    if (p && !p->all_resident()) {
      throw Error(std::string(what) + " reads the parameters whole, and under step.zero_stage 3 this replica holds " +
                  "its shard of them only: read them through the trainer (get_model, save), which gathers them");
    }
  }
}

}  // namespace dsgd::torch_glue
