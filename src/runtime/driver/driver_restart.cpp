// A driver that restarts in place (runtime/driver/driver_restart.h).
#include "runtime/driver/driver_restart.h"

#include <unistd.h>

#include <algorithm>

#include "dsgd/common/error.h"
#include "control/log.h"
#include "runtime/checkpoint/sharded_checkpoint.h"
#include "runtime/driver/checkpoint.h"
#include "runtime/driver/job.h"

namespace dsgd::runtime {

std::optional<DriverState> DriverRestart::open(const proto::JobSpec& job) {
  auto& config = job_.config;
  if (config.recovery.driver_state_dir.empty()) return std::nullopt;
  // Its snapshots go to disk: what a driver started again in its place goes on from.
  if (config.checkpoints.dir.empty()) config.checkpoints.dir = config.recovery.driver_state_dir + "/checkpoints";
  file_ = std::make_unique<DriverStateFile>(config.recovery.driver_state_dir);
  fingerprint_ = job_fingerprint(job);
  return file_->resumable(fingerprint_);
}

void DriverRestart::start_server(control::DriverServerOptions* so, const std::optional<DriverState>& previous) {
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
    job_.server = control::DriverServer::start(*so);
  } catch (const CommError& e) {
    if (!previous) throw;
    throw CommError(std::string(e.what()) + ": the job's workers call its driver at " + previous->address +
                        " (recorded in " + file_->path() + "); free that port and start this driver again",
                    e.op());
  }
}

void DriverRestart::save() {
  if (!file_) return;
  DriverState s;
  s.job = fingerprint_;
  s.driver_pid = ::getpid();
  s.address = job_.address;
  s.token = job_.secrets.token;
  s.tls_keys = job_.secrets.tls;
  s.generation = job_.generation;
  s.restarts = restarts_;
  s.next_spawn_index = job_.pool->next_spawn_index();
  s.signature = job_.signature;
  s.parameters = job_.parameters;
  const auto workers = job_.server->workers();
  for (const auto& k : job_.pool->kept()) {
    const auto& w = workers.at(static_cast<size_t>(k.id));
    s.workers.push_back({k.id, k.spawn_index, w.pid, k.pid > 0, w.host, w.address, k.pseudo_host, k.member});
  }
  s.checkpoint = checkpoint_;
  s.checkpoint_steps = checkpoint_steps_;
  s.first_epoch = first_epoch_;
  s.batches_per_epoch = checkpoint_bpe_;
  try {
    file_->write(s);
  } catch (const DataError& e) {
    control::log().warn("trainer: {}; the job goes on, but a driver started again with {} would find the state "
                        "of an earlier point (or none)",
                        e.what(), job_.config.recovery.driver_state_dir);
  }
}

void DriverRestart::touch() const {
  if (file_) file_->touch();
}

void DriverRestart::ended() {
  if (!file_) return;
  try {
    file_->write_ended();
  } catch (const std::exception& e) {
    control::log().warn("trainer: {}", e.what());
  }
}

void DriverRestart::checkpoint_written(const std::string& path, int64_t steps, int64_t batches_per_epoch) {
  checkpoint_ = path;
  checkpoint_steps_ = steps;
  if (batches_per_epoch > 0) checkpoint_bpe_ = batches_per_epoch;
  save();
}

void DriverRestart::loaded(const std::string& path, int64_t epoch) {
  if (!file_) return;
  first_epoch_ = epoch;
  checkpoint_ = path;
  checkpoint_steps_ = job_.steps_done;
  save();
}

namespace {

// Checkpoint directory `dir` as the state the driver holds: a sharded one read whole into this
// driver's local replica.
Checkpoint read_whole(const std::string& dir, JobState& state) {
  if (!is_sharded_checkpoint(dir)) return read_checkpoint(dir);
  Checkpoint c;
  c.header = read_manifest(dir).at("header");
  c.state = state.whole_state(dir, &c.feedback);
  return c;
}

// The checkpoint a restart goes on from: the one the state names (a save the old driver had
// loaded among them), else (gone, damaged) the newest intact one in the job's checkpoint root.
Checkpoint checkpoint_to_resume(const DriverState& prev, const std::string& root, JobState& state,
                                std::string* path) {
  try {
    if (prev.checkpoint.empty()) throw DataError(root, "the driver's state names no checkpoint");
    *path = checkpoint_candidates(prev.checkpoint).front();
    return read_whole(*path, state);
  } catch (const DataError& e) {
    control::log().warn("trainer: cannot go on from the checkpoint the driver's state names ({}); trying the newest "
                        "in {}",
                        e.what(), root);
  }
  return load_first_intact(
      root,
      [&](const std::string& dir) {
        *path = dir;
        return read_whole(dir, state);
      },
      [](const std::string& s) { control::log().warn("trainer: passed over a damaged checkpoint: {}", s); });
}

}  // namespace

void DriverRestart::adopt_workers(const DriverState& prev) {
  std::vector<WorkerPool::Kept> kept;  // the server knows them already (start_server)
  for (const auto& w : prev.workers) {
    kept.push_back({static_cast<int>(w.id), w.spawn_index, w.started ? static_cast<pid_t>(w.pid) : 0, w.pseudo_host,
                    w.member});
  }
  job_.pool->adopt(kept, prev.next_spawn_index);
}

DriverRestart::Survivors DriverRestart::survivors_past(const std::vector<int>& lost, int64_t epoch, int64_t batch) {
  std::vector<int> ids;
  for (int id : job_.pool->members()) {
    if (std::find(lost.begin(), lost.end(), id) == lost.end()) ids.push_back(id);
  }
  Survivors out;
  const int64_t per_epoch = std::max<int64_t>(1, checkpoint_bpe_);
  const auto replies = job_.raw_call(command(&proto::Command::mutable_position), ids);
  for (size_t i = 0; i < replies.size(); ++i) {
    const proto::Position& p = replies[i].position();
    out.steps = std::max(out.steps, (p.epoch() - epoch) * per_epoch + p.batch() - batch);
    const std::pair<int64_t, int64_t> at{p.epoch(), p.batch()};
    out.together = !p.torn() && (i == 0 || (out.together && at == out.at));
    out.at = at;
  }
  return out;
}

void DriverRestart::go_on_from_members(const Survivors& members, PhaseClock* clock) {
  Donor all;  // every member holds the state to go on with: nobody is sent one
  all.id = job_.pool->members().at(0);
  all.at = members.at;
  all.current = job_.pool->members();
  job_.group.form({}, clock, &all);
  job_.steps_done += members.steps;
  // The point they stand at is the snapshot now, and on disk what a later restart goes on from.
  job_.state.take();
  job_.checkpoints.persist(members.at.first, members.at.second, checkpoint_bpe_);
  clock->mark("snapshot");
}

namespace {

// What a driver's restart records: the lost one's pid, and since its last sign of life (its
// last touch of its state) as detect_s.
RecoveryEvent restart_event(const DriverState& prev, std::chrono::steady_clock::time_point started) {
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

bool DriverRestart::resume(const DriverState& prev, Clock::time_point started) {
  auto& server = *job_.server;
  auto& pool = *job_.pool;
  Checkpoint c;
  try {
    c = checkpoint_to_resume(prev, job_.config.checkpoints.dir, job_.state, &checkpoint_);
  } catch (const DataError& e) {
    if (!prev.checkpoint.empty()) throw;  // it wrote one, now gone or damaged: not to be passed over
    control::log().warn("trainer: the job's lost driver (pid {}) had written no checkpoint yet ({}): nothing to go on "
                        "from, so the job starts anew (its old workers, refused, exit)",
                        prev.driver_pid, e.what());
    for (int id : server.alive()) server.evict(id, "the job starts anew");
    checkpoint_.clear();
    return false;
  }
  RecoveryEvent ev = restart_event(prev, started);
  restarts_ = prev.restarts + 1;
  job_.signature = prev.signature;
  job_.parameters = prev.parameters;
  first_epoch_ = prev.first_epoch;
  checkpoint_steps_ = job_.steps_done = prev.checkpoint_steps;
  checkpoint_bpe_ = prev.batches_per_epoch;
  const int64_t epoch = c.header.value("epoch", int64_t{0}), batch = c.header.value("batch", int64_t{0});
  restarted_at_ = JobPosition{epoch, batch, job_.steps_done, first_epoch_};
  control::log().warn("trainer: taking up the job of driver pid {} ({} worker(s) to adopt) from {} (epoch {}, batch "
                      "{}, step {})",
                      prev.driver_pid, prev.workers.size(), checkpoint_, epoch, batch, job_.steps_done);
  adopt_workers(prev);
  // Beyond any generation the old driver may have formed without saying so; whatever the workers
  // still do in theirs ends.
  job_.generation = prev.generation + 1;
  server.abort_generation(job_.generation);
  Phases phases = {{"start", std::chrono::duration<double>(Clock::now() - started).count()}};
  PhaseClock clock(&phases);
  std::vector<int> lost;
  std::string gone = "did not wait for the driver's restart";
  try {
    const double detect_s = ev.detect_s;
    lost = job_.recovery.drain(started, &ev);  // those that call in answer; the others fall silent
    ev.detect_s = detect_s;
  } catch (const std::exception& e) {  // nobody answered at all
    gone = e.what();
    lost = pool.members();
  }
  clock.mark("drain");
  ev.lost.clear();
  for (int id : lost) {
    const auto w = server.workers().at(static_cast<size_t>(id));
    ev.lost += (ev.lost.empty() ? "" : ", ") + fmt::format("worker {} (host {}, pid {})", id, w.host, w.pid);
  }
  const bool none_back = lost.size() == pool.members().size();
  const Survivors past = none_back ? Survivors{} : survivors_past(lost, epoch, batch);  // unknown without them
  ev.rolled_back_steps = past.steps;
  ev.at_step = job_.steps_done + past.steps;
  job_.state.set(std::move(c.state), std::move(c.feedback));
  // Every member back, at one step's end, their whole state in them: they go on from there, and
  // nothing is trained again (recovery.from_peer's rule; the checkpoint's steps per epoch known,
  // to name the new one).
  if (lost.empty() && past.together && job_.config.recovery.from_peer && job_.recovery.replicas_hold_whole_state() &&
      checkpoint_bpe_ > 0) {
    job_.recovering([&] { go_on_from_members(past, &clock); });
    ev.from_peer = true;
    ev.rolled_back_steps = 0;
    restarted_at_ = JobPosition{past.at.first, past.at.second, job_.steps_done, first_epoch_};
  } else if (none_back && pool.ready().empty()) {
    restart_without_workers("none of the old driver's workers answered (" + gone + ")");
  } else {
    job_.recovering([&] {
      job_.recovery.replace_lost(lost, gone, &ev);
      clock.mark("replace");
      job_.group.form({}, &clock);
    });
  }
  ev.phases = std::move(phases);
  resumed(std::move(ev), started, none_back);
  return true;
}

void DriverRestart::resumed(RecoveryEvent ev, Clock::time_point started, bool none_back) {
  ev.resumed_at = Clock::now();
  ev.recovery_s = ev.detect_s + std::chrono::duration<double>(ev.resumed_at - started).count();
  ev.caught_up_s = ev.recovery_s;
  ev.workers_after = static_cast<int>(job_.pool->members().size());
  control::log().warn(
      "trainer: the job goes on with {} worker(s) {:.2f} s after this driver's start ({:.2f} s since the old one was "
      "last seen), from step {}: {}{}",
      ev.workers_after, ev.recovery_s - ev.detect_s, ev.recovery_s, job_.steps_done,
      none_back ? std::string("the steps the lost workers had trained past it are trained again")
                : fmt::format("{} step(s) trained again", ev.rolled_back_steps),
      ev.lost.empty() ? std::string() : "; lost " + ev.lost);
  job_.monitor.record_event("driver_restart", ev.failure);
  if (job_.config.on_recovery) job_.config.on_recovery(ev);
  job_.recovery.add_start_event(std::move(ev));
  save();
}

void DriverRestart::restart_without_workers(const std::string& why) {
  control::log().warn("trainer: {}; starting the job's workers again", why);
  std::string state = job_.state.snapshot();
  Feedback feedback = job_.state.feedback();
  for (int id : job_.server->alive()) job_.server->evict(id, why);
  ++job_.generation;  // the adopted workers' was aborted
  const std::string sig = job_.signature;
  if (job_.pool->spawns()) {
    job_.pool->restart();
  } else {
    control::log().info("driver: waiting for {} worker(s): start each with --dsgd-worker --driver {} --token ...",
                        job_.config.num_workers, job_.address);
  }
  job_.group.start_up();
  if (job_.signature != sig) {
    throw ConfigError("the restarted workers built another model than the job's (its checkpoint's): start the "
                      "same build and settings");
  }
  job_.state.set(std::move(state), std::move(feedback));
  job_.recovering([&] { job_.state.restore(); });
}

}  // namespace dsgd::runtime
