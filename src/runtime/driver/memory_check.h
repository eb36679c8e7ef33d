// Memory known before it runs out: what the workers the driver starts on its own machine will
// hold (each worker's estimate from its setup: parameters, gradients, optimizer state; before
// activations), and the start-up's copies of the state, against what the machine has, checked
// before the first step. A job that would not fit stops with a ConfigError that gives both
// figures, each worker's parts, and the ZeRO stage or the worker count that would fit, instead of
// the kernel killing a worker part-way.
//
//   const int64_t available = available_memory_bytes();        // before the workers set up
//   check_memory(needs, config.step.zero_stage, available);     // needs[w][stage], from SetupReply
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dsgd::runtime {

struct MemoryParts {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0;
  int64_t total() const { return parameters + gradients + optimizer_state; }
};
// One worker's need at each step.zero_stage (0 to 3).
inline constexpr int kZeroStages = 4;
using WorkerMemory = std::array<MemoryParts, kZeroStages>;

// /proc/meminfo's MemAvailable in bytes; -1 where it does not say.
int64_t available_memory_bytes();

// What the start-up adds for a moment at each stage, beside what the workers hold: its snapshot,
// worker 0's state as bytes and the driver's copy of it (the parameters and buffers: no optimizer
// state before the first step), worker 0's parameters gathered whole first at stage 3, and where
// `sent` (the replicas did not set up equal) each worker's received copy and its load.
using StageBytes = std::array<int64_t, kZeroStages>;
StageBytes start_copies(const std::vector<WorkerMemory>& workers, bool sent);

// Throws ConfigError where the workers' need at `stage` and `extra`'s moment exceed `available`
// bytes (< 0: unknown, nothing checked). Returns the log line that says what they will hold.
std::string check_memory(const std::vector<WorkerMemory>& workers, int stage, int64_t available,
                         const StageBytes& extra = {});

}  // namespace dsgd::runtime
