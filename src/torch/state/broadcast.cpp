#include "torch/state/broadcast.h"

#include <c10/util/accumulate.h>
#include <torch/optim.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "dsgd/common/error.h"
#include "torch/state/optimizer_state.h"

namespace dsgd::torch_glue {
namespace {

namespace o = torch::optim;

// Tensors of at least this many bytes travel on their own, straight from and into their memory;
// the smaller ones (biases, norms' weights) are packed into one transfer.
constexpr size_t kOwnTransfer = 1 << 20;

// A parameter's optimizer state: its kind, step and tensors (undefined where the kind's optional
// tensor is absent), in the order the kind's setters take them.
enum Kind : int64_t { kNone = 0, kSgd = 1, kAdam = 2, kAdamW = 3, kRmsprop = 4, kAdagrad = 5, kOther = 6 };

struct Entry {
  int64_t kind = kNone;
  int64_t step = 0;
  std::vector<torch::Tensor> tensors;
};

Entry entry_of(const o::OptimizerParamState* s) {
  if (s == nullptr) return {};
  if (const auto* x = dynamic_cast<const o::SGDParamState*>(s)) return {kSgd, 0, {x->momentum_buffer()}};
  if (const auto* x = dynamic_cast<const o::AdamParamState*>(s)) {
    return {kAdam, x->step(), {x->exp_avg(), x->exp_avg_sq(), x->max_exp_avg_sq()}};
  }
  if (const auto* x = dynamic_cast<const o::AdamWParamState*>(s)) {
    return {kAdamW, x->step(), {x->exp_avg(), x->exp_avg_sq(), x->max_exp_avg_sq()}};
  }
  if (const auto* x = dynamic_cast<const o::RMSpropParamState*>(s)) {
    return {kRmsprop, x->step(), {x->square_avg(), x->momentum_buffer(), x->grad_avg()}};
  }
  if (const auto* x = dynamic_cast<const o::AdagradParamState*>(s)) return {kAdagrad, x->step(), {x->sum()}};
  return {kOther, 0, {}};
}

// Adam's and AdamW's states: the same fields in two unrelated types.
template <class State>
std::unique_ptr<o::OptimizerParamState> adam_state(const Entry& e) {
  auto s = std::make_unique<State>();
  s->step(e.step);
  s->exp_avg(e.tensors[0]);
  s->exp_avg_sq(e.tensors[1]);
  s->max_exp_avg_sq(e.tensors[2]);
  return s;
}

std::unique_ptr<o::OptimizerParamState> make_state(const Entry& e) {
  const auto& t = e.tensors;
  switch (e.kind) {
    case kSgd: {
      auto s = std::make_unique<o::SGDParamState>();
      s->momentum_buffer(t[0]);
      return s;
    }
    case kAdam:
      return adam_state<o::AdamParamState>(e);
    case kAdamW:
      return adam_state<o::AdamWParamState>(e);
    case kRmsprop: {
      auto s = std::make_unique<o::RMSpropParamState>();
      s->step(e.step);
      s->square_avg(t[0]);
      s->momentum_buffer(t[1]);
      s->grad_avg(t[2]);
      return s;
    }
    case kAdagrad: {
      auto s = std::make_unique<o::AdagradParamState>();
      s->step(e.step);
      s->sum(t[0]);
      return s;
    }
    default:
      throw Error("broadcast_replica_state: no optimizer state of kind " + std::to_string(e.kind));
  }
}

std::vector<torch::Tensor> params_of(o::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) out.push_back(p);
  }
  return out;
}

// An optimizer's per-parameter state as int64s, parameter by parameter in its groups' order:
// kind, step, tensor count, then per tensor: defined, scalar type, dimensions, sizes.
torch::Tensor layout_of(o::Optimizer& opt, bool* other) {
  std::vector<int64_t> v;
  for (const auto& p : params_of(opt)) {
    const auto it = opt.state().find(optimizer_state_key(opt, p));
    const Entry e = entry_of(it == opt.state().end() ? nullptr : it->second.get());
    *other = *other || e.kind == kOther;
    v.insert(v.end(), {e.kind, e.step, static_cast<int64_t>(e.tensors.size())});
    for (const auto& t : e.tensors) {
      v.push_back(t.defined() ? 1 : 0);
      if (!t.defined()) continue;
      v.push_back(static_cast<int64_t>(t.scalar_type()));
      v.push_back(t.dim());
      v.insert(v.end(), t.sizes().begin(), t.sizes().end());
    }
  }
  return torch::tensor(v, torch::kInt64);
}

// Root's layout read back: one entry per parameter, its tensors made beside the parameter (or
// the parameter's own state tensor, where it has one of the same kind, size and type), or left
// undefined where this replica only takes part (`make` false). Each tensor root holds is added
// to `tensors` and its size to `bytes`, in the order root sends them.
std::vector<Entry> entries_from(const torch::Tensor& layout, o::Optimizer& opt, bool make, SpareTensors* spares,
                                std::vector<torch::Tensor>* tensors, std::vector<size_t>* bytes) {
  const auto params = params_of(opt);
  const int64_t* v = layout.data_ptr<int64_t>();
  const int64_t* const end = v + layout.numel();
  auto next = [&] {
    if (v == end) throw Error("broadcast_replica_state: the sender's optimizer layout is cut short");
    return *v++;
  };
  std::vector<Entry> out;
  for (size_t i = 0; v != end; ++i) {
    if (make && i >= params.size()) {  // one that only takes part may hold other parameters (ZeRO's pieces)
      throw Error("broadcast_replica_state: the sender's optimizer has more parameters than this replica's (" +
                  std::to_string(params.size()) + ")");
    }
    Entry e;
    e.kind = next();
    e.step = next();
    const auto it = make ? opt.state().find(optimizer_state_key(opt, params[i])) : opt.state().end();
    const Entry mine = entry_of(it == opt.state().end() ? nullptr : it->second.get());
    for (int64_t k = 0, n = next(); k < n; ++k) {
      if (next() == 0) {
        e.tensors.emplace_back();
        continue;
      }
      const auto type = static_cast<c10::ScalarType>(next());
      std::vector<int64_t> sizes(static_cast<size_t>(next()));
      for (auto& s : sizes) s = next();
      const auto options = torch::TensorOptions().dtype(type).device(make ? params[i].device() : torch::kCPU);
      torch::Tensor t;
      if (make && mine.kind == e.kind && static_cast<size_t>(k) < mine.tensors.size()) {
        const auto& old = mine.tensors[static_cast<size_t>(k)];
        if (old.defined() && old.sizes() == sizes && old.scalar_type() == type && old.is_contiguous()) t = old;
      }
      if (make && !t.defined() && spares != nullptr && params[i].is_cpu()) {
        const auto spare = spares->find({sizes, type});
        if (spare != spares->end()) {
          t = std::move(spare->second);
          spares->erase(spare);
        }
      }
      if (make && !t.defined()) t = torch::empty(sizes, options);
      tensors->push_back(t);
      bytes->push_back(static_cast<size_t>(c10::multiply_integers(sizes)) * c10::elementSize(type));
      e.tensors.push_back(std::move(t));
    }
    out.push_back(std::move(e));
  }
  return out;
}

// Every tensor's bytes from root into each receiver's tensor (undefined: into scratch, dropped):
// the small ones packed into one transfer first, then each large one on its own.
void transfer(strategy::Sharing& sharing, int root, const std::vector<torch::Tensor>& tensors,
              const std::vector<size_t>& bytes) {
  const bool sender = sharing.rank() == root;
  std::vector<char> pack;
  for (size_t b : bytes) pack.resize(pack.size() + (b < kOwnTransfer ? b : 0));
  if (sender) {
    size_t at = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (bytes[i] >= kOwnTransfer) continue;
      const auto t = tensors[i].contiguous().cpu();
      std::memcpy(pack.data() + at, t.data_ptr(), bytes[i]);
      at += bytes[i];
    }
  }
  if (!pack.empty()) sharing.broadcast(pack.data(), pack.size(), root);
  std::vector<char> scratch;
  size_t at = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (bytes[i] < kOwnTransfer) {
      if (!sender && t.defined()) {
        torch::NoGradGuard no_grad;
        t.copy_(torch::from_blob(pack.data() + at, t.sizes(), t.options().device(torch::kCPU)));
      }
      at += bytes[i];
      continue;
    }
    if (t.defined() && t.is_cpu() && t.is_contiguous()) {  // straight from and into the tensor's memory
      sharing.broadcast(t.data_ptr(), bytes[i], root);
      continue;
    }
    if (sender) {
      const auto host = t.contiguous().cpu();
      sharing.broadcast(host.data_ptr(), bytes[i], root);
    } else if (t.defined()) {  // another device, or strided: through the host
      auto host = torch::empty(t.sizes(), t.options().device(torch::kCPU));
      sharing.broadcast(host.data_ptr(), bytes[i], root);
      torch::NoGradGuard no_grad;
      t.copy_(host);
    } else {
      scratch.resize(std::max(scratch.size(), bytes[i]));
      sharing.broadcast(scratch.data(), bytes[i], root);
    }
  }
}

// Root's whole archive instead (an optimizer state of a kind not known here).
SharedState broadcast_archive(TrainingOperator& op, const ReplicaState& mine, strategy::Sharing& sharing, int root,
                              bool load, torch::Device device) {
  std::string bytes;  // empty: root failed to write it
  std::exception_ptr failed;
  if (sharing.rank() == root) {
    try {
      bytes = save_replica_state(op, mine);
    } catch (...) {
      bytes.clear();
      failed = std::current_exception();
    }
  }
  sharing.broadcast_bytes(&bytes, root);
  if (failed) std::rethrow_exception(failed);
  if (load && bytes.empty()) {
    throw Error("broadcast_replica_state: replica " + std::to_string(root) +
                " failed to write its state (its log says why)");
  }
  SharedState out{mine, bytes.size(), true};
  if (load && sharing.rank() != root) out.state = load_replica_state(op, bytes, device);
  return out;
}

torch::Device device_of(const TrainingOperator& op) {
  for (const auto& m : op.models()) {
    for (const auto& p : m->parameters()) return p.device();
  }
  return torch::kCPU;
}

// Root's header: the state's extras, each optimizer's layout, each model tensor's bytes, and
// whether an optimizer holds state of another kind (then the archive goes instead).
std::string write_header(TrainingOperator& op, const ReplicaState& mine, const torch::Tensor& model_bytes) {
  torch::serialize::OutputArchive archive;
  write_state_extras(op, mine, archive);
  bool other = false;
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    archive.write("layout" + std::to_string(k), layout_of(op.optimizer(k), &other));
  }
  archive.write("model_bytes", model_bytes);
  archive.write("other_kind", torch::tensor({int64_t{other}}, torch::kInt64));
  std::string header;
  archive.save_to([&header](const void* data, size_t n) {
    header.append(static_cast<const char*>(data), n);
    return n;
  });
  return header;
}

// Each optimizer's per-parameter state replaced by root's, as entries_from read it.
void install(TrainingOperator& op, const std::vector<std::vector<Entry>>& entries) {
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    auto& opt = op.optimizer(k);
    const auto params = params_of(opt);
    opt.state().clear();  // only root's: a parameter it holds none for has none here either
    for (size_t i = 0; i < entries[k].size(); ++i) {
      if (entries[k][i].kind != kNone) opt.state()[optimizer_state_key(opt, params[i])] = make_state(entries[k][i]);
    }
  }
}

}  // namespace

SpareTensors make_spare_state(const TrainingOperator& op) {
  SpareTensors out;
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    auto& opt = op.optimizer(k);
    for (auto& group : opt.param_groups()) {
      int copies = 0;  // state tensors shaped as each parameter
      const auto& g = group.options();
      if (const auto* x = dynamic_cast<const o::SGDOptions*>(&g)) copies = x->momentum() != 0 ? 1 : 0;
      if (const auto* x = dynamic_cast<const o::AdamOptions*>(&g)) copies = x->amsgrad() ? 3 : 2;
      if (const auto* x = dynamic_cast<const o::AdamWOptions*>(&g)) copies = x->amsgrad() ? 3 : 2;
      if (const auto* x = dynamic_cast<const o::RMSpropOptions*>(&g)) {
        copies = 1 + (x->momentum() > 0 ? 1 : 0) + (x->centered() ? 1 : 0);
      }
      if (dynamic_cast<const o::AdagradOptions*>(&g) != nullptr) copies = 1;
      for (const auto& p : group.params()) {
        if (!p.requires_grad() || !p.is_cpu()) continue;
        for (int c = 0; c < copies; ++c) {
          out.emplace(std::make_pair(p.sizes().vec(), p.scalar_type()), torch::zeros(p.sizes(), p.options()));
        }
      }
    }
  }
  return out;
}

SharedState broadcast_replica_state(TrainingOperator& op, const ReplicaState& mine, strategy::Sharing& sharing,
                                    int root, bool load, SpareTensors* spares) {
  const bool sender = sharing.rank() == root;
  const auto named = named_tensors(op);
  std::vector<int64_t> mine_bytes;
  for (const auto& [name, t] : named) mine_bytes.push_back(static_cast<int64_t>(t.nbytes()));
  std::string header;  // empty: root failed to write it (every replica throws, none waits)
  std::exception_ptr failed;
  if (sender) {
    try {
      header = write_header(op, mine, torch::tensor(mine_bytes, torch::kInt64));
    } catch (...) {
      header.clear();
      failed = std::current_exception();
    }
  }
  sharing.broadcast_bytes(&header, root);
  if (failed) std::rethrow_exception(failed);
  if (header.empty()) {
    throw Error("broadcast_replica_state: replica " + std::to_string(root) +
                " failed to write its state (its log says why)");
  }
  torch::serialize::InputArchive archive;
  archive.load_from(header.data(), header.size());
  torch::Tensor other_kind, model_bytes;
  archive.read("other_kind", other_kind);
  if (other_kind.item<int64_t>() != 0) return broadcast_archive(op, mine, sharing, root, load, device_of(op));
  // A receiver whose models differ takes part with root's sizes (the others would wait for it)
  // and throws after.
  archive.read("model_bytes", model_bytes);
  const std::vector<int64_t> root_bytes(model_bytes.data_ptr<int64_t>(),
                                        model_bytes.data_ptr<int64_t>() + model_bytes.numel());
  const bool same = root_bytes == mine_bytes;
  const bool take = load && !sender && same;

  std::vector<torch::Tensor> tensors;
  std::vector<size_t> bytes;
  for (size_t i = 0; i < root_bytes.size(); ++i) {
    tensors.push_back(take || sender ? named[i].second : torch::Tensor());
    bytes.push_back(static_cast<size_t>(root_bytes[i]));
  }
  std::vector<std::vector<Entry>> entries(op.num_optimizers());
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    torch::Tensor layout;
    archive.read("layout" + std::to_string(k), layout);
    auto& opt = op.optimizer(k);
    if (sender) {  // its own tensors, in the layout's order
      for (const auto& p : params_of(opt)) {
        const auto it = opt.state().find(optimizer_state_key(opt, p));
        for (const auto& t : entry_of(it == opt.state().end() ? nullptr : it->second.get()).tensors) {
          if (!t.defined()) continue;
          tensors.push_back(t);
          bytes.push_back(t.nbytes());
        }
      }
      continue;
    }
    entries[k] = entries_from(layout, opt, take, spares, &tensors, &bytes);
  }
  transfer(sharing, root, tensors, bytes);
  SharedState out{mine, header.size(), false};
  for (size_t b : bytes) out.bytes += b;
  if (!take) {
    if (load && !sender && !same) {
      throw Error("broadcast_replica_state: replica " + std::to_string(root) + "'s models hold " +
                  std::to_string(root_bytes.size()) + " parameters and buffers, of other sizes than this replica's " +
                  std::to_string(mine_bytes.size()) + ": the replicas built different models (see model_signature)");
    }
    return out;
  }
  install(op, entries);
  out.state = read_state_extras(op, archive);
  return out;
}

}  // namespace dsgd::torch_glue
