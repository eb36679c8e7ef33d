// The recovery from a lost worker, and growing back between chunks (runtime/driver/recovery.h).
#include "runtime/driver/recovery.h"

#include <algorithm>
#include <thread>

#include "dsgd/common/error.h"
#include "control/log.h"
#include "runtime/driver/job.h"

namespace dsgd::runtime {

using std::chrono::milliseconds;
using json = nlohmann::json;

namespace {

// A failure the trainer can recover from by re-forming the job (a lost worker, a broken group).
bool recoverable(const std::exception& e) { return dynamic_cast<const CommError*>(&e) != nullptr; }

}  // namespace

Recovery::Recovery(Job& job) : job_(job), failures_(job.config.recovery) {}

void Recovery::recover_or_rethrow(const std::exception& e) {
  if (!recoverable(e)) {
    job_.broken = true;
    job_.server->stop_workers();
    throw;
  }
  recover(e.what());
}

void Recovery::move_to_start_up() {
  for (auto& ev : events_) {
    ev.failure += " (during start-up)";
    start_events_.push_back(std::move(ev));
  }
  events_.clear();
}

void Recovery::recover(std::string failure) {
  const auto detected = Clock::now();
  std::vector<std::pair<std::string, double>> phases;  // of every attempt
  bool from_peer = true;
  const int64_t replayed = job_.state.policy().pending();  // steps of calls that returned: replay()'s
  const auto& config = job_.config;
  while (true) {
    if (!failures_.admit(failure)) job_.fail(failures_.exhausted());
    control::log().warn("trainer: {}; recovering ({})", failure, failures_.position());
    if (config.on_recovery) {
      RecoveryEvent start;
      start.failure = failure;
      start.detected_at = detected;
      config.on_recovery(start);
    }
    try {
      RecoveryEvent ev = reform(failure, &phases, detected, &from_peer);
      ev.detected_at = detected;
      ev.resumed_at = Clock::now();
      ev.recovery_s = ev.detect_s + std::chrono::duration<double>(ev.resumed_at - detected).count();
      ev.phases = std::move(phases);
      ev.caught_up_s = ev.recovery_s;  // until the chunk's end settles it (note_caught_up)
      std::string where;
      for (const auto& [name, s] : ev.phases) where += fmt::format("{}{} {:.2f}", where.empty() ? "" : ", ", name, s);
      const std::string from = ev.from_peer ? std::string("from a survivor's state, nothing rolled back")
                                            : fmt::format("from the snapshot, {} step(s) trained again",
                                                          ev.rolled_back_steps);
      control::log().warn("trainer: recovered in {:.2f} s (unnoticed {:.2f}, {}) with {} worker(s){}, {}; lost {}",
                          ev.recovery_s, ev.detect_s, where, ev.workers_after,
                          ev.standbys_used > 0 ? " (a standby took over)" : "", from, ev.lost);
      if (config.on_recovery) config.on_recovery(ev);
      job_.monitor.record_event("recovery",
                                fmt::format("{} (recovered in {:.2f} s with {} workers{})", failure, ev.recovery_s,
                                            ev.workers_after, ev.standbys_used > 0 ? ", a standby took over" : ""));
      // From the snapshot, the chunk's steps done before the loss are trained again by its retry
      // (the steps of earlier chunks were replayed within the recovery).
      const int64_t redo = ev.from_peer || job_.chunks.in_flight() == 0 ? 0 : ev.rolled_back_steps - replayed;
      if (redo > 0) job_.chunks.redo(events_.size(), redo);
      events_.push_back(std::move(ev));
      job_.monitor.publish();
      return;
    } catch (const std::exception& e) {
      if (!recoverable(e)) {
        job_.broken = true;
        job_.server->stop_workers();
        throw;
      }
      // Lost another worker while re-forming: go round again (it counts as a failure).
      failure = e.what();
    }
  }
}

RecoveryEvent Recovery::reform(const std::string& failure, Phases* phases, Clock::time_point detected,
                               bool* from_peer) {
  PhaseClock clock(phases);
  auto& pool = job_.pool;
  // New processes (local mode) start once the group trains again (header: hold_spawns).
  pool->hold_spawns(true);
  struct Release {
    runtime::WorkerPool* held;
    ~Release() {
      held->hold_spawns(false);
      try {
        held->spawn_replacements();
      } catch (const std::exception& e) {  // the next tick tries again
        control::log().warn("trainer: no replacement started after the recovery: {}", e.what());
      }
    }
  } release{pool.get()};
  RecoveryEvent ev;
  ev.failure = failure;
  ev.at_step = job_.steps_done;
  job_.server->abort_generation(job_.generation);
  job_.group.announce_to_servers("pending");  // a shard started now waits for the next generation
  pool->spawn_servers();                       // replaces lost shard processes (local mode)
  const std::vector<int> lost = drain(detected, &ev);
  job_.stragglers.clear_evicting();
  const std::optional<Donor> donor = find_donor(lost, *from_peer, &ev);
  clock.mark("drain");
  replace_lost(lost, failure, &ev);
  pool->spawn_servers();  // shard processes lost meanwhile
  clock.mark("replace");
  if (donor) {
    ev.from_peer = true;
    ev.rolled_back_steps = 0;
  } else {
    *from_peer = false;
    job_.chunks.resume(0, false);  // the snapshot's position, replayed to the chunk's start
  }
  job_.group.form({}, &clock, donor ? &*donor : nullptr);
  ev.workers_after = static_cast<int>(pool->members().size());
  return ev;
}

std::optional<Donor> Recovery::find_donor(const std::vector<int>& lost, bool allowed, RecoveryEvent* ev) {
  const bool eligible = allowed && job_.config.recovery.from_peer && replicas_hold_whole_state();
  const bool between_calls = job_.chunks.in_flight() == 0;
  if ((between_calls && !(eligible && job_.members_settled)) || job_.state.snapshot().empty()) return std::nullopt;
  std::vector<int> survivors;
  for (int id : job_.pool->members()) {
    if (std::find(lost.begin(), lost.end(), id) == lost.end()) survivors.push_back(id);
  }
  if (survivors.empty()) return std::nullopt;
  const auto replies = job_.raw_call(command(&proto::Command::mutable_position), survivors);
  Donor d;
  std::vector<std::pair<int64_t, int64_t>> at;
  int torn = -1;
  for (size_t i = 0; i < replies.size(); ++i) {
    const proto::Position& p = replies[i].position();
    if (p.torn()) torn = survivors[i];
    at.emplace_back(p.epoch(), p.batch());
    if (d.id < 0 || at.back() > d.at) d.id = survivors[i], d.at = at.back();
  }
  for (size_t i = 0; i < at.size(); ++i) {
    if (at[i] == d.at) d.current.push_back(survivors[i]);
  }
  if (between_calls) {  // the last call left every member at one position
    if (d.current.size() != survivors.size() || torn >= 0) return std::nullopt;
    return d;
  }
  const auto start = job_.chunks.start();
  const int64_t size = job_.chunks.size();
  d.kept = d.at.first == start.first ? d.at.second - start.second : -1;
  if (d.kept > 0) ev->rolled_back_steps = std::max(ev->rolled_back_steps, job_.state.policy().pending() + d.kept);
  // A chunk ends at its size or at the epoch's end, whichever comes first.
  d.completed = (size > 0 && d.kept >= size) || (d.at.first == start.first + 1 && d.at.second == 0);
  if (!eligible || (d.kept < 0 && !d.completed)) return std::nullopt;
  if (torn >= 0) {
    control::log().info("trainer: worker {} stopped part-way through a step's update: the snapshot it is", torn);
    return std::nullopt;
  }
  if (d.completed) d.kept = 0;  // the replies count its steps
  return d;
}

bool Recovery::replicas_hold_whole_state() const {
  const auto& c = job_.config;
  return c.devices_per_worker == 1 && (c.strategy == Strategy::kAllreduce || c.strategy == Strategy::kSimple) &&
         c.step.zero_stage == 0 && c.comm.compression == Compression::kNone && c.comm.forward_overlap_buckets == 0;
}

std::vector<int> Recovery::drain(Clock::time_point detected, RecoveryEvent* ev) {
  // Wait until every live worker is idle (answers a ping) or known lost (exited or silent for
  // the heartbeat timeout). Survivors fail their aborted command within moments, or, where it
  // waits in a group's formation for a process that is gone, at its comm_timeout.
  std::vector<int> lost;
  const auto& config = job_.config;
  auto& pool = job_.pool;
  const uint64_t chunk_in_flight = job_.chunks.in_flight();
  const int64_t pending = job_.state.policy().pending();
  const auto deadline =
      Clock::now() + std::max(config.recovery.heartbeat_timeout, config.comm.timeout) + milliseconds(2000);
  while (true) {
    try {  // a process a survivor saw exit is known gone now, not at the ping's tick
      pool->check_children();
    } catch (const CommError&) {  // a member's exit: pool->exited() says so below, as after the tick's
    }
    for (const auto& w : job_.server->workers()) {
      if (!w.alive || !pool->is_member(static_cast<int>(w.index)) ||
          std::find(lost.begin(), lost.end(), w.index) != lost.end()) {
        continue;
      }
      const bool exited = pool->exited(static_cast<int>(w.index));
      const bool silent = w.since_heartbeat_s * 1000 > static_cast<double>(config.recovery.heartbeat_timeout.count());
      const bool evicted = job_.stragglers.evicting(static_cast<int>(w.index));
      if (!exited && !silent && !evicted) continue;
      lost.push_back(static_cast<int>(w.index));
      json p = json::parse(w.progress.empty() ? "{}" : w.progress, nullptr, false);
      ev->lost += (ev->lost.empty() ? "" : ", ") + std::string("worker ") + std::to_string(w.index) + " (host " +
                  w.host + ", pid " + std::to_string(w.pid) +
                  (exited ? ", exited" : silent ? ", silent" : ", evicted as a straggler") + ")";
      // Steps of the chunk in flight, as the worker last told them; none where it last spoke of
      // another (a worker lost between two calls: that chunk's steps are pending()).
      const bool current = chunk_in_flight != 0 && p.is_object() && p.value("chunk", uint64_t{0}) == chunk_in_flight;
      if (p.is_object()) {
        const int64_t batches = current ? p.value("batches", int64_t{0}) : 0;
        ev->rolled_back_steps = std::max(ev->rolled_back_steps, pending + batches);
        ev->at_step = std::max(ev->at_step, job_.steps_done + batches);
      }
      // Silent: it failed after its last heartbeat. Exited (local mode): also after the last
      // time every child was seen running, at most a tick (~100 ms) before the detection.
      const double since_detected = std::chrono::duration<double>(Clock::now() - detected).count();
      double unnoticed = std::max(0.0, w.since_heartbeat_s - since_detected);
      if (exited) {
        unnoticed = std::min(unnoticed,
                             std::max(0.0, std::chrono::duration<double>(detected - pool->all_running_at()).count()));
      }
      ev->detect_s = std::max(ev->detect_s, unnoticed);
    }
    std::vector<int> survivors;
    for (int id : pool->members()) {
      if (std::find(lost.begin(), lost.end(), id) == lost.end()) survivors.push_back(id);
    }
    try {
      if (!survivors.empty()) job_.raw_call(command(&proto::Command::mutable_ping), survivors, {}, milliseconds(1000));
      return lost;
    } catch (const std::exception&) {
      if (Clock::now() > deadline) throw;
    }
  }
}

void Recovery::replace_lost(const std::vector<int>& lost, const std::string& failure, RecoveryEvent* ev) {
  // Each lost member's place goes to a ready worker (a standby: same position and pseudo-host,
  // so the job computes what it would have without the loss), else the survivors close ranks.
  const auto& config = job_.config;
  auto& pool = job_.pool;
  pool->tend(job_.generation, job_.signature);  // setups finished meanwhile
  for (int id : lost) {
    job_.server->evict(id, failure);
    if (pool->promote(id)) {
      ++ev->standbys_used;
    } else {
      pool->drop(id);
    }
  }
  // The old way: idle until they are ready, up to replacement_timeout.
  if (config.recovery.wait_for_replacements) take_in_replacements(config.num_workers, false);
  // An elastic job below its floor waits for workers to join (a launcher's restart, a pod's), then fails.
  const int floor = config.recovery.min_workers;
  if (floor > 0 && static_cast<int>(pool->members().size()) < floor) {
    control::log().warn("trainer: {} worker(s) left, below recovery.min_workers {}: waiting up to {} s for more",
                        pool->members().size(), floor,
                        std::chrono::duration_cast<std::chrono::seconds>(config.recovery.replacement_timeout +
                                                                         config.launch.registration_timeout)
                            .count());
    take_in_replacements(floor, true);
    if (static_cast<int>(pool->members().size()) < floor) {
      job_.fail(fmt::format("{} worker(s) left after {}, below recovery.min_workers {}, and none joined in time: "
                            "start more workers, or lower --workers MIN",
                            pool->members().size(), failure, floor));
    }
  }
  if (pool->members().empty()) job_.fail("every worker was lost: " + failure);
}

void Recovery::take_in_replacements(int target, bool whoever_comes) {
  const auto& config = job_.config;
  auto& pool = job_.pool;
  pool->hold_spawns(false);
  pool->spawn_replacements();
  const auto until = Clock::now() + config.recovery.replacement_timeout + config.launch.registration_timeout;
  while (static_cast<int>(pool->members().size() + pool->ready().size()) < target &&
         (whoever_comes || pool->replacements_pending() || pool->preparing()) && Clock::now() < until) {
    pool->check_children();
    pool->tend(job_.generation, job_.signature);
    std::this_thread::sleep_for(milliseconds(20));
  }
  pool->add_members(pool->first_ready(static_cast<size_t>(config.num_workers) - pool->members().size()));
}

std::optional<RecoveryEvent> Recovery::scale_up() {
  // Between calls too, not only on a call's ticks (every 100 ms: a call of a few fast steps has
  // none): lost processes reaped, standbys and new workers set up and started.
  auto& pool = job_.pool;
  const int num_workers = job_.config.num_workers;
  pool->check_children();
  pool->tend(job_.generation, job_.signature);
  if (static_cast<int>(pool->members().size()) >= num_workers) return std::nullopt;
  auto joining = pool->first_ready(static_cast<size_t>(num_workers) - pool->members().size());
  if (joining.empty()) return std::nullopt;
  const auto t0 = Clock::now();
  RecoveryEvent ev;
  ev.kind = "scale_up";
  job_.state.take();  // the members' state now (a worker function may have changed it)
  job_.group.form(joining);
  ev.workers_after = static_cast<int>(pool->members().size());
  ev.resumed_at = Clock::now();
  ev.recovery_s = std::chrono::duration<double>(ev.resumed_at - t0).count();
  pool->reset_backoff();
  control::log().info("trainer: back to {} worker(s) in {:.2f} s", pool->members().size(), ev.recovery_s);
  return ev;
}

void Recovery::try_scale_up() {
  try {
    if (auto ev = scale_up()) {
      if (job_.config.on_recovery) job_.config.on_recovery(*ev);
      events_.push_back(std::move(*ev));
    }
  } catch (const std::exception& e) {
    recover_or_rethrow(e);
  }
}

}  // namespace dsgd::runtime
