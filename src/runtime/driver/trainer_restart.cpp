// A driver that restarts in place (TrainerConfig::recovery.driver_state_dir): what a driver keeps
// on disk as the job goes (runtime/driver/driver_state.h), and how a driver started again with
// it takes the job up: the old driver's workers, which waited for it (recovery.driver_grace),
// are adopted under their old ids, those that did not wait are evicted and replaced as after any
// loss, and the group is re-formed under a new generation: the workers go on from where they
// stand where every one came back at one step's end, else from the newest checkpoint.
#include <unistd.h>

#include <algorithm>

#include "dsgd/common/error.h"
#include "control/log.h"
#include "runtime/driver/checkpoint.h"
#include "runtime/driver/trainer_impl.h"

namespace dsgd {

std::optional<runtime::DriverState> Trainer::Impl::open_driver_state(const proto::JobSpec& job) {
  if (config.recovery.driver_state_dir.empty()) return std::nullopt;
  // Its snapshots go to disk: what a driver started again in its place goes on from.
  if (config.checkpoints.dir.empty()) config.checkpoints.dir = config.recovery.driver_state_dir + "/checkpoints";
  driver_state = std::make_unique<runtime::DriverStateFile>(config.recovery.driver_state_dir);
  job_fingerprint = runtime::job_fingerprint(job);
  return driver_state->resumable(job_fingerprint);
}

void Trainer::Impl::start_server(control::DriverServerOptions* so,
                                 const std::optional<runtime::DriverState>& previous) {
  // Beyond any command number the drivers before it used: a worker's late result of theirs is
  // never taken for an answer of this one's.
  if (previous) {
    so->first_command_id = static_cast<uint64_t>(previous->restarts + 1) << 40;
    for (const auto& w : previous->workers) {  // known from the server's first call on
      control::WorkerInfo i;
      i.index = w.id;
      i.host = w.host;
      i.address = w.address;
      i.pid = w.pid;
      i.spawn_index = w.spawn_index;
      so->adopted.push_back(i);
    }
  }
  try {
    server = control::DriverServer::start(*so);
  } catch (const CommError& e) {
    if (!previous) throw;
    throw CommError(std::string(e.what()) + ": the job's workers call its driver at " + previous->address +
                        " (recorded in " + driver_state->path() + "); free that port and start this driver again",
                    e.op());
  }
}

void Trainer::Impl::save_driver_state() {
  if (!driver_state) return;
  runtime::DriverState s;
  s.job = job_fingerprint;
  s.driver_pid = ::getpid();
  s.address = listen_address;
  s.token = token;
  s.tls_keys = tls_line;
  s.generation = generation;
  s.restarts = driver_restarts;
  s.next_spawn_index = pool->next_spawn_index();
  s.signature = signature;
  s.parameters = parameters;
  const auto workers = server->workers();
  for (const auto& k : pool->kept()) {
    const auto& w = workers.at(static_cast<size_t>(k.id));
    s.workers.push_back({k.id, k.spawn_index, w.pid, k.pid > 0, w.host, w.address, k.pseudo_host, k.member});
  }
  s.checkpoint = restart_checkpoint;
  s.checkpoint_steps = checkpoint_steps;
  s.first_epoch = first_epoch;
  s.batches_per_epoch = checkpoint_bpe;
  try {
    driver_state->write(s);
  } catch (const DataError& e) {
    control::log().warn("trainer: {}; the job goes on, but a driver started again with {} would find the state "
                        "of an earlier point (or none)",
                        e.what(), config.recovery.driver_state_dir);
  }
}

namespace {

// The checkpoint a restart goes on from: the one the state names, else (gone, damaged) the newest
// intact one in the job's checkpoint root.
runtime::Checkpoint checkpoint_to_resume(const runtime::DriverState& prev, const std::string& root,
                                         std::string* path) {
  std::vector<std::string> skipped;
  try {
    if (prev.checkpoint.empty()) throw DataError(root, "the driver's state names no checkpoint");
    *path = prev.checkpoint;
    return runtime::read_checkpoint_at(prev.checkpoint, &skipped);
  } catch (const DataError& e) {
    control::log().warn("trainer: cannot go on from the checkpoint the driver's state names ({}); trying the newest "
                        "in {}",
                        e.what(), root);
  }
  *path = root;
  auto c = runtime::read_latest_checkpoint(root, &skipped);
  for (const auto& s : skipped) control::log().warn("trainer: passed over a damaged checkpoint: {}", s);
  return c;
}

}  // namespace

void Trainer::Impl::adopt_workers(const runtime::DriverState& prev) {
  std::vector<runtime::WorkerPool::Kept> kept;  // the server knows them already (start_server)
  for (const auto& w : prev.workers) {
    kept.push_back({static_cast<int>(w.id), w.spawn_index, w.started ? static_cast<pid_t>(w.pid) : 0, w.pseudo_host,
                    w.member});
  }
  pool->adopt(kept, prev.next_spawn_index);
}

Trainer::Impl::Survivors Trainer::Impl::survivors_past(const std::vector<int>& lost, int64_t epoch, int64_t batch) {
  std::vector<int> ids;
  for (int id : pool->members()) {
    if (std::find(lost.begin(), lost.end(), id) == lost.end()) ids.push_back(id);
  }
  Survivors out;
  const int64_t per_epoch = std::max<int64_t>(1, checkpoint_bpe);
  const auto replies = raw_call(command(&proto::Command::mutable_position), ids);
  for (size_t i = 0; i < replies.size(); ++i) {
    const proto::Position& p = replies[i].position();
    out.steps = std::max(out.steps, (p.epoch() - epoch) * per_epoch + p.batch() - batch);
    const std::pair<int64_t, int64_t> at{p.epoch(), p.batch()};
    out.together = !p.torn() && (i == 0 || (out.together && at == out.at));
    out.at = at;
  }
  return out;
}

void Trainer::Impl::go_on_from_members(const Survivors& members, PhaseClock* clock) {
  Donor all;  // every member holds the state to go on with: nobody is sent one
  all.id = pool->members().at(0);
  all.at = members.at;
  all.current = pool->members();
  form_group({}, clock, &all);
  steps_done += members.steps;
  // The point they stand at is the snapshot now, and on disk what a later restart goes on from.
  take_snapshot();
  persist_snapshot(members.at.first, members.at.second, checkpoint_bpe);
  clock->mark("snapshot");
}

namespace {

// What a driver's restart records: the lost one's pid, and since its last sign of life (its
// last touch of its state) as detect_s.
RecoveryEvent restart_event(const runtime::DriverState& prev, std::chrono::steady_clock::time_point started) {
  RecoveryEvent ev;
  ev.kind = "driver_restart";
  ev.failure = "the job's driver (pid " + std::to_string(prev.driver_pid) + ") was lost; driver pid " +
               std::to_string(::getpid()) + " took its place";
  ev.detected_at = started;
  const auto wall_started = std::chrono::system_clock::now() - (std::chrono::steady_clock::now() - started);
  if (prev.last_alive != std::chrono::system_clock::time_point{}) {
    ev.detect_s = std::max(0.0, std::chrono::duration<double>(wall_started - prev.last_alive).count());
  }
  return ev;
}

}  // namespace

bool Trainer::Impl::resume(const runtime::DriverState& prev, Clock::time_point started) {
  runtime::Checkpoint c;
  try {
    c = checkpoint_to_resume(prev, config.checkpoints.dir, &restart_checkpoint);
  } catch (const DataError& e) {
    if (!prev.checkpoint.empty()) throw;  // it wrote one, now gone or damaged: not to be passed over
    control::log().warn("trainer: the job's lost driver (pid {}) had written no checkpoint yet ({}): nothing to go on "
                        "from, so the job starts anew (its old workers, refused, exit)",
                        prev.driver_pid, e.what());
    for (int id : server->alive()) server->evict(id, "the job starts anew");
    restart_checkpoint.clear();
    return false;
  }
  RecoveryEvent ev = restart_event(prev, started);
  driver_restarts = prev.restarts + 1;
  signature = prev.signature;
  parameters = prev.parameters;
  first_epoch = prev.first_epoch;
  checkpoint_steps = steps_done = prev.checkpoint_steps;
  checkpoint_bpe = prev.batches_per_epoch;
  const int64_t epoch = c.header.value("epoch", int64_t{0}), batch = c.header.value("batch", int64_t{0});
  restarted_at = JobPosition{epoch, batch, steps_done, first_epoch};
  control::log().warn("trainer: taking up the job of driver pid {} ({} worker(s) to adopt) from {} (epoch {}, batch "
                      "{}, step {})",
                      prev.driver_pid, prev.workers.size(), restart_checkpoint, epoch, batch, steps_done);
  adopt_workers(prev);
  // Beyond any generation the old driver may have formed without saying so; whatever the workers
  // still do in theirs ends.
  generation = prev.generation + 1;
  server->abort_generation(generation);
  Phases phases = {{"start", std::chrono::duration<double>(Clock::now() - started).count()}};
  PhaseClock clock(&phases);
  std::vector<int> lost;
  std::string gone = "did not wait for the driver's restart";
  try {
    const double detect_s = ev.detect_s;
    lost = drain(started, &ev);  // those that call in answer; the others fall silent
    ev.detect_s = detect_s;
  } catch (const std::exception& e) {  // nobody answered at all
    gone = e.what();
    lost = pool->members();
  }
  clock.mark("drain");
  ev.lost.clear();
  for (int id : lost) {
    const auto w = server->workers().at(static_cast<size_t>(id));
    ev.lost += (ev.lost.empty() ? "" : ", ") + fmt::format("worker {} (host {}, pid {})", id, w.host, w.pid);
  }
  const bool none_back = lost.size() == pool->members().size();
  const Survivors past = none_back ? Survivors{} : survivors_past(lost, epoch, batch);  // unknown without them
  ev.rolled_back_steps = past.steps;
  ev.at_step = steps_done + past.steps;
  snapshot = std::move(c.state);
  snapshot_feedback = std::move(c.feedback);
  snapshots->reset();
  snapshots->resized(snapshot.size());
  // Every member back, at one step's end, their whole state in them: they go on from there, and
  // nothing is trained again (recovery.from_peer's rule; the checkpoint's steps per epoch known,
  // to name the new one).
  if (lost.empty() && past.together && config.recovery.from_peer && replicas_hold_whole_state() &&
      checkpoint_bpe > 0) {
    recovering([&] { go_on_from_members(past, &clock); });
    ev.from_peer = true;
    ev.rolled_back_steps = 0;
    restarted_at = JobPosition{past.at.first, past.at.second, steps_done, first_epoch};
  } else if (none_back && pool->ready().empty()) {
    restart_without_workers("none of the old driver's workers answered (" + gone + ")");
  } else {
    recovering([&] {
      replace_lost(lost, gone, &ev);
      clock.mark("replace");
      form_group({}, &clock);
    });
  }
  ev.phases = std::move(phases);
  resumed(std::move(ev), started, none_back);
  return true;
}

void Trainer::Impl::resumed(RecoveryEvent ev, Clock::time_point started, bool none_back) {
  ev.resumed_at = Clock::now();
  ev.recovery_s = ev.detect_s + std::chrono::duration<double>(ev.resumed_at - started).count();
  ev.caught_up_s = ev.recovery_s;
  ev.workers_after = static_cast<int>(pool->members().size());
  control::log().warn(
      "trainer: the job goes on with {} worker(s) {:.2f} s after this driver's start ({:.2f} s since the old one was "
      "last seen), from step {}: {}{}",
      ev.workers_after, ev.recovery_s - ev.detect_s, ev.recovery_s, steps_done,
      none_back ? std::string("the steps the lost workers had trained past it are trained again")
                : fmt::format("{} step(s) trained again", ev.rolled_back_steps),
      ev.lost.empty() ? std::string() : "; lost " + ev.lost);
  record_event("driver_restart", ev.failure);
  if (config.on_recovery) config.on_recovery(ev);
  start_events.push_back(std::move(ev));
  save_driver_state();
}

void Trainer::Impl::restart_without_workers(const std::string& why) {
  control::log().warn("trainer: {}; starting the job's workers again", why);
  std::string state = snapshot;
  Feedback feedback = snapshot_feedback;
  for (int id : server->alive()) server->evict(id, why);
  ++generation;  // the adopted workers' was aborted
  const std::string sig = signature;
  if (pool->spawns()) {
    pool->restart();
  } else {
    control::log().info("driver: waiting for {} worker(s): start each with --dsgd-worker --driver {} --token ...",
                        config.num_workers, listen_address);
  }
  start_up();
  if (signature != sig) {
    throw ConfigError("the restarted workers built another model than the job's (its checkpoint's): start the "
                      "same build and settings");
  }
  snapshot = std::move(state);
  snapshot_feedback = std::move(feedback);
  recovering([&] { send_state(snapshot, snapshot_feedback); });
}

}  // namespace dsgd
