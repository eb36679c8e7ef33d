// Trainer's snapshots and recovery: the replicas' state kept at consistent points (in memory,
// and on disk with TrainerConfig::checkpoints.dir), the protocol that re-forms the job around a
// lost worker and restores that state (or a survivor's: recovery.from_peer), and growing back to
// num_workers between chunks.
#include <algorithm>
#include <filesystem>
#include <thread>

#include "dsgd/common/error.h"
#include "control/log.h"
#include "runtime/driver/checkpoint.h"
#include "runtime/driver/trainer_impl.h"

namespace dsgd {
namespace {

// A failure the trainer can recover from by re-forming the job (a lost worker, a broken group).
bool recoverable(const std::exception& e) { return dynamic_cast<const CommError*>(&e) != nullptr; }

}  // namespace

void Trainer::Impl::recover_or_rethrow(const std::exception& e) {
  if (!recoverable(e)) {
    broken = true;
    server->stop_workers();
    throw;
  }
  recover(e.what());
}

void Trainer::Impl::recover(std::string failure) {
  const auto detected = Clock::now();
  std::vector<std::pair<std::string, double>> phases;  // of every attempt
  bool from_peer = true;
  const int64_t replayed = snapshots->pending();  // steps of calls that returned: replay()'s
  while (true) {
    if (!failures.admit(failure)) fail(failures.exhausted());
    control::log().warn("trainer: {}; recovering ({})", failure, failures.position());
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
      record_event("recovery", fmt::format("{} (recovered in {:.2f} s with {} workers{})", failure, ev.recovery_s,
                                           ev.workers_after, ev.standbys_used > 0 ? ", a standby took over" : ""));
      // From the snapshot, the chunk's steps done before the loss are trained again by its retry
      // (the steps of earlier chunks were replayed within the recovery).
      const int64_t redo = ev.from_peer || chunk_in_flight == 0 ? 0 : ev.rolled_back_steps - replayed;
      if (redo > 0) catching_up.emplace_back(events.size(), redo);
      events.push_back(std::move(ev));
      publish_gauges();
      return;
    } catch (const std::exception& e) {
      if (!recoverable(e)) {
        broken = true;
        server->stop_workers();
        throw;
      }
      // Lost another worker while re-forming: go round again (it counts as a failure).
      failure = e.what();
    }
  }
}

RecoveryEvent Trainer::Impl::reform(const std::string& failure, Phases* phases, Clock::time_point detected,
                                    bool* from_peer) {
  PhaseClock clock(phases);
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
  ev.at_step = steps_done;
  server->abort_generation(generation);
  announce_to_servers("pending");  // a shard started now waits for the next generation
  pool->spawn_servers();            // replaces lost shard processes (local mode)
  const std::vector<int> lost = drain(detected, &ev);
  evicting.clear();
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
    resumed_in_chunk = 0;  // the snapshot's position, replayed to the chunk's start
    chunk_completed = false;
  }
  form_group({}, &clock, donor ? &*donor : nullptr);
  ev.workers_after = static_cast<int>(pool->members().size());
  return ev;
}

std::optional<Trainer::Impl::Donor> Trainer::Impl::find_donor(const std::vector<int>& lost, bool allowed,
                                                              RecoveryEvent* ev) {
  const bool eligible = allowed && config.recovery.from_peer && replicas_hold_whole_state();
  const bool between_calls = chunk_in_flight == 0;
  if ((between_calls && !(eligible && members_settled)) || snapshot.empty()) return std::nullopt;
  std::vector<int> survivors;
  for (int id : pool->members()) {
    if (std::find(lost.begin(), lost.end(), id) == lost.end()) survivors.push_back(id);
  }
  if (survivors.empty()) return std::nullopt;
  const auto replies = raw_call(command(&proto::Command::mutable_position), survivors);
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
  d.kept = d.at.first == chunk_start.first ? d.at.second - chunk_start.second : -1;
  if (d.kept > 0) ev->rolled_back_steps = std::max(ev->rolled_back_steps, snapshots->pending() + d.kept);
  // A chunk ends at its size or at the epoch's end, whichever comes first.
  d.completed = (chunk_size > 0 && d.kept >= chunk_size) || (d.at.first == chunk_start.first + 1 && d.at.second == 0);
  if (!eligible || (d.kept < 0 && !d.completed)) return std::nullopt;
  if (torn >= 0) {
    control::log().info("trainer: worker {} stopped part-way through a step's update: the snapshot it is", torn);
    return std::nullopt;
  }
  if (d.completed) d.kept = 0;  // the replies count its steps
  return d;
}

bool Trainer::Impl::replicas_hold_whole_state() const {
  const auto& c = config;
  return c.devices_per_worker == 1 && (c.strategy == Strategy::kAllreduce || c.strategy == Strategy::kSimple) &&
         c.step.zero_stage == 0 && c.comm.compression == Compression::kNone && c.comm.forward_overlap_buckets == 0;
}

std::vector<int> Trainer::Impl::drain(Clock::time_point detected, RecoveryEvent* ev) {
  // Wait until every live worker is idle (answers a ping) or known lost (exited or silent for
  // the heartbeat timeout). Survivors fail their aborted command within moments, or, where it
  // waits in a group's formation for a process that is gone, at its comm_timeout.
  std::vector<int> lost;
  const auto deadline =
      Clock::now() + std::max(config.recovery.heartbeat_timeout, config.comm.timeout) + milliseconds(2000);
  while (true) {
    try {  // a process a survivor saw exit is known gone now, not at the ping's tick
      pool->check_children();
    } catch (const CommError&) {  // a member's exit: pool->exited() says so below, as after the tick's
    }
    for (const auto& w : server->workers()) {
      if (!w.alive || !pool->is_member(static_cast<int>(w.index)) ||
          std::find(lost.begin(), lost.end(), w.index) != lost.end()) {
        continue;
      }
      const bool exited = pool->exited(static_cast<int>(w.index));
      const bool silent = w.since_heartbeat_s * 1000 > static_cast<double>(config.recovery.heartbeat_timeout.count());
      const bool evicted = std::find(evicting.begin(), evicting.end(), w.index) != evicting.end();
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
        ev->rolled_back_steps = std::max(ev->rolled_back_steps, snapshots->pending() + batches);
        ev->at_step = std::max(ev->at_step, steps_done + batches);
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
      if (!survivors.empty()) raw_call(command(&proto::Command::mutable_ping), survivors, {}, milliseconds(1000));
      return lost;
    } catch (const std::exception&) {
      if (Clock::now() > deadline) throw;
    }
  }
}

void Trainer::Impl::replace_lost(const std::vector<int>& lost, const std::string& failure, RecoveryEvent* ev) {
  // Each lost member's place goes to a ready worker (a standby: same position and pseudo-host,
  // so the job computes what it would have without the loss), else the survivors close ranks.
  pool->tend(generation, signature);  // setups finished meanwhile
  for (int id : lost) {
    server->evict(id, failure);
    if (pool->promote(id)) {
      ++ev->standbys_used;
    } else {
      pool->drop(id);
    }
  }
  if (config.recovery.wait_for_replacements) {  // the old way: idle until they are ready, up to replacement_timeout
    pool->hold_spawns(false);
    pool->spawn_replacements();
    const auto until = Clock::now() + config.recovery.replacement_timeout + config.launch.registration_timeout;
    while (static_cast<int>(pool->members().size() + pool->ready().size()) < config.num_workers &&
           (pool->replacements_pending() || pool->preparing()) && Clock::now() < until) {
      pool->check_children();
      pool->tend(generation, signature);
      std::this_thread::sleep_for(milliseconds(20));
    }
    pool->add_members(pool->first_ready(static_cast<size_t>(config.num_workers) - pool->members().size()));
  }
  if (pool->members().empty()) fail("every worker was lost: " + failure);
}

void Trainer::Impl::form_group(const std::vector<int>& joining, PhaseClock* clock, const Donor* donor) {
  PhaseClock none(nullptr);
  if (clock == nullptr) clock = &none;
  ++generation;
  pool->add_members(joining);
  const int world = static_cast<int>(pool->members().size()) * config.devices_per_worker;
  if (config.batch_size < world) fail("too few samples per step for the re-formed job");
  server->set_world(generation, world);
  connect_group();
  clock->mark("connect");
  if (donor != nullptr) {
    std::vector<int> behind;  // new members, and survivors a step short of the donor
    for (int id : pool->members()) {
      if (std::find(donor->current.begin(), donor->current.end(), id) == donor->current.end()) behind.push_back(id);
    }
    if (!behind.empty()) share_state(donor->id, behind);
    resumed_in_chunk = donor->kept;
    chunk_completed = donor->completed;
    clock->mark("restore");
    return;
  }
  if (snapshot.empty()) return;  // lost during start-up, before the first snapshot: nothing to restore
  send_state(snapshot, snapshot_feedback);
  clock->mark("restore");
  replay();
  clock->mark("replay");
}

void Trainer::Impl::share_state(int donor, const std::vector<int>& receivers) {
  if (config.strategy != Strategy::kAllreduce) {  // no group broadcast: through the driver
    send_state(fetch_state(donor), {}, receivers);
    return;
  }
  proto::Command c;
  auto* share = c.mutable_share_state();
  share->set_root(static_cast<int64_t>(pool->placement(generation).ranks().at(donor)) * config.devices_per_worker);
  for (int id : receivers) share->add_load(id);
  raw_call(c);
}

void Trainer::Impl::connect_group() {
  std::string attempts;
  for (int attempt = 1;; ++attempt) {
    announce_to_servers(std::to_string(generation));
    try {
      proto::Command connect;
      *connect.mutable_connect()->mutable_placement() = pool->placement(generation);
      raw_call(connect);
      save_driver_state();  // who is in the group now, under which generation
      return;
    } catch (const CommError& e) {
      if (!members_alive()) throw;  // a lost worker: recovery's case
      attempts += "\n  " + std::to_string(attempt) + ". generation " + std::to_string(generation) + ": " + e.what();
      if (attempt == kFormationAttempts) {
        fail("the group did not form in " + std::to_string(attempt) + " attempts, every worker alive:" + attempts);
      }
      control::log().warn("trainer: the group of generation {} did not form: {}; forming it again as generation {}",
                          generation, e.what(), generation + 1);
    }
    // The members still in the failed formation leave it at its deadline at the latest.
    server->abort_generation(generation);
    const auto deadline = Clock::now() + config.comm.timeout + milliseconds(2000);
    while (true) {
      try {
        raw_call(command(&proto::Command::mutable_ping), {}, {}, milliseconds(1000));
        break;
      } catch (const TimeoutError&) {
        if (Clock::now() > deadline || !members_alive()) throw;
      }
    }
    ++generation;
    server->set_world(generation, static_cast<int>(pool->members().size()) * config.devices_per_worker);
  }
}

bool Trainer::Impl::members_alive() {
  pool->check_children();
  for (const auto& w : server->workers()) {
    if (!pool->is_member(static_cast<int>(w.index))) continue;
    const bool silent = w.since_heartbeat_s * 1000 > static_cast<double>(config.recovery.heartbeat_timeout.count());
    if (!w.alive || silent || pool->exited(static_cast<int>(w.index))) return false;
  }
  return true;
}

void Trainer::Impl::replay() {
  const auto to = snapshots->replay_to();
  for (int guard = 0; snapshots->pending() > 0 && guard < 1000; ++guard) {
    const auto at = raw_call(command(&proto::Command::mutable_position), {pool->members().at(0)})[0].position();
    const std::pair<int64_t, int64_t> now{at.epoch(), at.batch()};
    if (now >= to) return;
    // To the end of the epoch (max_batches 0), or to the batch within it.
    const int64_t batches = now.first < to.first ? 0 : to.second - now.second;
    proto::Command train;
    train.mutable_train()->set_max_batches(batches);
    raw_call(train);
  }
}

std::optional<RecoveryEvent> Trainer::Impl::scale_up() {
  // Between calls too, not only on a call's ticks (every 100 ms: a call of a few fast steps has
  // none): lost processes reaped, standbys and new workers set up and started.
  pool->check_children();
  pool->tend(generation, signature);
  if (static_cast<int>(pool->members().size()) >= config.num_workers) return std::nullopt;
  auto joining = pool->first_ready(static_cast<size_t>(config.num_workers) - pool->members().size());
  if (joining.empty()) return std::nullopt;
  const auto t0 = Clock::now();
  RecoveryEvent ev;
  ev.kind = "scale_up";
  take_snapshot();  // the members' state now (a worker function may have changed it)
  form_group(joining);
  ev.workers_after = static_cast<int>(pool->members().size());
  ev.resumed_at = Clock::now();
  ev.recovery_s = std::chrono::duration<double>(ev.resumed_at - t0).count();
  pool->reset_backoff();
  control::log().info("trainer: back to {} worker(s) in {:.2f} s", pool->members().size(), ev.recovery_s);
  return ev;
}

void Trainer::Impl::try_scale_up() {
  try {
    if (auto ev = scale_up()) {
      if (config.on_recovery) config.on_recovery(*ev);
      events.push_back(std::move(*ev));
    }
  } catch (const std::exception& e) {
    recover_or_rethrow(e);
  }
}

std::string Trainer::Impl::read_state(Feedback* feedback) {
  // The optimizer state lives split over the servers (ps) or the replicas (zero): made whole
  // in the member whose state is read.
  if (config.ps.update_on_shards || config.strategy == Strategy::kPsAsync || config.step.zero_stage > 0) {
    proto::Command gather;
    gather.mutable_gather_state()->set_keep(pool->members().at(0));
    raw_call(gather);
  }
  if (feedback != nullptr) {
    feedback->clear();
    if (config.comm.compression != Compression::kNone) {
      for (auto& r : raw_call(command(&proto::Command::mutable_get_feedback))) {
        for (auto& [rank, bytes] : *r.mutable_feedback()->mutable_feedback()) (*feedback)[rank] = std::move(bytes);
      }
    }
  }
  return fetch_state(pool->members().at(0));
}

void Trainer::Impl::take_snapshot(bool before_steps) {
  const auto t0 = Clock::now();
  Feedback feedback;
  snapshot = read_state(&feedback);
  snapshot_feedback = std::move(feedback);
  size_t bytes = snapshot.size();
  for (const auto& [rank, b] : snapshot_feedback) bytes += b.size();
  snapshots->taken(std::chrono::duration<double>(Clock::now() - t0).count(), bytes, before_steps);
  snapshot_s += snapshots->cost_s();
  control::log().debug("trainer: snapshot of {} bytes in {:.3f} s", snapshot.size(), snapshots->cost_s());
}

bool Trainer::Impl::snapshot_or_recover() {
  while (true) {
    try {
      take_snapshot();
      return true;
    } catch (const std::exception& e) {
      recover_or_rethrow(e);
    }
    // From a survivor the members stand where the chunk left them: the snapshot again. From the
    // last snapshot they went back to the chunk's start.
    if (events.empty() || !events.back().from_peer) return false;
  }
}

void Trainer::Impl::flush_snapshot() {
  if (snapshots->pending() > 0) recovering([&] { take_snapshot(); });
}

void Trainer::Impl::persist_snapshot(int64_t epoch, int64_t batch, int64_t batches_per_epoch) {
  if (config.checkpoints.dir.empty()) return;
  const auto t0 = Clock::now();
  collect_checkpoints(false);
  if (!checkpoint_writer) {
    checkpoint_writer = std::make_unique<runtime::CheckpointWriter>(config.checkpoints.dir, config.checkpoints.keep);
  }
  auto pickle = call(command(&proto::Command::mutable_get_pickle), true);  // a recovery restores `snapshot`
  const int64_t step = epoch * batches_per_epoch + batch;
  if (checkpoint_writer->busy()) {
    control::log().debug("trainer: checkpoint of step {} waits for the last one's write", step);
  }
  checkpoint_writer->submit({.step = step, .steps_done = steps_done, .batches_per_epoch = batches_per_epoch},
                            {checkpoint_header(epoch, batch), snapshot, snapshot_feedback},
                            std::move(*pickle[0].mutable_pickle()->mutable_pickle()));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  control::log().debug("trainer: checkpoint of step {} handed to its writer in {:.3f} s", step, s);
  snapshot_s += s;
}

void Trainer::Impl::collect_checkpoints(bool wait) {
  if (!checkpoint_writer) return;
  for (const auto& done : checkpoint_writer->take(wait)) {
    const int64_t step = done.job.step;
    if (done.error.empty()) {
      last_checkpoint = done.path;
      control::log().debug("trainer: checkpoint {} written in {:.3f} s", last_checkpoint, done.seconds);
      restart_checkpoint = last_checkpoint;  // a driver's restart goes on from here
      checkpoint_steps = done.job.steps_done;
      if (done.job.batches_per_epoch > 0) checkpoint_bpe = done.job.batches_per_epoch;
      save_driver_state();
      continue;
    }
    if (config.checkpoints.fail_on_write_error) throw DataError(config.checkpoints.dir, done.error);
    ++checkpoint_failures;
    ++checkpoint_failures_total;
    std::error_code ec;
    const auto space = std::filesystem::space(config.checkpoints.dir, ec);
    const double mib = 1.0 / (1 << 20);
    control::log().warn(
        "trainer: checkpoint of step {} NOT written: {} (it takes {:.1f} MiB; {}). Training goes on; the "
        "newest checkpoint on disk is {}; the next snapshot tries again. Make room in {}, or set "
        "checkpoints.fail_on_write_error (--fail-on-checkpoint-error) to stop the job instead",
        step, done.error, static_cast<double>(done.bytes) * mib,
        ec ? std::string("free space unknown") : fmt::format("{:.1f} MiB free there", space.available * mib),
        last_checkpoint.empty() ? std::string("none of this job's") : last_checkpoint, config.checkpoints.dir);
  }
}

int Trainer::ready_standbys() {
  if (!impl_->pool) return 0;
  impl_->pool->tend(impl_->generation, impl_->signature);
  return static_cast<int>(impl_->pool->ready().size());
}

std::pair<int64_t, int64_t> Trainer::Impl::first_member_position() {
  const auto p = call(command(&proto::Command::mutable_position), true)[0].position();
  return {p.epoch(), p.batch()};
}

std::vector<proto::CommandResult> Trainer::Impl::train_chunk(proto::Command* request,
                                                             const std::function<void()>& tick, int64_t* kept) {
  chunk_start = first_member_position();
  chunk_size = request->train().max_batches();
  resumed_in_chunk = 0;
  chunk_completed = false;
  request->mutable_train()->set_chunk(chunk_in_flight = ++chunks_sent);
  auto outs = recovering([&] {
    *kept = resumed_in_chunk;
    if (*kept == 0 && !chunk_completed) return raw_call(*request, {}, tick);
    proto::Command rest = *request;
    if (chunk_completed) rest.mutable_train()->set_results_only(true);
    if (chunk_size > 0 && !chunk_completed) rest.mutable_train()->set_max_batches(chunk_size - *kept);
    return raw_call(rest, {}, tick);
  });
  chunk_in_flight = 0;
  return outs;
}

void Trainer::Impl::note_caught_up(int64_t batches) {
  for (const auto& [i, redo] : catching_up) {
    if (i >= events.size() || batches <= 0) continue;
    auto& ev = events[i];
    const double since = std::chrono::duration<double>(Clock::now() - ev.resumed_at).count();
    ev.caught_up_s = ev.recovery_s + static_cast<double>(redo) * since / static_cast<double>(batches);
  }
  catching_up.clear();
}

void Trainer::Impl::count_kept_steps(Results* r, int64_t kept) const {
  r->metrics["batches"] += static_cast<double>(kept);
  if (r->metrics.count("num_samples")) r->metrics["num_samples"] += static_cast<double>(kept * config.batch_size);
}

}  // namespace dsgd
