// The communication group of the job's members: the start-up and each generation
// (runtime/driver/group_formation.h).
#include "runtime/driver/group_formation.h"

#include <algorithm>
#include <sstream>

#include "dsgd/common/error.h"
#include "control/log.h"
#include "runtime/driver/job.h"
#include "runtime/driver/memory_check.h"
#include "runtime/worker/ps_server_process.h"

namespace dsgd::runtime {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

void GroupFormation::start_up() {
  // A lone worker without a standby has no survivor to recover with: lost after set-up too, the
  // driver that starts its workers starts it again.
  const auto& config = job_.config;
  const bool alone = job_.pool->spawns() && config.num_workers == 1 && config.recovery.standby_workers == 0;
  while (true) {
    while (!set_up_members()) {
    }
    try {
      form_first_group(/*recover=*/!alone);
      break;
    } catch (const CommError& e) {
      if (!alone) throw;
      restart_every_worker(e.what());
    }
  }
  job_.recovery.move_to_start_up();
}

void GroupFormation::form_first_group(bool recover) {
  // Every replica is set up: a worker lost from here on is an ordinary recovery (a standby takes
  // its place, or the survivors go on), nothing to roll back. Lost before the first snapshot,
  // the re-formed group has nothing to restore yet, and the snapshot is taken again.
  try {
    connect();
  } catch (const std::exception& e) {
    if (!recover) throw;
    job_.recovery.recover_or_rethrow(e);
  }
  const auto give_out = [&] {
    auto& state = job_.state;
    state.take(/*before_steps=*/true);
    // Replicas that set up unequal (an operator's own randomness) all take the first's state; equal
    // ones are left as they are, which spares each worker a copy of its state and its load.
    if ((job_.pool->members().size() > 1 || job_.config.devices_per_worker > 1) && !start_equal_)
      state.send(state.snapshot(), state.feedback());
  };
  if (recover) {
    job_.recovering(give_out);
  } else {
    give_out();
  }
}

bool GroupFormation::set_up_members() {
  auto& pool = *job_.pool;
  try {
    job_.server->wait_registered(
        job_.config.launch.registration_timeout, [&] { pool.check_children(); }, pool.initial_count());
    pool.choose_members();  // an elastic start (recovery.min_workers): whoever came, up to num_workers
    job_.server->set_world(job_.generation, static_cast<int>(pool.members().size()) * job_.config.devices_per_worker);
    proto::Command setup;
    *setup.mutable_setup()->mutable_placement() = pool.placement(job_.generation);
    const int64_t limit = job_.config.launch.memory_mib << 20;
    const int64_t available = limit > 0 ? limit : available_memory_bytes();  // before the models are built
    auto setups = job_.raw_call(setup);
    job_.signature = setups[0].setup().signature();
    job_.parameters = setups[0].setup().parameters();
    for (size_t w = 1; w < setups.size(); ++w) check_same_model(static_cast<int>(w), setups[w].setup().signature());
    start_equal_ = std::all_of(setups.begin(), setups.end(), [&](const proto::CommandResult& s) {
      return !s.setup().start_digest().empty() && s.setup().start_digest() == setups[0].setup().start_digest();
    });
    if (pool.spawns()) check_members_memory(setups, available);
    return true;
  } catch (const CommError& e) {
    // A process lost before every replica is set up (local mode): start them all again (the
    // survivors hold nothing yet that a fresh start would not rebuild). Registrations that
    // never came, or a worker that exited by itself before registering, are no loss to recover
    // from; in remote mode the driver cannot start the workers again.
    const bool registration_timeout = dynamic_cast<const TimeoutError*>(&e) != nullptr && e.op() == "register";
    if (!pool.spawns() || registration_timeout || e.op() == "worker start") throw;
    restart_every_worker(e.what());
    return false;
  }
}

void GroupFormation::check_members_memory(const std::vector<proto::CommandResult>& setups, int64_t available) const {
  std::vector<WorkerMemory> workers;
  for (const auto& s : setups) {
    const auto& m = s.setup().memory();
    if (m.size() < kZeroStages) return;  // a worker of another version: nothing known
    WorkerMemory w;
    for (int stage = 0; stage < kZeroStages; ++stage) {
      w[static_cast<size_t>(stage)] = {m[stage].parameters(), m[stage].gradients(), m[stage].optimizer_state()};
    }
    workers.push_back(w);
  }
  const std::string line =
      check_memory(workers, job_.config.step.zero_stage, available, start_copies(workers, !start_equal_));
  if (!line.empty()) control::log().info("trainer: {}", line);
}

void GroupFormation::check_same_model(int worker, const std::string& sig) const {
  const std::string& signature = job_.signature;
  if (sig == signature) return;
  std::istringstream a(signature), b(sig);
  std::string la, lb;
  while (true) {
    const bool ga = static_cast<bool>(std::getline(a, la)), gb = static_cast<bool>(std::getline(b, lb));
    if (!ga && !gb) return;
    if (la != lb || ga != gb) {
      throw ConfigError("worker " + std::to_string(worker) + " built a different model than worker 0: first " +
                        "difference: '" + (gb ? lb : std::string("(nothing)")) + "' vs worker 0's '" +
                        (ga ? la : std::string("(nothing)")) + "'");
    }
  }
}

void GroupFormation::restart_every_worker(const std::string& failure) {
  const auto detected = Clock::now();
  auto& failures = job_.recovery.failures();
  if (!failures.admit(failure + " (during start-up)", detected)) job_.fail(failures.exhausted());
  control::log().warn("trainer: {} during start-up; starting every worker again ({})", failure, failures.position());
  RecoveryEvent ev;
  ev.kind = "restart";
  ev.failure = failure + " (during start-up)";
  ev.detected_at = detected;
  ev.workers_after = job_.config.num_workers;
  if (job_.config.on_recovery) job_.config.on_recovery(ev);
  job_.signature.clear();  // no setups in the background until the members' is known again
  auto& server = *job_.server;
  server.abort_generation(job_.generation);
  for (int id : server.alive()) server.evict(id, "the job starts again");
  job_.pool->restart();
  ++job_.generation;
  ev.resumed_at = Clock::now();  // the new processes start; their registration is the next start's
  ev.recovery_s = std::chrono::duration<double>(ev.resumed_at - detected).count();
  job_.recovery.add_start_event(std::move(ev));
}

void GroupFormation::form(const std::vector<int>& joining, PhaseClock* clock, const Donor* donor) {
  PhaseClock none(nullptr);
  if (clock == nullptr) clock = &none;
  auto& pool = *job_.pool;
  ++job_.generation;
  pool.add_members(joining);
  const int world = static_cast<int>(pool.members().size()) * job_.config.devices_per_worker;
  if (job_.config.batch_size < world) job_.fail("too few samples per step for the re-formed job");
  job_.server->set_world(job_.generation, world);
  connect();
  clock->mark("connect");
  if (donor != nullptr) {
    std::vector<int> behind;  // new members, and survivors a step short of the donor
    for (int id : pool.members()) {
      if (std::find(donor->current.begin(), donor->current.end(), id) == donor->current.end()) behind.push_back(id);
    }
    if (!behind.empty()) share_state(donor->id, behind);
    job_.chunks.resume(donor->kept, donor->completed);
    clock->mark("restore");
    return;
  }
  if (job_.state.snapshot().empty()) return;  // lost during start-up, before the first snapshot: nothing to restore
  job_.state.restore();
  clock->mark("restore");
  job_.state.replay();
  clock->mark("replay");
}

void GroupFormation::share_state(int donor, const std::vector<int>& receivers) {
  if (job_.config.strategy != Strategy::kAllreduce) {  // no group broadcast: through the driver
    job_.state.send(job_.state.fetch(donor), {}, receivers);
    return;
  }
  proto::Command c;
  auto* share = c.mutable_share_state();
  share->set_root(static_cast<int64_t>(job_.pool->placement(job_.generation).ranks().at(donor)) *
                  job_.config.devices_per_worker);
  for (int id : receivers) share->add_load(id);
  job_.raw_call(c);
}

void GroupFormation::connect() {
  std::string attempts;
  int64_t& generation = job_.generation;
  for (int attempt = 1;; ++attempt) {
    announce_to_servers(std::to_string(generation));
    try {
      proto::Command connect;
      *connect.mutable_connect()->mutable_placement() = job_.pool->placement(generation);
      job_.raw_call(connect);
      job_.restart.save();  // who is in the group now, under which generation
      return;
    } catch (const CommError& e) {
      if (!members_alive()) throw;  // a lost worker: recovery's case
      attempts += "\n  " + std::to_string(attempt) + ". generation " + std::to_string(generation) + ": " + e.what();
      if (attempt == kFormationAttempts) {
        job_.fail("the group did not form in " + std::to_string(attempt) + " attempts, every worker alive:" + attempts);
      }
      control::log().warn("trainer: the group of generation {} did not form: {}; forming it again as generation {}",
                          generation, e.what(), generation + 1);
    }
    // The members still in the failed formation leave it at its deadline at the latest.
    job_.server->abort_generation(generation);
    const auto deadline = Clock::now() + job_.config.comm.timeout + milliseconds(2000);
    while (true) {
      try {
        job_.raw_call(command(&proto::Command::mutable_ping), {}, {}, milliseconds(1000));
        break;
      } catch (const TimeoutError&) {
        if (Clock::now() > deadline || !members_alive()) throw;
      }
    }
    ++generation;
    job_.server->set_world(generation, static_cast<int>(job_.pool->members().size()) * job_.config.devices_per_worker);
  }
}

bool GroupFormation::members_alive() {
  auto& pool = *job_.pool;
  pool.check_children();
  for (const auto& w : job_.server->workers()) {
    if (!pool.is_member(static_cast<int>(w.index))) continue;
    const bool silent =
        w.since_heartbeat_s * 1000 > static_cast<double>(job_.config.recovery.heartbeat_timeout.count());
    if (!w.alive || silent || pool.exited(static_cast<int>(w.index))) return false;
  }
  return true;
}

void GroupFormation::announce_to_servers(const std::string& generation_or_state) {
  if (ps_shard_processes(job_.config) == 0) return;
  try {
    job_.server->store()->set(kPsGenerationKey, generation_or_state);
  } catch (const std::exception& e) {
    control::log().warn("trainer: cannot reach the ps shards' key: {}", e.what());
  }
}

}  // namespace dsgd::runtime
