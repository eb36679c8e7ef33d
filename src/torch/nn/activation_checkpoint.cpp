// Activation checkpointing (dsgd/torch/activation_checkpoint.h): a node of autograd's graph of our
// own, whose inputs are the unit's input and parameters. Its backward runs the unit again with
// gradients on and hands the input's and parameters' gradients on to the outer backward, which
// gives them to the parameters as any other node's: no backward inside backward accumulates
// into them, so gradient hooks, the end-of-backward callbacks that dsgd queues on the first
// gradient and the order of the parameters' gradients are those of a run without checkpointing.
#include "dsgd/torch/activation_checkpoint.h"

#include <ATen/core/Generator.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dsgd/common/error.h"
#include "torch/nn/autocast_state.h"

namespace dsgd {
namespace {

using torch::autograd::variable_list;

thread_local bool checkpoint_all = false;
thread_local int recompute_depth = 0;
thread_local uint64_t checkpointed_units = 0;

struct Marks {
  std::atomic<bool> any{false};  // forward's calls skip the lock while nothing was ever marked
  std::mutex mutex;
  std::vector<std::weak_ptr<const torch::nn::Module>> units;
};
Marks& marks() {
  static Marks m;
  return m;
}

bool marked(const torch::nn::Module& unit) {
  auto& m = marks();
  if (!m.any.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(m.mutex);
  for (const auto& w : m.units) {
    if (auto u = w.lock(); u && u.get() == &unit) return true;
  }
  return false;
}

// The generators a unit's forward may draw from: the CPU's, and its input's device's.
std::vector<at::Generator> generators(const torch::Device& device) {
  std::vector<at::Generator> g{at::globalContext().defaultGenerator(torch::kCPU)};
  if (device.type() != torch::kCPU) g.push_back(at::globalContext().defaultGenerator(device));
  return g;
}

std::vector<torch::Tensor> states_of(std::vector<at::Generator>& gens) {
  std::vector<torch::Tensor> states;
  for (auto& g : gens) {
    std::lock_guard<std::mutex> lock(g.mutex());
    states.push_back(g.get_state());
  }
  return states;
}

void set_states(std::vector<at::Generator>& gens, const std::vector<torch::Tensor>& states) {
  for (size_t i = 0; i < gens.size(); ++i) {
    std::lock_guard<std::mutex> lock(gens[i].mutex());
    gens[i].set_state(states[i]);
  }
}

// What a unit's forward saw, put back for its recompute, and what the recompute changed undone
// after it: the generators, autocast, the unit's buffers (BatchNorm updates its statistics in
// its kernel, unseen by the buffers' version counters, so all are put back).
struct ForwardContext {
  torch::Device device{torch::kCPU};
  std::vector<torch::Tensor> rng;
  torch_glue::AutocastState autocast;
  std::vector<torch::Tensor> buffers;

  // Generators and autocast as the forward had them until forward_done(); the buffers put back
  // when it goes, after the recompute's backward (which reads what the recompute saved of them).
  class Replay {
   public:
    explicit Replay(const ForwardContext& c)
        : type_(c.device.type()),
          gens_(generators(c.device)),
          rng_(states_of(gens_)),
          autocast_(torch_glue::autocast_state(type_)),
          buffers_(c.buffers) {
      for (const auto& b : buffers_) saved_.push_back(b.clone());
      set_states(gens_, c.rng);
      torch_glue::set_autocast_state(type_, c.autocast);
    }
    void forward_done() {
      if (std::exchange(forward_done_, true)) return;
      set_states(gens_, rng_);
      torch_glue::set_autocast_state(type_, autocast_);  // the backward runs as it would
    }
    ~Replay() {
      forward_done();
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(saved_[i]);
    }
    Replay(const Replay&) = delete;
    Replay& operator=(const Replay&) = delete;

   private:
    torch::DeviceType type_;
    std::vector<at::Generator> gens_;
    std::vector<torch::Tensor> rng_;
    torch_glue::AutocastState autocast_;
    std::vector<torch::Tensor> buffers_, saved_;
    bool forward_done_ = false;
  };
};

class CheckpointedUnitBackward : public torch::autograd::Node {
 public:
  CheckpointedUnitBackward(const torch::Tensor& input, UnitForward forward, std::vector<torch::Tensor> params,
                           ForwardContext context)
      : input_(input, /*is_output=*/false),
        input_grad_(input.requires_grad()),
        forward_(std::move(forward)),
        params_(std::move(params)),
        context_(std::move(context)) {}

  std::string name() const override { return "dsgd::CheckpointedUnitBackward"; }
  void release_variables() override {
    input_.reset_data();
    forward_ = nullptr;
    context_.buffers.clear();
  }

  variable_list apply(variable_list&& grads) override {
    if (!forward_) {
      throw Error(
          "a checkpointed unit's backward ran twice: its activations are recomputed once (use "
          "retain_graph without activation checkpointing)");
    }
    ++recompute_depth;
    struct Depth {
      ~Depth() { --recompute_depth; }
    } depth;
    auto x = input_.unpack().detach();
    x.requires_grad_(input_grad_);
    torch::Tensor out;
    ForwardContext::Replay replay(context_);
    {
      const torch::AutoGradMode on(true);
      out = forward_(x);
    }
    replay.forward_done();
    variable_list result(1 + params_.size());
    if (grads[0].defined() && out.requires_grad()) {
      variable_list wrt;
      if (input_grad_) wrt.push_back(x);
      wrt.insert(wrt.end(), params_.begin(), params_.end());
      auto g = torch::autograd::grad({out}, wrt, {grads[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                     /*allow_unused=*/true);
      size_t k = 0;
      if (input_grad_) result[0] = std::move(g[k++]);
      for (size_t i = 0; i < params_.size(); ++i) result[1 + i] = std::move(g[k++]);
    }
    out = torch::Tensor();
    release_variables();
    return result;
  }

 private:
  torch::autograd::SavedVariable input_;
  bool input_grad_;
  UnitForward forward_;
  std::vector<torch::Tensor> params_;
  ForwardContext context_;
};

}  // namespace

bool set_thread_checkpoint_all(bool all) { return std::exchange(checkpoint_all, all); }

bool recomputing_checkpointed_unit() { return recompute_depth > 0; }

uint64_t thread_checkpointed_units() { return checkpointed_units; }

void checkpoint_activations(const torch::nn::Module& unit) {
  std::shared_ptr<const torch::nn::Module> held;
  try {
    held = unit.shared_from_this();
  } catch (const std::bad_weak_ptr&) {
    throw ConfigError("checkpoint_activations: the module " + unit.name() +
                      " is not held by a shared_ptr; mark a registered module (register_module's, or a "
                      "TORCH_MODULE holder's *module)");
  }
  auto& m = marks();
  std::lock_guard<std::mutex> lock(m.mutex);
  std::erase_if(m.units, [](const auto& w) { return w.expired(); });
  m.units.push_back(held);
  m.any.store(true, std::memory_order_release);
}

torch::Tensor run_checkpointed(const torch::nn::Module& unit, const torch::Tensor& input, const UnitForward& forward) {
  if (!torch::GradMode::is_enabled() || (!checkpoint_all && !marked(unit))) return forward(input);
  std::vector<torch::Tensor> params;
  for (const auto& p : unit.parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  if (params.empty() && !input.requires_grad()) return forward(input);

  ForwardContext context;
  context.device = input.device();
  auto gens = generators(context.device);
  context.rng = states_of(gens);
  context.autocast = torch_glue::autocast_state(context.device.type());
  context.buffers = unit.buffers();
  torch::Tensor out;
  {
    const torch::NoGradGuard no_grad;
    out = forward(input);
    if (!out.defined()) throw ConfigError("run_checkpointed: the unit " + unit.name() + "'s forward returned nothing");
    if (out.is_alias_of(input)) out = out.clone();  // the node's output is a tensor of its own
  }
  auto node = std::shared_ptr<CheckpointedUnitBackward>(
      new CheckpointedUnitBackward(input, forward, params, std::move(context)), torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(input, params));
  torch::autograd::create_gradient_edge(out, node);
  ++checkpointed_units;
  return out;
}

}  // namespace dsgd
