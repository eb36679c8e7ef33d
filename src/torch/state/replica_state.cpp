#include "torch/state/replica_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim.h>
#include <torch/serialize.h>

#include <mutex>

#include <sstream>

#include "dsgd/common/error.h"
#include "torch/sync/grad_sync.h"

namespace dsgd::torch_glue {

void write_state_extras(const TrainingOperator& op, const ReplicaState& state,
                        torch::serialize::OutputArchive& archive) {
  archive.write("position",
                torch::tensor({state.position.epoch, state.position.batch, state.schedule_t}, torch::kInt64));
  if (state.loss_scale > 0) {
    archive.write("loss_scale", torch::tensor({state.loss_scale, static_cast<double>(state.loss_scale_good_steps)},
                                              torch::kFloat64));
  }
  torch::serialize::OutputArchive extra;
  op.state_dict(extra);
  archive.write("extra", extra);
  {
    // The CPU generator that dropout and the like draw from: a restored replica draws what the
    // saver would have drawn next, so a recovery or a resume redoes its steps exactly.
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    archive.write("cpu_rng", gen.get_state());
  }
}

ReplicaState read_state_extras(TrainingOperator& op, torch::serialize::InputArchive& archive) {
  torch::Tensor pos;
  archive.read("position", pos);
  ReplicaState s;
  s.position.epoch = pos[0].item<int64_t>();
  s.position.batch = pos[1].item<int64_t>();
  s.schedule_t = pos[2].item<int64_t>();
  torch::Tensor scale;
  if (archive.try_read("loss_scale", scale) && scale.numel() == 2) {
    s.loss_scale = scale[0].item<double>();
    s.loss_scale_good_steps = static_cast<int64_t>(scale[1].item<double>());
  }
  torch::serialize::InputArchive extra;
  if (archive.try_read("extra", extra)) op.load_state_dict(extra);
  torch::Tensor rng;
  if (archive.try_read("cpu_rng", rng)) {  // absent in states saved before it was kept
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng.to(torch::kCPU));
  }
  return s;
}

void write_replica_state(const TrainingOperator& op, const ReplicaState& state,
                         const std::function<size_t(const void*, size_t)>& writer) {
  torch::serialize::OutputArchive archive;
  for (size_t i = 0; i < op.models().size(); ++i) {
    torch::serialize::OutputArchive sub;
    op.models()[i]->save(sub);
    archive.write("model" + std::to_string(i), sub);
  }
  for (size_t i = 0; i < op.num_optimizers(); ++i) {
    torch::serialize::OutputArchive sub;
    op.optimizer(i).save(sub);
    archive.write("optimizer" + std::to_string(i), sub);
  }
  write_state_extras(op, state, archive);
  archive.save_to(writer);
}

namespace {

int64_t bytes_of(const torch::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

int64_t state_bytes(const torch::optim::OptimizerParamState& s) {
  namespace o = torch::optim;
  if (const auto* x = dynamic_cast<const o::SGDParamState*>(&s)) return bytes_of(x->momentum_buffer());
  if (const auto* x = dynamic_cast<const o::AdamParamState*>(&s)) {
    return bytes_of(x->exp_avg()) + bytes_of(x->exp_avg_sq()) + bytes_of(x->max_exp_avg_sq());
  }
  if (const auto* x = dynamic_cast<const o::AdamWParamState*>(&s)) {
    return bytes_of(x->exp_avg()) + bytes_of(x->exp_avg_sq()) + bytes_of(x->max_exp_avg_sq());
  }
  if (const auto* x = dynamic_cast<const o::RMSpropParamState*>(&s)) {
    return bytes_of(x->square_avg()) + bytes_of(x->momentum_buffer()) + bytes_of(x->grad_avg());
  }
  if (const auto* x = dynamic_cast<const o::AdagradParamState*>(&s)) return bytes_of(x->sum());
  return 0;
}

}  // namespace

int64_t optimizer_state_bytes(const TrainingOperator& op) {
  int64_t total = 0;
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    for (const auto& [key, state] : op.optimizer(k).state()) total += state ? state_bytes(*state) : 0;
  }
  return total;
}

namespace {

// About the bytes the archive will take: every model tensor and optimizer-state tensor, plus a
// little for each record's header. Reserved up front, a state of gigabytes is written once
// instead of copied as the string doubles (and each copy's fresh pages faulted in again).
size_t estimated_state_bytes(const TrainingOperator& op) {
  size_t bytes = 1 << 20;
  for (const auto& [name, t] : named_tensors(op)) bytes += t.nbytes() + 256;
  for (size_t i = 0; i < op.num_optimizers(); ++i) {
    for (const auto& [key, state] : op.optimizer(i).state()) {
      if (state) bytes += 1024;  // the tensors themselves are below
    }
  }
  return bytes + static_cast<size_t>(optimizer_state_bytes(op));
}

}  // namespace

std::string save_replica_state(const TrainingOperator& op, const ReplicaState& state) {
  // Straight into one string (an ostringstream copies the 10s of MB again as it grows and in str()).
  std::string bytes;
  bytes.reserve(estimated_state_bytes(op));
  write_replica_state(op, state, [&bytes](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  return bytes;
}

size_t replica_state_bytes(const TrainingOperator& op, const ReplicaState& state) {
  size_t bytes = 0;
  write_replica_state(op, state, [&bytes](const void*, size_t n) {
    bytes += n;
    return n;
  });
  return bytes;
}

ReplicaState load_replica_state(TrainingOperator& op, const std::string& bytes, torch::Device device) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size(), device);  // read in place: no copy of the state
  for (size_t i = 0; i < op.models().size(); ++i) {
    torch::serialize::InputArchive sub;
    if (!archive.try_read("model" + std::to_string(i), sub)) {
      throw ConfigError("the state has no model " + std::to_string(i) +
                        "; it was saved by an operator with fewer models");
    }
    op.models()[i]->load(sub);
  }
  for (size_t i = 0; i < op.num_optimizers(); ++i) {
    torch::serialize::InputArchive sub;
    if (!archive.try_read("optimizer" + std::to_string(i), sub)) continue;
    // Loading only sets the per-parameter state the archive has: state saved before the first
    // step (no momentum buffers yet) would leave this replica's buffers in place, and the
    // replicas would drift apart. Start from none, as the saver had.
    op.optimizer(i).state().clear();
    op.optimizer(i).load(sub);
  }
  return read_state_extras(op, archive);
}

std::vector<std::pair<std::string, torch::Tensor>> named_tensors(const TrainingOperator& op) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t m = 0; m < op.models().size(); ++m) {
    const std::string prefix = m == 0 ? "" : "model" + std::to_string(m) + ".";
    for (const auto& item : op.models()[m]->named_parameters()) out.emplace_back(prefix + item.key(), item.value());
    for (const auto& item : op.models()[m]->named_buffers()) out.emplace_back(prefix + item.key(), item.value());
  }
  return out;
}

std::string model_signature(const TrainingOperator& op) {
  std::ostringstream out;
  for (size_t m = 0; m < op.models().size(); ++m) {
    for (const auto& item : op.models()[m]->named_parameters()) {
      out << "model" << m << "." << item.key() << " " << item.value().sizes() << " " << item.value().dtype() << "\n";
    }
    for (const auto& item : op.models()[m]->named_buffers()) {
      out << "model" << m << "." << item.key() << " " << item.value().sizes() << " " << item.value().dtype()
          << " (buffer)\n";
    }
  }
  return out.str();
}

size_t gradient_bytes(const TrainingOperator& op, size_t grad_shard_bytes, size_t ring, int shards) {
  size_t bytes = 0;
  for (const auto& m : op.models()) {  // as the runtime makes a GradSync per model with trainable parameters
    std::vector<size_t> counts;
    for (const auto& p : m->parameters()) {
      if (p.requires_grad()) counts.push_back(static_cast<size_t>(p.numel()));
    }
    if (counts.empty()) continue;
    const size_t floats = ring_elements(counts, grad_shard_bytes, ring, shards);
    bytes += (floats * sizeof(float) + 63) / 64 * 64;
  }
  return bytes;
}

namespace {

// The state bytes an optimizer of these options keeps per trainable element.
int64_t state_bytes_per_element(const torch::optim::OptimizerOptions& options) {
  namespace o = torch::optim;
  if (const auto* x = dynamic_cast<const o::SGDOptions*>(&options)) return x->momentum() != 0 ? 4 : 0;
  if (const auto* x = dynamic_cast<const o::AdamOptions*>(&options)) return x->amsgrad() ? 12 : 8;
  if (const auto* x = dynamic_cast<const o::AdamWOptions*>(&options)) return x->amsgrad() ? 12 : 8;
  if (const auto* x = dynamic_cast<const o::RMSpropOptions*>(&options)) {
    return 4 + (x->momentum() > 0 ? 4 : 0) + (x->centered() ? 4 : 0);
  }
  if (dynamic_cast<const o::AdagradOptions*>(&options) != nullptr) return 4;
  return 0;
}

// Elements of this replica's blocks (strategy::ShardLayout) over every model's GradSync.
int64_t shard_elements(const TrainingOperator& op, size_t grad_shard_bytes, int world) {
  int64_t elements = 0;
  for (const auto& m : op.models()) {
    std::vector<size_t> counts;
    for (const auto& p : m->parameters()) {
      if (p.requires_grad()) counts.push_back(static_cast<size_t>(p.numel()));
    }
    if (counts.empty()) continue;
    const strategy::BucketPlan plan(counts, sizeof(float), grad_shard_bytes);
    elements += static_cast<int64_t>(strategy::ShardLayout(plan, world, 0).shard_elements());
  }
  return elements;
}

}  // namespace

MemoryNeed memory_need(TrainingOperator& op, size_t grad_shard_bytes, int stage, int world) {
  const bool sharded = stage > 0 && world >= 2;
  MemoryNeed need;
  for (const auto& [name, t] : named_tensors(op)) need.parameters += static_cast<int64_t>(t.nbytes());
  const size_t ring = sharded && stage >= 2 ? kRingBuckets : 0;
  need.gradients = static_cast<int64_t>(gradient_bytes(op, grad_shard_bytes, ring, sharded ? world : 0));
  if (sharded) need.gradients += 4 * shard_elements(op, grad_shard_bytes, world);
  if (sharded && stage == 3) {  // the trainable parameters' shard only (units gathered whole come on top)
    for (const auto& m : op.models()) {
      for (const auto& p : m->parameters()) need.parameters -= p.requires_grad() ? static_cast<int64_t>(p.nbytes()) : 0;
    }
    need.parameters += 4 * shard_elements(op, grad_shard_bytes, world);
  }
  for (size_t k = 0; k < op.num_optimizers(); ++k) {
    for (const auto& group : op.optimizer(k).param_groups()) {
      int64_t elements = 0;
      for (const auto& p : group.params()) elements += p.requires_grad() ? p.numel() : 0;
      need.optimizer_state += elements * state_bytes_per_element(group.options());
    }
  }
  if (sharded) need.optimizer_state /= world;
  return need;
}

}  // namespace dsgd::torch_glue
