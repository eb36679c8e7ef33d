// The members' compute per step from their heartbeats, every ~0.5 s of a train call (on the
// call's tick): stragglers named (a warning each) and cleared, each change noted for the call's
// trace and the dashboard; with recovery.on_straggler evict, a straggler counted as lost where a
// standby is ready to take its place. The group of a new generation starts its windows again.
// A part of the driver's Job (runtime/driver/job.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/driver/stragglers.h"

namespace dsgd::runtime {

class Job;
class TraceFile;  // runtime/worker/trace_file.h

class StragglerWatch {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StragglerWatch(Job& job) : job_(job) {}

  // Reads the heartbeats (at most every 500 ms); may throw the CommError of an eviction.
  void watch();
  void begin_call() { changes_.clear(); }
  // The stragglers named or cleared during the call, as instants in its trace that started at t0.
  void add_notes(TraceFile* trace, Clock::time_point t0);
  std::vector<Straggler> current() const { return detector_.current(); }
  std::vector<Straggler> take_named() { return detector_.take_named(); }
  // The stragglers the recovery under way treats as lost (worker ids).
  bool evicting(int id) const;
  void clear_evicting() { evicting_.clear(); }

 private:
  // Throws the CommError that starts a recovery in which worker `id` (straggler `s`) counts as
  // lost, if a standby is ready to take its place; else warns (once a straggler).
  void evict(int id, const Straggler& s);

  Job& job_;
  StragglerDetector detector_;
  Clock::time_point checked_{};
  int64_t generation_ = 0;  // whose members the windows are of
  std::vector<int> evicting_;
  std::vector<int64_t> kept_;  // pids warned about: no standby was ready
  std::vector<std::pair<Clock::time_point, Straggler>> changes_;
};

}  // namespace dsgd::runtime
