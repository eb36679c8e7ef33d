// Memory known before it runs out: what the workers the driver starts on its own machine will
// hold (each worker's estimate from its setup: parameters, gradients, optimizer state; before
// activations) against what the machine has, checked before the first step. A job that would not
// fit stops with a ConfigError that gives both figures, each worker's parts, and the ZeRO stage
// or the worker count that would fit, instead of the kernel killing a worker part-way.
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

// Throws ConfigError where the workers' need at `stage` exceeds `available` bytes (< 0: unknown,
// nothing checked). Returns the log line that says what they will hold.
std::string check_memory(const std::vector<WorkerMemory>& workers, int stage, int64_t available);

}  // namespace dsgd::runtime
