// dsgd/torch/activation_checkpoint.h — activation checkpointing (PyTorch's torch.utils.checkpoint):
// a unit's activations dropped after its forward and recomputed in its backward, so a model's
// memory holds each checkpointed unit's input instead of every tensor its backward reads, for
// about one more forward of those units a step.
//
//   for (const auto& b : *blocks_) {
//     dsgd::wait_for_parameters(*b);  // ZeRO stage 3 gathers it; the forward overlap waits
//     x = dsgd::run_checkpointed(*b, x, [&](const torch::Tensor& in) { return b->forward(in); });
//   }
//
// A unit run through run_checkpointed is checkpointed when the job sets
// TrainerConfig::step.activation_checkpointing (`--activation-checkpointing`: every such unit of
// every model, while a dsgd replica trains), or when it was marked with checkpoint_activations
// (an operator's setup: that unit, wherever it runs with gradients on). Otherwise, and without
// gradients (validation, evaluation), `forward` simply runs.
//
// The contract of `forward`: it reads only `input`, the unit's own parameters and buffers, and
// constants, and computes the same thing when run again. Randomness is replayed: the recompute
// sees the CPU generator's state (and the input's device's) as the forward saw it, under the
// same autocast, and buffers it updates (BatchNorm's running statistics) are put back after the
// recompute, so they count the forward once. A parameter of another module that `forward` uses
// gets no gradient: name it in that module's own call. Each of the unit's parameters gets its
// gradient once, from backward's outer pass, as without checkpointing (gradient hooks, dsgd's
// buckets and ZeRO stage 3's gathers see the same order).
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>

namespace dsgd {

using UnitForward = std::function<torch::Tensor(const torch::Tensor&)>;

torch::Tensor run_checkpointed(const torch::nn::Module& unit, const torch::Tensor& input, const UnitForward& forward);
// Marks `unit` (a module held by a shared_ptr, as registered modules are) for checkpointing
// whatever the job's setting: run_checkpointed drops its activations while it lives.
void checkpoint_activations(const torch::nn::Module& unit);

// ---- for the runtime ----
// Whether every unit run through run_checkpointed on the calling thread is checkpointed
// (a replica's training thread, with step.activation_checkpointing); returns the value it replaces.
bool set_thread_checkpoint_all(bool all);
// How many units run_checkpointed has checkpointed on the calling thread (a replica's metric).
uint64_t thread_checkpointed_units();
// Whether the calling thread is recomputing a checkpointed unit's backward: the gradients it
// computes there are handed on to the outer backward, so a hook on a parameter that also sees
// them there (LibTorch 2.x calls tensor hooks on captured gradients) must let them pass.
bool recomputing_checkpointed_unit();

}  // namespace dsgd
