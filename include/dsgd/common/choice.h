// dsgd/common/choice.h — the fields of TrainerConfig that take one of a fixed set of values.
//
//   dsgd::TrainerConfig c;
//   c.strategy = "ps";                            // as on the command line and in --config JSON
//   if (c.strategy == dsgd::Strategy::kPs) ...    // or switch (c.strategy.value())
//   std::cout << c.strategy;                      // "ps" (name(): for messages and JSON only)
//
// A Choice<E> holds an enum value, or the spelling it was given when that names none: a bad
// spelling is kept, not thrown at assignment, so that the Trainer's constructor reports it with
// every other bad field (ConfigError: "unknown strategy 'x'; use simple, allreduce, ps or
// ps_async"). value() of an unknown spelling throws that same error. The enums' numbers are
// those of the job contract (proto/dsgd/control.proto); 0 is never a value.
#pragma once

#include <array>
#include <ostream>
#include <string>
#include <string_view>

#include "dsgd/common/error.h"

namespace dsgd {

// How replicas combine their gradients each step.
enum class Strategy { kSimple = 1, kAllreduce = 2, kPs = 3, kPsAsync = 4 };
// Strategy ps: where the parameter-server shards live.
enum class PsPlacement { kWorkers = 1, kProcesses = 2 };
// Strategy allreduce: auto (shared memory within a host, Gloo across), ring or halving-doubling.
enum class AllreduceAlgo { kAuto = 1, kRing = 2, kHalvingDoubling = 3 };
// A NaN or infinite gradient: skip that step everywhere (and warn), or fail.
enum class NonfinitePolicy { kSkip = 1, kError = 2 };
// When the registered learning-rate schedules step: after every batch, every epoch, or only
// when the operator steps them.
enum class SchedulerStepFreq { kBatch = 1, kEpoch = 2, kManual = 3 };

// Where replicas compute: CUDA when LibTorch sees a GPU (auto), the CPU, or CUDA (an error
// where there is none).
enum class Device { kAuto = 1, kCpu = 2, kCuda = 3 };
// The arithmetic of forward and loss: float32, or bfloat16 under autocast (float32 weights,
// gradients and optimizer).
enum class Precision { kFp32 = 1, kBf16 = 2, kFp16 = 3 };
// What crosses hosts (TrainerConfig::comm.compression): float32 as computed, float16 / bfloat16 on
// the wire (summed in float32), or PowerSGD's low-rank factors; the lossy ones with error feedback.
enum class Compression { kNone = 1, kFp16 = 2, kBf16 = 3, kPowerSgd = 4 };
// Who starts the workers (the driver's business, not in the job contract): auto (local without
// TrainerConfig::launch.listen, none with it), this host's processes, the hosts of a hosts file over
// ssh, all at once under mpirun, job steps of a Slurm allocation, or someone else (`dsgd worker --driver ...` by hand
// or by a cluster manager).
enum class Launcher { kAuto = 1, kLocal = 2, kSsh = 3, kNone = 4, kMpirun = 5, kSlurm = 6 };
// Mutual TLS on the control plane (the driver's business): auto (on where the driver starts every
// worker and so can hand them keys it makes, or with key files; otherwise off, with a warning),
// on (as auto, but a ConfigError where it cannot be had), off.
enum class Tls { kAuto = 1, kOn = 2, kOff = 3 };
// A straggler named (dsgd::Straggler): warn only, or evict it, a ready standby taking its place.
enum class StragglerAction { kWarn = 1, kEvict = 2 };

// The field's path in TrainerConfig and the spelling of each value (index = enum value - 1).
template <typename E>
struct ChoiceTraits;
template <>
struct ChoiceTraits<Strategy> {
  static constexpr std::string_view field = "strategy";
  static constexpr std::array<std::string_view, 4> names = {"simple", "allreduce", "ps", "ps_async"};
};
template <>
struct ChoiceTraits<PsPlacement> {
  static constexpr std::string_view field = "ps.placement";
  static constexpr std::array<std::string_view, 2> names = {"workers", "processes"};
};
template <>
struct ChoiceTraits<AllreduceAlgo> {
  static constexpr std::string_view field = "comm.allreduce_algo";
  static constexpr std::array<std::string_view, 3> names = {"auto", "ring", "hd"};
};
template <>
struct ChoiceTraits<NonfinitePolicy> {
  static constexpr std::string_view field = "step.nonfinite_policy";
  static constexpr std::array<std::string_view, 2> names = {"skip", "error"};
};
template <>
struct ChoiceTraits<Device> {
  static constexpr std::string_view field = "device";
  static constexpr std::array<std::string_view, 3> names = {"auto", "cpu", "cuda"};
};
template <>
struct ChoiceTraits<Precision> {
  static constexpr std::string_view field = "step.precision";
  static constexpr std::array<std::string_view, 3> names = {"fp32", "bf16", "fp16"};
};
template <>
struct ChoiceTraits<Compression> {
  static constexpr std::string_view field = "comm.compression";
  static constexpr std::array<std::string_view, 4> names = {"none", "fp16", "bf16", "powersgd"};
};
template <>
struct ChoiceTraits<Launcher> {
  static constexpr std::string_view field = "launch.launcher";
  static constexpr std::array<std::string_view, 6> names = {"auto", "local", "ssh", "none", "mpirun", "slurm"};
};
template <>
struct ChoiceTraits<Tls> {
  static constexpr std::string_view field = "launch.tls";
  static constexpr std::array<std::string_view, 3> names = {"auto", "on", "off"};
};
template <>
struct ChoiceTraits<StragglerAction> {
  static constexpr std::string_view field = "recovery.on_straggler";
  static constexpr std::array<std::string_view, 2> names = {"warn", "evict"};
};
template <>
struct ChoiceTraits<SchedulerStepFreq> {
  static constexpr std::string_view field = "step.scheduler_step_freq";
  static constexpr std::array<std::string_view, 3> names = {"batch", "epoch", "manual"};
};

// "a, b or c": the spellings of E, for messages and --help.
template <typename E>
std::string choice_names(std::string_view last_separator = " or ") {
  std::string out;
  const auto& names = ChoiceTraits<E>::names;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? std::string(last_separator) : std::string(", ");
    out += names[i];
  }
  return out;
}

template <typename E>
class Choice {
 public:
  Choice(E value) : value_(value) {}  // NOLINT: implicit, as an enum field would be
  Choice(std::string_view name) : name_(name) {  // NOLINT: implicit, for c.strategy = "ps"
    const auto& names = ChoiceTraits<E>::names;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) value_ = static_cast<E>(i + 1);
    }
  }
  Choice(const char* name) : Choice(std::string_view(name)) {}          // NOLINT
  Choice(const std::string& name) : Choice(std::string_view(name)) {}   // NOLINT

  // False for a spelling that names no value.
  bool known() const { return static_cast<int>(value_) != 0; }
  // The value; ConfigError for an unknown spelling.
  E value() const {
    if (!known()) {
      throw ConfigError("unknown " + std::string(ChoiceTraits<E>::field) + " '" + name_ + "'; use " +
                        choice_names<E>());
    }
    return value_;
  }
  // The spelling: the value's, or the unknown one given.
  std::string name() const {
    return known() ? std::string(ChoiceTraits<E>::names[static_cast<size_t>(value_) - 1]) : name_;
  }

  // Compared with a value (c.strategy == Strategy::kPs), never with a spelling: an enum is not
  // turned into a string and back. Two Choices are equal when both name the same value, or
  // both carry the same unknown spelling.
  friend bool operator==(const Choice& a, const Choice& b) {
    return a.known() == b.known() && (a.known() ? a.value_ == b.value_ : a.name_ == b.name_);
  }
  friend bool operator==(const Choice& a, E b) { return a.known() && a.value_ == b; }
  friend bool operator==(const Choice&, const char*) = delete;  // compare with E, not a spelling
  friend bool operator==(const Choice&, const std::string&) = delete;
  friend bool operator==(const Choice&, std::string_view) = delete;
  friend std::ostream& operator<<(std::ostream& out, const Choice& c) { return out << c.name(); }

 private:
  E value_{};         // 0 where the spelling names none
  std::string name_;  // the spelling given, kept where it names no value
};

}  // namespace dsgd
