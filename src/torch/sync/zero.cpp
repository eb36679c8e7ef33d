#include "torch/sync/zero.h"

#include <torch/optim.h>
#include <torch/serialize.h>

#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "dsgd/common/error.h"
#include "torch/state/optimizer_state.h"
#include "torch/sync/shard_buffer.h"

namespace dsgd::torch_glue {
namespace {

namespace ser = torch::serialize;
using Fields = StateFields;

// `t` (shaped like p) laid out in memory as p is, so that memory_view ranges mean the same.
torch::Tensor laid_out_as(const torch::Tensor& t, const torch::Tensor& p) {
  if (t.strides() == p.strides() && t.is_non_overlapping_and_dense()) return t;
  auto u = at::empty_strided(p.sizes(), p.strides(), t.options());
  u.copy_(t);
  return u;
}

Fields slice(const Fields& whole, const torch::Tensor& p, const Piece& piece) {
  Fields out;
  for (const auto& [name, value] : whole) {
    if (!per_element(value, p)) {
      out.emplace_back(name, value);
      continue;
    }
    out.emplace_back(name, memory_view(laid_out_as(value.toTensor(), p), piece.begin, piece.count).clone());
  }
  return out;
}

// Each replica's piece of one parameter: its range and its state's fields.
struct Part {
  size_t begin = 0, count = 0;
  Fields fields;
};

Fields join(const std::vector<Part>& parts, const torch::Tensor& p) {
  Fields out;
  if (parts.empty()) return out;
  for (const auto& [name, value] : parts.front().fields) {
    const auto& first = parts.front();
    if (!(value.isTensor() && value.toTensor().dim() == 1 &&
          value.toTensor().size(0) == static_cast<int64_t>(first.count))) {
      out.emplace_back(name, value);  // a count, a flag: the same on every replica
      continue;
    }
    auto whole = at::empty_strided(p.sizes(), p.strides(), value.toTensor().options()).zero_();
    for (const auto& part : parts) {
      for (const auto& [n, v] : part.fields) {
        if (n == name && v.isTensor()) memory_view(whole, part.begin, part.count).copy_(v.toTensor());
      }
    }
    out.emplace_back(name, whole);
  }
  return out;
}

const Piece* piece_of(const Pieces& pieces, const torch::Tensor& p) {
  const auto it = pieces.find(p.unsafeGetTensorImpl());
  return it == pieces.end() ? nullptr : &it->second;
}

std::string part_key(size_t group, size_t index) { return std::to_string(group) + "." + std::to_string(index); }

// Every replica's state of its pieces in optimizer k, keyed by (group, index) among `whole`.
std::string own_parts(torch::optim::Optimizer& opt, const Pieces& pieces,
                      const std::vector<std::vector<torch::Tensor>>& whole) {
  ser::OutputArchive archive;
  for (size_t g = 0; g < whole.size(); ++g) {
    for (size_t i = 0; i < whole[g].size(); ++i) {
      const Piece* piece = piece_of(pieces, whole[g][i]);
      if (piece == nullptr || piece->count == 0) continue;
      const auto it = opt.state().find(optimizer_state_key(opt, piece->view));
      if (it == opt.state().end() || !it->second) continue;
      ser::OutputArchive one(archive.compilation_unit());
      write_fields(one, state_fields(*it->second));
      one.write("dsgd.begin", c10::IValue(static_cast<int64_t>(piece->begin)));
      one.write("dsgd.count", c10::IValue(static_cast<int64_t>(piece->count)));
      archive.write(part_key(g, i), one);
    }
  }
  return bytes_of(archive);
}

void read_parts(const std::string& bytes, const std::vector<std::vector<torch::Tensor>>& whole, torch::Device device,
                std::map<std::pair<size_t, size_t>, std::vector<Part>>& parts) {
  ser::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size(), device);
  for (size_t g = 0; g < whole.size(); ++g) {
    for (size_t i = 0; i < whole[g].size(); ++i) {
      ser::InputArchive one;
      if (!archive.try_read(part_key(g, i), one)) continue;
      Part part;
      for (auto& [name, value] : state_fields(one)) {
        if (name == "dsgd.begin") {
          part.begin = static_cast<size_t>(value.toInt());
        } else if (name == "dsgd.count") {
          part.count = static_cast<size_t>(value.toInt());
        } else {
          part.fields.emplace_back(name, std::move(value));
        }
      }
      parts[{g, i}].push_back(std::move(part));
    }
  }
}

// The groups hold `whole` again; the pieces' states are erased.
void restore_groups(torch::optim::Optimizer& opt, const Pieces& pieces,
                    const std::vector<std::vector<torch::Tensor>>& whole) {
  for (const auto& [impl, piece] : pieces) {
    if (piece.view.defined()) opt.state().erase(optimizer_state_key(opt, piece.view));
  }
  for (size_t g = 0; g < whole.size() && g < opt.param_groups().size(); ++g) opt.param_groups()[g].params() = whole[g];
}

torch::Device device_of(const std::vector<std::vector<torch::Tensor>>& whole) {
  for (const auto& group : whole) {
    if (!group.empty()) return group.front().device();
  }
  return torch::kCPU;
}

}  // namespace

OptimizerParams optimizer_params(TrainingOperator& op) {
  OptimizerParams out(op.num_optimizers());
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    for (auto& group : op.optimizer(k).param_groups()) out[k].push_back(group.params());
  }
  return out;
}

void check_shardable(TrainingOperator& op, const Pieces& pieces) {
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    if (dynamic_cast<torch::optim::LBFGS*>(&op.optimizer(k)) != nullptr) {
      throw ConfigError("step.zero_stage: optimizer " + std::to_string(k) +
                            " is LBFGS, whose step reads every "
                            "parameter at once; ZeRO steps slices of them: use an elementwise optimizer (SGD, Adam, "
                            "AdamW, RMSprop, Adagrad) or zero_stage 0",
                        "step.zero_stage");
    }
    for (const auto& group : op.optimizer(k).param_groups()) {
      for (const auto& p : group.params()) {
        if (piece_of(pieces, p) != nullptr && !p.is_non_overlapping_and_dense()) {
          throw ConfigError(
              "step.zero_stage: a parameter of shape " + c10::str(p.sizes()) + " is not dense in " +
                  "memory (a view with gaps); ZeRO slices parameters' memory: make it contiguous or use " +
                  "zero_stage 0",
              "step.zero_stage");
        }
      }
    }
  }
}

void to_pieces(TrainingOperator& op, const Pieces& pieces, const OptimizerParams& whole) {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < op.num_optimizers() && k < whole.size(); ++k) {
    auto& opt = op.optimizer(k);
    std::vector<std::pair<std::string, Fields>> states;
    for (size_t g = 0; g < whole[k].size() && g < opt.param_groups().size(); ++g) {
      std::vector<torch::Tensor> params;
      for (const auto& p : whole[k][g]) {
        const Piece* piece = piece_of(pieces, p);
        if (piece == nullptr) {  // not sharded (frozen): everyone's, as it is
          params.push_back(p);
          continue;
        }
        const auto it = opt.state().find(optimizer_state_key(opt, p));
        if (it != opt.state().end()) {
          if (it->second && piece->count > 0)
            states.emplace_back(archive_key(piece->view), slice(state_fields(*it->second), p, *piece));
          opt.state().erase(it);
        }
        if (piece->count > 0) params.push_back(piece->view);
      }
      opt.param_groups()[g].params() = std::move(params);
    }
    install_states(opt, states);
  }
}

void gather_whole(TrainingOperator& op, const Pieces& pieces, const OptimizerParams& whole, strategy::Sharing& sharing,
                  bool keep) {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < op.num_optimizers() && k < whole.size(); ++k) {
    auto& opt = op.optimizer(k);
    const std::string mine = own_parts(opt, pieces, whole[k]);
    std::map<std::pair<size_t, size_t>, std::vector<Part>> parts;
    for (int r = 0; r < sharing.size(); ++r) {
      std::string bytes = r == sharing.rank() ? mine : std::string();
      sharing.broadcast_bytes(&bytes, r);
      if (keep) read_parts(bytes, whole[k], device_of(whole[k]), parts);
    }
    if (!keep) continue;
    restore_groups(opt, pieces, whole[k]);
    std::vector<std::pair<std::string, Fields>> states;
    for (auto& [at, list] : parts) {
      const auto& p = whole[k][at.first][at.second];
      states.emplace_back(archive_key(p), join(list, p));
    }
    install_states(opt, states);
  }
}

void drop_pieces(TrainingOperator& op, const Pieces& pieces, const OptimizerParams& whole) {
  for (size_t k = 0; k < op.num_optimizers() && k < whole.size(); ++k)
    restore_groups(op.optimizer(k), pieces, whole[k]);
}

}  // namespace dsgd::torch_glue
