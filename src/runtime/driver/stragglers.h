// Finding stragglers from the workers' heartbeats (dsgd::Straggler). In a synchronous job every
// rank's step takes as long as the slowest's, so step times cannot tell; but each worker reports
// how much of its steps it spent computing rather than waiting for the others, and a slow rank
// computes longer while the rest wait for it. The driver compares each rank's compute per step
// over a recent window with the median of the other ranks'; FALCON (Wu et al., 2024) found
// fail-slows of 10% and more this way. Torch-free; not thread-safe (the driver's thread).
//
//   StragglerDetector d;
//   d.observe(worker, rank, host, pid, step, timed_steps, compute_s, now_s);  // per heartbeat
//   for (const Straggler& s : d.update()) log(s);   // those named or cleared now
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "dsgd/common/trainer_config.h"

namespace dsgd::runtime {

struct StragglerOptions {
  double threshold = 1.10;           // compute per step over the others' median that names a rank
  int64_t window_steps = 20;         // the window: at least this many steps
  double window_s = 10;              //   and this many seconds
  double min_excess_s = 0.0005;      // and at least this much longer a step (timer noise)
};

class StragglerDetector {
 public:
  explicit StragglerDetector(StragglerOptions options = {}) : o_(options) {}

  // Worker `worker`'s cumulative figures from its heartbeat (Progress: timed_steps, compute_s),
  // at the driver's time `now_s`; `rank` its place among the members, `step` the job's step.
  void observe(int worker, int rank, const std::string& host, int64_t pid, int64_t step, int64_t timed_steps,
               double compute_s, double now_s);
  // Compares the ranks: returns each straggler named (to_step -1) or cleared (to_step set) now.
  std::vector<Straggler> update();
  // Those slow now.
  std::vector<Straggler> current() const;
  // Every straggler named since the last call (cleared ones with their to_step), then forgets
  // the cleared ones.
  std::vector<Straggler> take_named();
  // The members changed (a recovery): windows start again, open stragglers end at `step`.
  void reset(int64_t step);
  // The open straggler of process `pid` is being evicted: it ends at its last step, marked
  // Straggler::evicted.
  void evicted(int64_t pid);

 private:
  struct Sample {
    int64_t step = 0, timed_steps = 0;
    double compute_s = 0, t = 0;
  };
  struct Rank {
    int rank = 0;
    std::string host;
    int64_t pid = 0;
    std::deque<Sample> samples;
    bool slow = false;
    size_t event = 0;  // into events_, while slow
  };
  // Compute per step over the newest window, and the step it began at; false: too few samples.
  bool window_rate(Rank& r, double* rate, int64_t* from_step) const;

  StragglerOptions o_;
  std::map<int, Rank> ranks_;      // by worker index
  std::vector<Straggler> events_;  // named since take_named; to_step -1 while still slow
};

}  // namespace dsgd::runtime
