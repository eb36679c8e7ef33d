// Memory known before it runs out (runtime/driver/memory_check.h).
#include "runtime/driver/memory_check.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "dsgd/common/error.h"

namespace dsgd::runtime {
namespace {

std::string gib(int64_t bytes) {  // GiB, or MiB below one
  char out[32];
  if (bytes >= (int64_t{1} << 30)) {
    std::snprintf(out, sizeof out, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  } else {
    std::snprintf(out, sizeof out, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  }
  return out;
}

int64_t held_at(const std::vector<WorkerMemory>& workers, int stage) {
  int64_t total = 0;
  for (const auto& w : workers) total += w[static_cast<size_t>(stage)].total();
  return total;
}

}  // namespace

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

StageBytes start_copies(const std::vector<WorkerMemory>& workers, bool sent) {
  StageBytes out{};
  if (workers.empty()) return out;
  const int64_t whole = workers.front()[0].parameters;  // stage 0 holds them whole
  for (int s = 0; s < kZeroStages; ++s) {
    const auto& w = workers.front()[static_cast<size_t>(s)];
    out[static_cast<size_t>(s)] = 2 * whole + (whole - w.parameters) +
                                  (sent ? 2 * whole * static_cast<int64_t>(workers.size()) : 0);
  }
  return out;
}

std::string check_memory(const std::vector<WorkerMemory>& workers, int stage, int64_t available,
                         const StageBytes& extra) {
  if (workers.empty()) return "";
  const auto need_at = [&](int s) { return held_at(workers, s) + extra[static_cast<size_t>(s)]; };
  const auto& one = workers.front()[static_cast<size_t>(stage)];
  const int64_t held = held_at(workers, stage), need = need_at(stage);
  std::ostringstream parts;
  parts << "parameters " << gib(one.parameters) << ", gradients " << gib(one.gradients) << ", optimizer state "
        << gib(one.optimizer_state);
  const int64_t more = extra[static_cast<size_t>(stage)];
  const std::string each = std::to_string(workers.size()) + " worker(s) on this machine will hold " + gib(held) +
                           " before activations (each: " + parts.str() + ", at zero stage " + std::to_string(stage) +
                           ")" +
                           (more > 0 ? ", and " + gib(more) +
                                           " more while the start-up snapshot is taken (worker 0's state as bytes, the "
                                           "driver's copy)"
                                     : std::string());
  if (available < 0 || need <= available) return each;
  std::string fits;
  for (int s = stage + 1; s < kZeroStages && fits.empty(); ++s) {
    if (need_at(s) <= available) fits = "--zero " + std::to_string(s) + " (" + gib(need_at(s)) + ")";
  }
  const int64_t per_worker = held / static_cast<int64_t>(workers.size());
  const int64_t count = per_worker > 0 ? (available - more) / per_worker : 0;
  if (count >= 1) {
    fits += std::string(fits.empty() ? "" : ", or ") + "about " + std::to_string(count) + " worker(s) per machine";
  }
  throw ConfigError("memory: the " + each + ", more than the " + gib(available) + " available (launch.memory_mib, " +
                        "else the machine's MemAvailable): " +
                        (fits.empty() ? std::string("use a smaller model or batch, or machines with more memory")
                                      : "what would fit: " + fits),
                    "launch.memory_mib");
}

}  // namespace dsgd::runtime
