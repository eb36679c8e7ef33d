// A train() call's timeline as one Chrome trace (TrainOptions::trace_path): each worker a process,
// each of its threads a row (the replica's: forward, backward, optimizer, waits for buckets and the
// deferred steps; each communication queue's: its allreduces, pushes and pulls), each bucket's
// launch an instant. Opens in Perfetto (ui.perfetto.dev) or chrome://tracing.
//
//   worker, per train command:   timeline::start(); ...; reply["trace"] = trace_json(timeline::stop());
//   driver, per chunk:           for each worker i: file.add(i, "worker 0 (host a, pid 7)", reply["trace"], offset_us);
//   driver, at the end:          file.write(path);
//
// Times: each worker's count from its receipt of the train command, placed at the driver's send
// time (offset_us) on the driver's clock; commands reach the workers within about a millisecond,
// so rows of different workers line up to about that. Not thread-safe.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "comm/timeline.h"

namespace dsgd::runtime {

// What a worker sends back: {"threads": [names], "events": [[name, bucket, thread, start_us,
// duration_us (< 0: an instant)], ...], "dropped": n}.
nlohmann::json trace_json(const comm::timeline::Recording& recording);

// Throws dsgd::ConfigError unless `path`'s directory exists: checked before a call trains, so a
// long call does not fail at its end.
void check_trace_path(const std::string& path);

class TraceFile {
 public:
  // Adds one worker's trace_json, its times shifted by offset_us. Throws dsgd::Error if `trace`
  // is not shaped like trace_json's output (naming the worker).
  void add(int worker, const std::string& worker_name, const nlohmann::json& trace, double offset_us);
  // An instant across every row at `at_us` on the driver's clock (from the call's start): what the
  // driver saw, e.g. "straggler: rank 1 (host a, pid 7) 1.42x", with `args` shown beside it.
  void add_note(double at_us, const std::string& name, const nlohmann::json& args);
  // Events dropped by the workers (past comm::timeline::kMaxEvents in one command).
  uint64_t dropped() const { return dropped_; }
  size_t num_events() const { return events_.size(); }
  // Writes {"traceEvents": [...], "displayTimeUnit": "ms"}; throws dsgd::Error naming the path.
  void write(const std::string& path) const;

 private:
  nlohmann::json events_ = nlohmann::json::array();
  nlohmann::json metadata_ = nlohmann::json::array();
  std::map<std::pair<int, std::string>, int> threads_;  // (worker, thread name) -> tid
  std::map<int, bool> named_;                           // workers named so far
  uint64_t dropped_ = 0;
};

}  // namespace dsgd::runtime
