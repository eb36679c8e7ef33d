// The driver: Trainer's engine. Validates, serves the control plane, spawns or awaits workers,
// and turns each Trainer call into commands to every worker.
#include "dsgd/trainer.h"


#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "dsgd/error.h"
#include "dsgd/operator.h"
#include "runtime/builtin_operators.h"
#include "runtime/checkpoint.h"
#include "runtime/control/driver_service.h"
#include "runtime/control/log.h"
#include "runtime/malloc_tuning.h"
#include "runtime/metrics_wire.h"
#include "runtime/overlap_tuner.h"
#include "runtime/ps_server_process.h"
#include "runtime/results.h"
#include "runtime/snapshot_policy.h"
#include "runtime/spawn.h"
#include "runtime/trainer_config.h"
#include "runtime/worker.h"
#include "runtime/worker_pool.h"
#include "torch/replica.h"

namespace dsgd {

using json = nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

void init(int argc, char** argv) {
  runtime::tune_malloc();  // before the first big allocation, in drivers and workers alike
  std::optional<runtime::WorkerArgs> args;
  std::optional<runtime::PsServerArgs> server_args;
  try {
    args = runtime::parse_worker_args(argc, argv);
    server_args = runtime::parse_ps_server_args(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "dsgd worker: " << e.what() << "\n";
    std::exit(2);
  }
  if (server_args) std::exit(runtime::run_ps_server(*server_args));  // a ps shard process
  if (!args) return;
  std::exit(runtime::run_worker(*args));
}

namespace {

const bool builtins_registered = (runtime::register_builtin_operators(), true);

std::string random_token() {
  std::random_device rd;
  std::ostringstream out;
  for (int i = 0; i < 4; ++i) out << std::hex << rd() << rd();
  return out.str();
}

}  // namespace

// A failure the trainer can recover from by re-forming the job (a lost worker, a broken group).
bool recoverable(const std::exception& e) {
  return dynamic_cast<const CommError*>(&e) != nullptr;
}

struct Trainer::Impl {
  std::string op_name;
  TrainerConfig config;
  std::string token;
  std::unique_ptr<control::DriverServer> server;
  std::unique_ptr<runtime::WorkerPool> pool;  // who is in the group; local mode: their processes
  int64_t parameters = 0;
  int64_t generation = 1;              // of the communication group; +1 per re-formation
  std::string snapshot;                // replica state at the last consistent point
  std::unique_ptr<runtime::SnapshotPolicy> snapshots;  // when to take it; the steps since
  runtime::OverlapTuner overlap_tuner;                   // forward_overlap_buckets -1: T's choice
  int failures = 0;
  std::vector<std::string> failure_log;
  std::vector<RecoveryEvent> events;   // of the current call
  double snapshot_s = 0;               // of the current call: taking snapshots, writing checkpoints
  bool broken = false;
  bool stopped = false;
  std::unique_ptr<torch_glue::ReplicaRuntime> local;  // get_model's copy

  // One command to every member (or `targets`); any failure throws.
  std::vector<control::CommandOutcome> raw_call(const std::string& kind, const json& in = json::object(),
                                                const std::string& blob = "", std::vector<int> targets = {},
                                                const std::function<void()>& extra_tick = {},
                                                milliseconds timeout = milliseconds(0)) {
    if (targets.empty()) targets = pool->members();
    return server->call(kind, in.dump(), blob, timeout, [&] {
      pool->check_children();
      if (extra_tick) extra_tick();
    }, std::move(targets));
  }

  // Strategy ps with shard processes: tells them the generation to join (runtime/ps_server_process.h).
  void announce_to_servers(const std::string& generation_or_state) {
    if (runtime::ps_shard_processes(config) == 0) return;
    try {
      server->store()->set(runtime::kPsGenerationKey, generation_or_state);
    } catch (const std::exception& e) {
      control::log().warn("trainer: cannot reach the ps shards' key: {}", e.what());
    }
  }

  void ensure_usable() const {
    if (stopped) throw Error("the trainer was shut down");
    if (broken) {
      throw Error("the trainer is unusable after an earlier failure; create a new Trainer (or load a checkpoint into one)");
    }
  }

  void fail(const std::string& why) {
    broken = true;
    server->stop_workers();
    throw Error(why);
  }

  // f(), again after each recovery from a lost worker.
  template <typename F>
  auto recovering(F f) {
    ensure_usable();
    while (true) {
      try {
        return f();
      } catch (const std::exception& e) {
        recover_or_rethrow(e);
      }
    }
  }

  // A command that survives lost workers: on a recoverable failure the job is re-formed from
  // the last snapshot and the command is sent again. `first_only`: to the first live worker.
  std::vector<control::CommandOutcome> call(const std::string& kind, const json& in = json::object(),
                                            const std::string& blob = "", bool first_only = false,
                                            const std::function<void()>& extra_tick = {}) {
    return recovering([&] {
      std::vector<int> targets;
      if (first_only) targets = {pool->members().at(0)};
      return raw_call(kind, in, blob, targets, extra_tick);
    });
  }

  // Inside a catch block: a recoverable failure re-forms the job; anything else leaves the
  // trainer broken (workers told to stop) and is rethrown.
  void recover_or_rethrow(const std::exception& e) {
    if (!recoverable(e)) {
      broken = true;
      server->stop_workers();
      throw;
    }
    recover(e.what());
  }

  // The recovery protocol: abort the old generation, find and evict the lost workers, spawn
  // replacements, re-form the group with a new generation, restore the snapshot everywhere.
  void recover(std::string failure) {
    while (true) {
      const auto t0 = Clock::now();
      failure_log.push_back(failure);
      if (++failures > config.max_failures) {
        std::string all;
        for (size_t i = 0; i < failure_log.size(); ++i) all += "\n  " + std::to_string(i + 1) + ". " + failure_log[i];
        fail("giving up after " + std::to_string(failures) + " failures (max_failures " +
             std::to_string(config.max_failures) + "):" + all);
      }
      control::log().warn("trainer: {}; recovering (failure {} of at most {})", failure, failures, config.max_failures);
      try {
        RecoveryEvent ev = reform(failure);
        ev.resumed_at = Clock::now();
        ev.recovery_s = std::chrono::duration<double>(ev.resumed_at - t0).count();
        control::log().warn("trainer: recovered in {:.2f} s with {} worker(s); lost {}", ev.recovery_s,
                            ev.workers_after, ev.lost);
        events.push_back(std::move(ev));
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

  RecoveryEvent reform(const std::string& failure) {
    RecoveryEvent ev;
    ev.failure = failure;
    server->abort_generation(generation);
    announce_to_servers("pending");  // a shard started now waits for the next generation
    pool->spawn_servers();            // replaces lost shard processes (local mode)
    // Wait until every live worker is idle (answers a ping) or known lost (exited or silent for
    // the heartbeat timeout). Survivors fail their aborted command within moments, or, where it
    // waits in a group's formation for a process that is gone, at its comm_timeout.
    std::vector<int> lost;
    const auto deadline = Clock::now() + std::max(config.heartbeat_timeout, config.comm_timeout) + milliseconds(2000);
    while (true) {
      for (const auto& w : server->workers()) {
        if (!w.alive || !pool->is_member(static_cast<int>(w.index)) ||
            std::find(lost.begin(), lost.end(), w.index) != lost.end()) {
          continue;
        }
        const bool exited = pool->exited(static_cast<pid_t>(w.pid));
        const bool silent = w.since_heartbeat_s * 1000 > static_cast<double>(config.heartbeat_timeout.count());
        if (exited || silent) {
          lost.push_back(static_cast<int>(w.index));
          json p = json::parse(w.progress.empty() ? "{}" : w.progress, nullptr, false);
          ev.lost += (ev.lost.empty() ? "" : ", ") + std::string("worker ") + std::to_string(w.index) + " (host " +
                     w.host + ", pid " + std::to_string(w.pid) + (exited ? ", exited" : ", silent") + ")";
          if (p.is_object()) {
            ev.rolled_back_steps =
                std::max(ev.rolled_back_steps, snapshots->pending() + p.value("batches", int64_t{0}));
          }
        }
      }
      std::vector<int> survivors;
      for (int id : pool->members()) {
        if (std::find(lost.begin(), lost.end(), id) == lost.end()) survivors.push_back(id);
      }
      try {
        if (!survivors.empty()) raw_call("ping", json::object(), "", survivors, {}, milliseconds(1000));
        break;
      } catch (const std::exception&) {
        if (Clock::now() > deadline) throw;
      }
    }
    for (int id : lost) {
      const auto info = server->workers().at(static_cast<size_t>(id));
      server->evict(id, failure);
      pool->drop(id, static_cast<pid_t>(info.pid));
    }
    // Replacements (local mode), awaited here for up to replacement_timeout; without them the
    // job goes on with fewer workers and scales back up between chunks (scale_up).
    pool->spawn_replacements();
    std::vector<int> fresh = pool->newcomers();
    while (pool->replacements_pending()) {
      pool->check_children();  // a replacement that exits is dropped from pending
      std::this_thread::sleep_for(milliseconds(20));
      for (int id : pool->newcomers()) fresh.push_back(id);
    }
    if (pool->members().empty() && fresh.empty()) fail("every worker was lost: " + failure);
    pool->spawn_servers();  // shard processes lost meanwhile
    form_group(fresh);
    ev.workers_after = static_cast<int>(pool->members().size());
    return ev;
  }

  // A new generation of the group: `fresh` (registered, not yet set up) join the members, and
  // everyone restores the snapshot.
  void form_group(const std::vector<int>& fresh) {
    ++generation;
    pool->add_members(fresh);
    const int world = static_cast<int>(pool->members().size()) * config.devices_per_worker;
    if (config.batch_size < world) fail("too few samples per step for the re-formed job");
    server->set_world(generation, world);
    const json place = pool->placement(generation);
    if (!fresh.empty()) raw_call("setup", place, "", fresh);
    announce_to_servers(std::to_string(generation));
    raw_call("connect", place);
    raw_call("set_state", json::object(), snapshot);
    replay();
  }

  // After restoring `snapshot`: trains the steps done since it (deferred snapshots) again, so
  // every replica is where the last train() left it. Their results were returned already.
  void replay() {
    const auto to = snapshots->replay_to();
    for (int guard = 0; snapshots->pending() > 0 && guard < 1000; ++guard) {
      const json at = json::parse(raw_call("position", json::object(), "", {pool->members().at(0)})[0].json);
      const std::pair<int64_t, int64_t> now{at.at("epoch").get<int64_t>(), at.at("batch").get<int64_t>()};
      if (now >= to) return;
      // To the end of the epoch (max_batches 0), or to the batch within it.
      const int64_t batches = now.first < to.first ? 0 : to.second - now.second;
      raw_call("train", {{"max_batches", batches}, {"profile", false}});
    }
  }

  // Between chunks, below num_workers: grow back with whoever has registered since (spawning
  // replacements with back-off in local mode). Returns the event, or nullopt if nothing changed.
  std::optional<RecoveryEvent> scale_up() {
    if (static_cast<int>(pool->members().size()) >= config.num_workers) return std::nullopt;
    pool->spawn_replacements();
    pool->check_children();
    const auto fresh = pool->newcomers();
    if (fresh.empty()) return std::nullopt;
    const auto t0 = Clock::now();
    RecoveryEvent ev;
    ev.kind = "scale_up";
    take_snapshot();  // the members' state now (a worker function may have changed it)
    form_group(fresh);
    ev.workers_after = static_cast<int>(pool->members().size());
    ev.resumed_at = Clock::now();
    ev.recovery_s = std::chrono::duration<double>(ev.resumed_at - t0).count();
    pool->reset_backoff();
    control::log().info("trainer: back to {} worker(s) in {:.2f} s", pool->members().size(), ev.recovery_s);
    return ev;
  }

  // scale_up, surviving a failure on the way like any call.
  void try_scale_up() {
    try {
      if (auto ev = scale_up()) events.push_back(std::move(*ev));
    } catch (const std::exception& e) {
      recover_or_rethrow(e);
    }
  }

  // The first member's state (models, optimizers, position). Optimizer state held on the ps
  // shards comes back into the replicas' optimizers first (a collective: every member).
  std::string read_state() {
    if (config.ps_update_on_shards || config.strategy == "ps_async") {
      raw_call("gather_state", json{{"keep", pool->members().at(0)}});
    }
    return std::move(raw_call("get_state", json::object(), "", {pool->members().at(0)})[0].blob);
  }

  void take_snapshot() {
    const auto t0 = Clock::now();
    snapshot = read_state();
    snapshots->taken(std::chrono::duration<double>(Clock::now() - t0).count());
    snapshot_s += snapshots->cost_s();
    control::log().debug("trainer: snapshot of {} bytes in {:.3f} s", snapshot.size(), snapshots->cost_s());
  }

  // take_snapshot, surviving a lost worker: false when it recovered instead, back to the
  // previous snapshot.
  bool snapshot_or_recover() {
    try {
      take_snapshot();
      return true;
    } catch (const std::exception& e) {
      recover_or_rethrow(e);
      return false;
    }
  }

  // Takes the snapshot SnapshotPolicy put off, before a command whose effect a replay of
  // training would not reproduce (a worker function).
  void flush_snapshot() {
    if (snapshots->pending() > 0) recovering([&] { take_snapshot(); });
  }

  json checkpoint_header(int64_t epoch, int64_t batch) const {
    return {{"epoch", epoch}, {"batch", batch}, {"operator", op_name}, {"strategy", config.strategy},
            {"num_workers", config.num_workers}, {"devices_per_worker", config.devices_per_worker}};
  }

  // The snapshot just taken, also on disk (TrainerConfig::checkpoint_dir), as step `step`.
  void persist_snapshot(int64_t epoch, int64_t batch, int64_t batches_per_epoch) {
    if (config.checkpoint_dir.empty()) return;
    const auto t0 = Clock::now();
    runtime::Checkpoint c{checkpoint_header(epoch, batch), snapshot};
    auto pickle = call("get_pickle", json::object(), "", true);  // a recovery restores `snapshot`
    const auto path = runtime::write_rotating_checkpoint(config.checkpoint_dir, epoch * batches_per_epoch + batch,
                                                         config.checkpoint_keep, c, pickle[0].blob);
    control::log().debug("trainer: checkpoint {}", path);
    snapshot_s += std::chrono::duration<double>(Clock::now() - t0).count();
  }
};

Trainer::Trainer(const std::string& operator_name, TrainerConfig config) : impl_(std::make_unique<Impl>()) {
  runtime::validate_trainer_config(operator_name, config);
  auto& d = *impl_;
  d.op_name = operator_name;
  d.config = std::move(config);
  const auto& c = d.config;
  d.token = c.token.empty() ? random_token() : c.token;
  control::DriverServerOptions so;
  so.listen = c.listen.empty() ? "127.0.0.1:0" : c.listen;
  so.token = d.token;
  so.num_workers = c.num_workers;
  so.world_size = c.num_workers * c.devices_per_worker;
  so.job = runtime::job_description(operator_name, c).dump();
  so.heartbeat_timeout = c.heartbeat_timeout;
  so.reduce_timeout = c.comm_timeout;
  d.server = control::DriverServer::start(so);
  std::string binary;  // local mode: what the workers run
  if (c.listen.empty()) binary = c.worker_binary.empty() ? runtime::self_executable() : c.worker_binary;
  d.pool = std::make_unique<runtime::WorkerPool>(c, *d.server, binary, d.token);
  d.snapshots = std::make_unique<runtime::SnapshotPolicy>(d.config);

  try {
    if (d.pool->local()) {
      d.pool->spawn_initial();
    } else {
      control::log().info("driver: waiting for {} worker(s): start each with --dsgd-worker --driver {} --token {}",
                   c.num_workers, address(), d.token);
    }
    d.server->wait_registered(c.registration_timeout, [&] { d.pool->check_children(); });
    d.pool->set_members(d.server->alive());

    // Every replica builds its operator; all must agree on the parameters.
    d.server->set_world(d.generation, c.num_workers * c.devices_per_worker);
    const json place = d.pool->placement(d.generation);
    auto setups = d.raw_call("setup", place);
    const std::string reference = json::parse(setups[0].json).at("signature").get<std::string>();
    d.parameters = json::parse(setups[0].json).value("parameters", int64_t{0});
    for (size_t w = 1; w < setups.size(); ++w) {
      const std::string sig = json::parse(setups[w].json).at("signature").get<std::string>();
      if (sig == reference) continue;
      std::istringstream a(reference), b(sig);
      std::string la, lb;
      while (true) {
        const bool ga = static_cast<bool>(std::getline(a, la)), gb = static_cast<bool>(std::getline(b, lb));
        if (!ga && !gb) break;
        if (la != lb || ga != gb) {
          throw ConfigError("worker " + std::to_string(w) + " built a different model than worker 0: first difference: '" +
                            (gb ? lb : std::string("(nothing)")) + "' vs worker 0's '" + (ga ? la : std::string("(nothing)")) +
                            "'");
        }
      }
    }
    d.announce_to_servers(std::to_string(d.generation));
    d.raw_call("connect", place);
    // Start every replica from replica 0's parameters (and optimizer state).
    d.take_snapshot();
    if (c.num_workers > 1 || c.devices_per_worker > 1) d.raw_call("set_state", json::object(), d.snapshot);
  } catch (...) {
    shutdown();
    throw;
  }
}

Trainer::~Trainer() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    control::log().warn("trainer: shutdown: {}", e.what());
  }
}

Results Trainer::train(const TrainOptions& options) {
  if (options.num_steps < 0) throw ConfigError("num_steps must be >= 0, got " + std::to_string(options.num_steps));
  auto& d = *impl_;
  d.ensure_usable();
  d.events.clear();
  d.snapshot_s = 0;
  d.try_scale_up();  // lost workers replaced since the last call join now
  const auto t0 = Clock::now();
  int64_t done = 0;  // steps completed in earlier chunks of this call
  std::function<void()> tick;
  if (d.config.on_progress) {
    tick = [&] {
      if (d.pool->members().empty()) return;
      const auto w = d.server->workers().at(static_cast<size_t>(d.pool->members()[0]));
      const json p = json::parse(w.progress.empty() ? "null" : w.progress, nullptr, false);
      if (!p.is_object()) return;
      d.config.on_progress({done + p.value("batches", int64_t{0}), options.num_steps, p.value("loss", 0.0),
                            std::chrono::duration<double>(Clock::now() - t0).count()});
    };
  }
  // Chunks of checkpoint_every_steps (more for costly snapshots), a snapshot after each unless
  // it would come too soon (runtime/snapshot_policy.h): a recovery redoes at most one interval.
  std::vector<Results> chunks;
  double step_s = 0;  // seconds per step in the last chunk
  while (true) {
    int64_t chunk = d.snapshots->next_chunk(step_s);
    if (options.num_steps > 0) chunk = chunk > 0 ? std::min(chunk, options.num_steps - done) : options.num_steps - done;
    json args = {{"max_batches", chunk}, {"profile", options.profile}};
    const bool choose_overlap = d.config.forward_overlap_buckets < 0;
    const int64_t planned = chunk;
    if (choose_overlap) {
      args["max_batches"] = chunk = d.overlap_tuner.trial_chunk(chunk);
      args["forward_overlap_buckets"] = d.overlap_tuner.next();
    }
    // A recovery during the chunk restarts it from the snapshot (its start): results stay whole.
    const auto chunk_t0 = Clock::now();
    auto outs = d.call("train", args, "", false, tick);
    Results r = runtime::results_of_command(outs, true);
    const int64_t batches = static_cast<int64_t>(r.metrics.count("batches") ? r.metrics.at("batches") : 0);
    if (choose_overlap && d.overlap_tuner.tuning()) {
      std::vector<std::string> answers;
      for (const auto& o : outs) answers.push_back(o.json);
      d.overlap_tuner.record(batches, answers);
      if (!d.overlap_tuner.tuning()) control::log().info("trainer: {}", d.overlap_tuner.summary());
    }
    const double chunk_step_s =
        batches > 0 ? std::chrono::duration<double>(Clock::now() - chunk_t0).count() / static_cast<double>(batches)
                    : step_s;
    // A worker lost between the chunk's end and its snapshot: the recovery went back to the
    // chunk's start, so the chunk is done again.
    const bool call_ends = r.batch == 0 || batches == 0 || (options.num_steps > 0 && done + batches >= options.num_steps);
    const bool cut_short = choose_overlap && !call_ends && (planned == 0 || chunk < planned);  // trials
    const bool deferred = d.snapshots->defer(batches, chunk_step_s, {r.epoch, r.batch}, cut_short);
    if (!deferred && !d.snapshot_or_recover()) continue;
    chunks.push_back(r);
    done += batches;
    step_s = chunk_step_s;
    if (!deferred) d.persist_snapshot(r.epoch, r.batch, r.batches_per_epoch);  // a checkpoint_dir's
    if (call_ends || chunk == 0) break;
    d.try_scale_up();
  }
  Results total = runtime::merge_chunks(chunks, options.profile, options.reduce_results);
  if (options.profile) total.metrics["snapshot_s"] = d.snapshot_s;
  total.recoveries = d.events;
  return total;
}

Results Trainer::validate() { return runtime::results_of_command(impl_->call("validate"), false); }

Results Trainer::step() { return train({.num_steps = 1}); }

std::vector<json> Trainer::foreach_worker(const std::string& name, const json& arg) {
  if (!runtime::has_worker_function(name)) runtime::find_worker_function(name);  // throws, naming it
  std::vector<json> out;
  impl_->flush_snapshot();  // a replay of training would not redo what the function does
  for (const auto& o : impl_->call("run", {{"name", name}, {"arg", arg}})) out.push_back(json::parse(o.json).at("result"));
  return out;
}

void Trainer::save(const std::string& path) {
  auto& d = *impl_;
  std::string state = d.recovering([&] { return d.read_state(); });
  d.snapshot = state;  // as good as a snapshot: the state now
  d.snapshots->reset();
  auto pickle = d.call("get_pickle", json::object(), "", true);
  auto pos = d.call("position", json::object(), "", true);
  const json p = json::parse(pos[0].json);
  runtime::Checkpoint c{d.checkpoint_header(p.at("epoch"), p.at("batch")), std::move(state)};
  runtime::write_checkpoint(path, c, pickle[0].blob);
}

void Trainer::load(const std::string& path) {
  runtime::Checkpoint c;
  if (!std::filesystem::exists(std::filesystem::path(path) / "checkpoint.dsgd") &&
      !runtime::list_checkpoints(path).empty()) {
    std::vector<std::string> skipped;
    c = runtime::read_latest_checkpoint(path, &skipped);
    for (const auto& s : skipped) control::log().warn("trainer: passed over a damaged checkpoint: {}", s);
  } else {
    c = runtime::read_checkpoint(path);
  }
  const auto field = c.header.find("operator");
  const std::string op = field != c.header.end() && field->is_string() ? field->get<std::string>() : "";
  if (op != impl_->op_name) {
    throw ConfigError(path + ": the checkpoint is of operator '" + op + "', this trainer runs '" + impl_->op_name + "'");
  }
  impl_->call("set_state", json::object(), c.state);
  impl_->snapshot = c.state;
  impl_->snapshots->reset();
}

std::shared_ptr<torch::nn::Module> Trainer::get_model(size_t index) {
  auto& d = *impl_;
  auto state = d.call("get_state", json::object(), "", true);
  if (!d.local) {
    torch_glue::ReplicaOptions o;
    o.global_batch = d.config.batch_size;
    o.seed = d.config.seed;
    o.info.seed = d.config.seed;
    o.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    d.local = std::make_unique<torch_glue::ReplicaRuntime>(make_operator(d.op_name), o);
    d.local->setup(d.config.config);
  }
  d.local->load_state(state[0].blob);
  const auto& models = d.local->op().models();
  if (index >= models.size()) {
    throw ConfigError("get_model(" + std::to_string(index) + "): the operator registered " +
                      std::to_string(models.size()) + " model(s)");
  }
  return models[index];
}

void Trainer::shutdown() {
  auto& d = *impl_;
  if (d.stopped) return;
  d.stopped = true;
  if (d.server && !d.broken) {
    try {
      d.server->call("shutdown", "{}", "", milliseconds(5000), [&] { d.pool->check_children(); });
    } catch (const std::exception& e) {
      control::log().debug("trainer: shutdown: {}", e.what());
    }
  }
  if (d.server) {
    d.announce_to_servers("stop");
    d.server->stop_workers();
  }
  if (d.pool) d.pool->stop(3000);
  d.pool.reset();
  d.server.reset();
}

const TrainerConfig& Trainer::config() const { return impl_->config; }

int64_t Trainer::parameter_count() const { return impl_->parameters; }

std::string Trainer::address() const {
  const std::string& l = impl_->config.listen;
  const std::string host = l.empty() ? "127.0.0.1" : l.substr(0, l.rfind(':'));
  return host + ":" + std::to_string(impl_->server ? impl_->server->port() : 0);
}

const std::string& Trainer::token() const { return impl_->token; }

}  // namespace dsgd
