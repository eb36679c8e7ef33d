// ReplicaRuntime's share of a sharded checkpoint (replica.h; the names: torch/state/state_share.h).
// What every replica holds alike (the parameters below stage 3, the buffers, the optimizer state
// below stage 1) is cut into one run of bytes that the replicas write in equal turns; what ZeRO
// shards (the optimizer state, at stage 3 the parameters too) each replica writes of its own
// pieces. A load reads the whole tensors a replica holds whole and, of the sharded ones, the
// ranges of its pieces only.
#include <torch/serialize.h>

#include <deque>
#include <unordered_map>

#include "dsgd/common/error.h"
#include "torch/replica/replica.h"
#include "torch/state/optimizer_state.h"
#include "torch/state/state_share.h"

namespace dsgd::torch_glue {
namespace {

std::string dtype_name(const torch::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

torch::ScalarType dtype_of(const std::string& name, const std::string& tensor) {
  for (const auto t : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kLong, torch::kInt,
                       torch::kShort, torch::kChar, torch::kByte, torch::kBool}) {
    if (name == c10::toString(t)) return t;
  }
  throw DataError(tensor, "the checkpoint gives it the data type '" + name + "', which this build does not read");
}

const Piece* piece_of(const Pieces& pieces, const torch::Tensor& p) {
  const auto it = pieces.find(p.unsafeGetTensorImpl());
  return it == pieces.end() ? nullptr : &it->second;
}

void require_contiguous(const torch::Tensor& p, const std::string& name) {
  if (!p.is_contiguous()) {
    throw Error(name +
                ": ZeRO shards this parameter, whose memory is not in row-major order; a sharded "
                "checkpoint cuts it in that order: make it contiguous, or save with zero_stage 0");
  }
}

// The regions of one replica's share, and what they point into.
class ShareBuilder {
 public:
  ShareBuilder(int rank, int world, bool spread) : rank_(rank), world_(std::max(1, world)), spread_(spread) {}

  // A range of a tensor this replica holds alone: `data`'s elements are [begin, begin + numel).
  // Pieces are of parameters and their optimizer state: as they are until the update.
  void piece(const std::string& name, const torch::Tensor& whole_like, const torch::Tensor& data, int64_t begin) {
    torch::Tensor cpu = data.to(torch::kCPU).contiguous();
    share_.regions.push_back({name, dtype_name(whole_like), whole_like.sizes().vec(), begin, cpu.numel(),
                              cpu.data_ptr(), cpu.nbytes(), true});
    held_->tensors.push_back(std::move(cpu));
  }
  // A tensor every replica holds alike: written in turns (finish), or by the first alone.
  // `until_update`: StateRegion's.
  void whole(const std::string& name, const torch::Tensor& t, bool until_update) {
    wholes_.push_back({name, t.to(torch::kCPU).contiguous(), until_update});
  }
  void blob(const std::string& name, std::string bytes) {
    const auto& kept = held_->blobs.emplace_back(std::move(bytes));
    share_.regions.push_back({name, "", {}, 0, static_cast<int64_t>(kept.size()), kept.data(), kept.size()});
  }

  StateShare finish() {
    uint64_t total = 0;
    for (const auto& w : wholes_) total += w.tensor.nbytes();
    const uint64_t lo = spread_ ? total * rank_ / world_ : 0;
    const uint64_t hi = spread_ ? total * (rank_ + 1) / world_ : (rank_ == 0 ? total : 0);
    uint64_t at = 0;
    for (auto& [name, t, until_update] : wholes_) {
      const uint64_t n = t.nbytes(), e = t.element_size();
      const uint64_t s = std::clamp<uint64_t>(lo, at, at + n) - at, f = std::clamp<uint64_t>(hi, at, at + n) - at;
      const auto begin = static_cast<int64_t>((s + e - 1) / e), end = static_cast<int64_t>((f + e - 1) / e);
      at += n;
      // An empty tensor still has a shape to keep: the first replica names it.
      if (end <= begin && !(t.numel() == 0 && rank_ == 0)) continue;
      const auto* data = static_cast<const char*>(t.data_ptr()) + begin * static_cast<int64_t>(e);
      share_.regions.push_back({name, dtype_name(t), t.sizes().vec(), begin, end - begin, data,
                                static_cast<size_t>(end - begin) * e, until_update});
      held_->tensors.push_back(t);
    }
    share_.keep = held_;
    return std::move(share_);
  }

 private:
  struct Held {
    std::vector<torch::Tensor> tensors;
    std::deque<std::string> blobs;  // a deque: what regions point into stays put as it grows
  };
  const int rank_, world_;
  const bool spread_;
  std::shared_ptr<Held> held_ = std::make_shared<Held>();
  struct Whole {
    std::string name;
    torch::Tensor tensor;
    bool until_update;
  };
  std::vector<Whole> wholes_;
  StateShare share_;
};

std::unordered_map<const void*, std::string> names_by_tensor(const TrainingOperator& op) {
  std::unordered_map<const void*, std::string> out;
  for (const auto& [name, t] : named_tensors(op)) out.emplace(t.unsafeGetTensorImpl(), name);
  return out;
}

const std::string& name_in(const std::unordered_map<const void*, std::string>& names, const torch::Tensor& p,
                           size_t k) {
  const auto it = names.find(p.unsafeGetTensorImpl());
  if (it == names.end()) {
    throw ConfigError("optimizer " + std::to_string(k) + " holds a tensor of shape " + c10::str(p.sizes()) +
                      " that is no registered model's parameter; a checkpoint names each state by its parameter");
  }
  return it->second;
}

std::string optimizer_prefix(size_t k, const std::string& param) {
  return "optimizer" + std::to_string(k) + "/" + param;
}

// `dest`'s elements from tensor `name`'s [begin, begin + dest.numel()), checked against `like`.
void read_into(StateSource& source, const std::string& name, const torch::Tensor& dest, int64_t begin) {
  if (dest.numel() == 0) return;
  if (dest.device().is_cpu() && dest.is_contiguous()) {
    source.read(name, begin, dest.numel(), dest.data_ptr());
    return;
  }
  auto cpu = torch::empty(dest.sizes(), dest.options().device(torch::kCPU));
  source.read(name, begin, cpu.numel(), cpu.data_ptr());
  dest.copy_(cpu);
}

const StateSource::Tensor& require(StateSource& source, const std::string& name, const torch::Tensor& like) {
  const auto* info = source.find(name);
  if (info == nullptr) {
    throw ConfigError(name + ": the checkpoint holds no such tensor; was it saved from another model?");
  }
  if (info->shape != like.sizes().vec() || info->dtype != dtype_name(like)) {
    throw ConfigError(name + ": the checkpoint's is " + c10::str(c10::IntArrayRef(info->shape)) + " " + info->dtype +
                      ", this model's " + c10::str(like.sizes()) + " " + dtype_name(like) +
                      "; a checkpoint loads into the model that saved it");
  }
  return *info;
}

}  // namespace

StateShare ReplicaRuntime::write_share(bool spread) const {
  torch::NoGradGuard no_grad;
  const int rank = options_.info.rank, world = options_.info.world_size;
  ShareBuilder out(rank, world, spread);
  const Pieces& pieces = zero_.layout().first;
  for (const auto& [name, t] : torch_glue::named_tensors(*op_)) {
    const Piece* piece = zero_.gathers() ? piece_of(pieces, t) : nullptr;
    if (piece == nullptr) {
      out.whole("model/" + name, t, t.requires_grad());  // a parameter (a buffer changes in forward)
    } else if (piece->count > 0) {
      require_contiguous(t, name);
      out.piece("model/" + name, t, piece->view, static_cast<int64_t>(piece->begin));
    }
  }
  const auto names = names_by_tensor(*op_);
  const OptimizerParams whole = zero_.active() ? zero_.layout().second : optimizer_params(*op_);
  for (size_t k = 0; k < whole.size(); ++k) {
    auto& opt = op_->optimizer(k);
    for (const auto& group : whole[k]) {
      for (const auto& p : group) {
        const Piece* piece = zero_.active() ? piece_of(pieces, p) : nullptr;
        if (piece != nullptr && piece->count == 0) continue;  // none of it is here
        const torch::Tensor& key = piece != nullptr ? piece->view : p;
        const auto it = opt.state().find(optimizer_state_key(opt, key));
        if (it == opt.state().end() || !it->second) continue;
        const std::string prefix = optimizer_prefix(k, name_in(names, p, k));
        if (piece != nullptr) require_contiguous(p, prefix);
        StateFields others;
        for (auto& [field, value] : state_fields(*it->second)) {
          if (!per_element(value, key)) {
            others.emplace_back(field, std::move(value));
          } else if (piece != nullptr) {
            out.piece(prefix + "/" + field, p, value.toTensor(), static_cast<int64_t>(piece->begin));
          } else {
            out.whole(prefix + "/" + field, value.toTensor(), true);
          }
        }
        // Counts and flags, alike in every piece: from the one that begins the parameter.
        if (!others.empty() && (piece != nullptr ? piece->begin == 0 : rank == 0)) {
          torch::serialize::OutputArchive archive;
          write_fields(archive, others);
          out.blob(prefix, bytes_of(archive));
        }
      }
    }
  }
  if (rank == 0) {
    torch::serialize::OutputArchive extras;
    write_state_extras(*op_, state(), extras);
    out.blob("extras", bytes_of(extras));
  }
  if (std::string feedback = save_feedback(); !feedback.empty()) {
    out.blob("feedback/" + std::to_string(rank), std::move(feedback));
  }
  return out.finish();
}

void ReplicaRuntime::read_share(StateSource& source) {
  for (auto& s : syncs_) s->deferred().discard();
  zero_.prepare_load();  // zero: the optimizers hold the parameters; stage 3: their memory whole
  torch::NoGradGuard no_grad;
  const Pieces& pieces = zero_.layout().first;
  for (const auto& [name, t] : torch_glue::named_tensors(*op_)) {
    const std::string entry = "model/" + name;
    require(source, entry, t);
    const Piece* piece = zero_.gathers() ? piece_of(pieces, t) : nullptr;
    if (piece == nullptr) {
      read_into(source, entry, t, 0);
    } else if (piece->count > 0) {  // the shard keeps only its piece (drop_unowned): the rest is not read
      require_contiguous(t, name);
      read_into(source, entry,
                t.view(-1).narrow(0, static_cast<int64_t>(piece->begin), static_cast<int64_t>(piece->count)),
                static_cast<int64_t>(piece->begin));
    }
  }
  const auto names = names_by_tensor(*op_);
  const OptimizerParams whole = zero_.active() ? zero_.layout().second : optimizer_params(*op_);
  for (size_t k = 0; k < whole.size(); ++k) {
    auto& opt = op_->optimizer(k);
    std::vector<std::pair<std::string, StateFields>> states;
    for (const auto& group : whole[k]) {
      for (const auto& p : group) {
        const Piece* piece = zero_.active() ? piece_of(pieces, p) : nullptr;
        if (piece != nullptr && piece->count == 0) continue;  // this replica keeps none of its state
        const std::string prefix = optimizer_prefix(k, name_in(names, p, k));
        StateFields fields;
        for (const auto& entry : source.tensors_under(prefix + "/")) {
          const auto& info = *source.find(entry);
          if (info.shape != p.sizes().vec()) {
            throw ConfigError(entry + ": the checkpoint's is " + c10::str(c10::IntArrayRef(info.shape)) +
                              ", its parameter's " + c10::str(p.sizes()));
          }
          auto value = torch::zeros(p.sizes(), p.options().dtype(dtype_of(info.dtype, entry)));
          if (piece == nullptr) {
            read_into(source, entry, value, 0);
          } else {  // the pieces' state is sliced from the whole (drop_unowned): only this piece read
            read_into(source, entry,
                      value.view(-1).narrow(0, static_cast<int64_t>(piece->begin), static_cast<int64_t>(piece->count)),
                      static_cast<int64_t>(piece->begin));
          }
          fields.emplace_back(entry.substr(prefix.size() + 1), std::move(value));
        }
        if (source.has_blob(prefix)) {
          const std::string bytes = source.blob(prefix);
          torch::serialize::InputArchive archive;
          archive.load_from(bytes.data(), bytes.size());
          for (auto& field : state_fields(archive)) fields.push_back(std::move(field));
        }
        if (!fields.empty()) states.emplace_back(archive_key(p), std::move(fields));
      }
    }
    opt.state().clear();  // replaced, not merged: as a whole state's load
    install_states(opt, states);
  }
  if (!source.has_blob("extras")) throw DataError("extras", "the checkpoint holds no position or operator state");
  const std::string extras = source.blob("extras");
  torch::serialize::InputArchive archive;
  archive.load_from(extras.data(), extras.size());
  restored(read_state_extras(*op_, archive));
  // Feedback saved by a world of another size is no one's here: it starts from zero.
  const std::string fb = "feedback/" + std::to_string(options_.info.rank);
  const bool ours = source.world() == options_.info.world_size && source.has_blob(fb);
  torch_glue::load_feedback(syncs_, ours ? source.blob(fb) : std::string(), options_.info.rank == 0);
}

}  // namespace dsgd::torch_glue
