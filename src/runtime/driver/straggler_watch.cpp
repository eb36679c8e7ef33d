// Stragglers named, cleared and evicted from the members' heartbeats (runtime/driver/straggler_watch.h).
#include "runtime/driver/straggler_watch.h"

#include <algorithm>
#include <string>
#include <utility>

#include "dsgd/common/error.h"
#include "dsgd/runtime/fit.h"
#include "control/log.h"
#include "runtime/driver/job.h"
#include "runtime/worker/trace_file.h"

namespace dsgd::runtime {

using json = nlohmann::json;

void StragglerWatch::watch() {
  const auto now = Clock::now();
  if (now - checked_ < std::chrono::milliseconds(500)) return;
  checked_ = now;
  const auto members = job_.pool->members();
  const auto workers = job_.server->workers();
  if (job_.generation != generation_) {  // a recovery: other members, other windows
    detector_.reset(job_.steps_done);
    generation_ = job_.generation;
    job_.monitor.set_stragglers({});
  }
  const double now_s = job_.monitor.uptime_s();
  for (size_t rank = 0; rank < members.size(); ++rank) {
    const auto& w = workers.at(static_cast<size_t>(members[rank]));
    const json p = json::parse(w.progress.empty() ? "null" : w.progress, nullptr, false);
    if (!p.is_object() || !p.contains("timed_steps")) continue;
    detector_.observe(members[rank], static_cast<int>(rank), w.host, w.pid, p.value("step", int64_t{0}),
                      p.value("timed_steps", int64_t{0}), p.value("compute_s", 0.0), now_s);
  }
  const auto changed = detector_.update();
  if (!changed.empty()) {
    std::vector<int64_t> pids;
    for (const Straggler& s : detector_.current()) pids.push_back(s.pid);
    job_.monitor.set_stragglers(std::move(pids));
  }
  for (const Straggler& s : changed) {
    changes_.emplace_back(now, s);
    if (s.to_step < 0) {
      control::log().warn(
          "trainer: rank {} (host {}, pid {}) is a straggler: it computes {:.2f}x as long a step as "
          "the others (since step {})",
          s.rank, s.host, s.pid, s.slowdown, s.from_step);
      job_.monitor.record_event("straggler", fmt::format("rank {} (pid {}) a straggler: {:.2f}x the others' compute "
                                                         "per step",
                                                         s.rank, s.pid, s.slowdown));
    } else {
      control::log().info(
          "trainer: rank {} (host {}, pid {}) keeps pace again (slow from step {} to {}, at worst "
          "{:.2f}x)",
          s.rank, s.host, s.pid, s.from_step, s.to_step, s.slowdown);
      job_.monitor.record_event(
          "straggler", fmt::format("rank {} (pid {}) keeps pace again (at worst {:.2f}x)", s.rank, s.pid, s.slowdown));
    }
  }
  // Each watch, not only when named: a standby set up later still takes a straggler's place.
  if (job_.config.recovery.on_straggler == StragglerAction::kEvict) {
    for (const Straggler& s : detector_.current()) evict(members.at(static_cast<size_t>(s.rank)), s);
  }
}

void StragglerWatch::evict(int id, const Straggler& s) {
  if (job_.pool->ready().empty()) {
    if (std::find(kept_.begin(), kept_.end(), s.pid) == kept_.end()) {
      kept_.push_back(s.pid);
      control::log().warn(
          "trainer: rank {} (pid {}) is not evicted: no standby is ready to take its place "
          "(--standby N); a lost worker would cost more than a slow one",
          s.rank, s.pid);
    }
    return;
  }
  detector_.evicted(s.pid);
  evicting_.push_back(id);
  throw CommError(fmt::format("rank {} (host {}, pid {}) evicted as a straggler: it computed {:.2f}x as long a step "
                              "as the others since step {}",
                              s.rank, s.host, s.pid, s.slowdown, s.from_step),
                  "straggler", s.rank, s.host);
}

bool StragglerWatch::evicting(int id) const {
  return std::find(evicting_.begin(), evicting_.end(), id) != evicting_.end();
}

void StragglerWatch::add_notes(TraceFile* trace, Clock::time_point t0) {
  for (const auto& [at, s] : std::exchange(changes_, {})) {
    const std::string what = s.to_step < 0 ? "straggler: rank " : "keeps pace again: rank ";
    trace->add_note(std::chrono::duration<double, std::micro>(at - t0).count(), what + std::to_string(s.rank),
                    to_json(s));
  }
}

}  // namespace dsgd::runtime
