// The driver: Trainer's engine. Validates, serves the control plane, spawns or awaits workers,
// and turns each Trainer call into commands to every worker. Snapshots and the recovery from a
// lost worker are in runtime/driver/trainer_recovery.cpp; the state both share, runtime/driver/trainer_impl.h.
#include "dsgd/runtime/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "dsgd/comm/shm_group.h"
#include "dsgd/common/error.h"
#include "dsgd/torch/operator.h"
#include "control/driver_service.h"
#include "control/log.h"
#include "runtime/driver/checkpoint.h"
#include "runtime/driver/overlap_tuner.h"
#include "runtime/driver/results.h"
#include "runtime/driver/snapshot_policy.h"
#include "runtime/driver/trainer_impl.h"
#include "runtime/driver/worker_pool.h"
#include "runtime/launch/fork_server.h"
#include "runtime/launch/spawn.h"
#include "runtime/worker/job_spec.h"
#include "runtime/worker/malloc_tuning.h"
#include "runtime/worker/ps_server_process.h"
#include "runtime/worker/trace_file.h"
#include "runtime/worker/worker.h"
#include "runtime/worker/worker_functions.h"
#include "torch/replica/replica.h"

namespace dsgd {

using json = nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

// Names in /dev/shm that workers killed while their host's shared-memory group formed left
// behind (dsgd/comm/shm_group.h): removed when a driver starts and when it stops.
void remove_orphaned_segments() {
  if (const int n = comm::remove_orphaned_segments(); n > 0)
    control::log().info("driver: removed {} shared-memory segment name(s) of dead processes from /dev/shm", n);
}

std::string random_token() {
  std::random_device rd;
  std::ostringstream out;
  for (int i = 0; i < 4; ++i) out << std::hex << rd() << rd();
  return out.str();
}

}  // namespace

std::vector<proto::CommandResult> Trainer::Impl::raw_call(const proto::Command& request, std::vector<int> targets,
                                                          const std::function<void()>& extra_tick,
                                                          milliseconds timeout) {
  const bool everyone = targets.empty() || targets == pool->members();
  if (targets.empty()) targets = pool->members();
  using C = proto::Command;
  const auto kind = request.request_case();
  const bool changes = kind == C::kSetState || kind == C::kTrain || kind == C::kRun || kind == C::kStepSchedules ||
                       kind == C::kShareState;
  if (changes) members_settled = false;  // one member's change cut short leaves the others apart
  auto out = server->call(request, timeout, [&] {
    if (driver_state) driver_state->touch();  // for a successor: when this driver was last alive
    pool->check_children();
    pool->tend(generation, signature);  // standbys and new workers set up meanwhile
    if (extra_tick) extra_tick();
  }, std::move(targets));
  if (changes && everyone) members_settled = true;
  return out;
}

void Trainer::Impl::send_state(const std::string& state, const Feedback& feedback, std::vector<int> targets) {
  if (targets.empty()) targets = pool->members();
  for (size_t at = 0; at < state.size(); at += kStateChunkBytes) {
    proto::Command piece;
    piece.mutable_state_chunk()->set_offset(at);
    piece.mutable_state_chunk()->set_data(state.data() + at, std::min(kStateChunkBytes, state.size() - at));
    raw_call(piece, targets);
  }
  proto::Command c;
  auto* set = c.mutable_set_state();  // loads what the pieces carried
  for (const auto& [rank, bytes] : feedback) (*set->mutable_feedback())[rank] = bytes;
  raw_call(c, targets);
}

std::string Trainer::Impl::fetch_state(int member) {
  proto::Command c;
  c.mutable_get_state()->set_chunk_bytes(kStateChunkBytes);
  auto first = std::move(*raw_call(c, {member})[0].mutable_state());
  std::string state = std::move(*first.mutable_state());
  state.reserve(first.total());
  while (state.size() < first.total()) {
    proto::Command read;
    read.mutable_read_state()->set_offset(state.size());
    read.mutable_read_state()->set_bytes(kStateChunkBytes);
    const auto piece = raw_call(read, {member});
    if (piece[0].state().state().empty()) {
      throw Error("worker " + std::to_string(member) + "'s state read stalled at byte " + std::to_string(state.size()));
    }
    state += piece[0].state().state();
  }
  return state;
}

void Trainer::Impl::announce_to_servers(const std::string& generation_or_state) {
  if (ps_shard_processes(config) == 0) return;
  try {
    server->store()->set(runtime::kPsGenerationKey, generation_or_state);
  } catch (const std::exception& e) {
    control::log().warn("trainer: cannot reach the ps shards' key: {}", e.what());
  }
}

void Trainer::Impl::ensure_usable() const {
  if (stopped) throw Error("the trainer was shut down");
  if (broken) {
    throw Error(
        "the trainer is unusable after an earlier failure; create a new Trainer (or load a checkpoint into one)");
  }
}

void Trainer::Impl::fail(const std::string& why) {
  broken = true;
  server->stop_workers();
  throw Error(why);
}

std::vector<proto::CommandResult> Trainer::Impl::call(const proto::Command& request, bool first_only,
                                                      const std::function<void()>& extra_tick) {
  return recovering([&] {
    std::vector<int> targets;
    if (first_only) targets = {pool->members().at(0)};
    return raw_call(request, targets, extra_tick);
  });
}

json Trainer::Impl::checkpoint_header(int64_t epoch, int64_t batch) const {
  // The operator's config and the seed: an evaluator (dsgd/runtime/evaluator.h) builds the same models.
  return {{"epoch", epoch},
          {"batch", batch},
          {"operator", op_name},
          {"operator_config", config.config},
          {"seed", config.seed},
          {"strategy", config.strategy.name()},
          {"num_workers", config.num_workers},
          {"devices_per_worker", config.devices_per_worker}};
}

Trainer::Trainer(const std::string& operator_name, TrainerConfig config) : impl_(std::make_unique<Impl>()) {
  const auto started = Clock::now();
  validate_config(operator_name, config);
  auto& d = *impl_;
  d.op_name = operator_name;
  d.config = std::move(config);
  auto& c = d.config;
  d.failures = runtime::FailureBudget(c.recovery);
  control::DriverServerOptions so;
  so.job = runtime::make_job_spec(operator_name, c);
  const std::optional<runtime::DriverState> previous = d.open_driver_state(so.job);  // a lost driver's job
  d.token = previous ? previous->token : c.launch.token.empty() ? random_token() : c.launch.token;
  const control::TlsKeys tls = previous ? control::decode_keys(previous->tls_keys) : runtime::job_tls_keys(c);
  d.tls = tls.enabled();
  d.tls_line = control::encode_keys(tls);
  remove_orphaned_segments();
  so.listen = previous ? previous->address : c.launch.listen.empty() ? "127.0.0.1:0" : c.launch.listen;
  so.token = d.token;
  so.tls = tls;
  so.num_workers = c.num_workers;
  so.standby_workers = c.recovery.standby_workers;
  so.world_size = c.num_workers * c.devices_per_worker;
  so.heartbeat_timeout = c.recovery.heartbeat_timeout;
  so.reduce_timeout = c.comm.timeout;
  d.start_server(&so, previous);
  d.listen_address = so.listen.substr(0, so.listen.rfind(':')) + ":" + std::to_string(d.server->port());
  std::string binary;  // what the workers the driver starts run
  if (runtime::launcher_of(c) != Launcher::kNone)
    binary = c.launch.worker_binary.empty() ? runtime::self_executable() : c.launch.worker_binary;
  d.pool = std::make_unique<runtime::WorkerPool>(c, *d.server, binary,
                                                 runtime::JobSecrets{d.token, d.tls_line});
  d.snapshots = std::make_unique<runtime::SnapshotPolicy>(d.config);
  if (!c.checkpoints.dir.empty()) runtime::mark_job_ended(c.checkpoints.dir, false);  // this job runs now

  try {
    d.start_metrics();
    if (!previous || !d.resume(*previous, started)) {
      if (d.pool->spawns()) {
        d.pool->spawn_initial();
      } else {
        control::log().info(
            "driver: waiting for {} worker(s): start each with --dsgd-worker --driver {} --token {}{}", c.num_workers,
            address(), d.token, d.tls ? " --tls-dir DIR (DIR: this job's ca.pem, cert.pem, key.pem)" : "");
      }
      d.start_up();
      if (d.driver_state) d.persist_snapshot(0, 0, 0);  // a restart before the first interval starts here
    }
    d.publish_gauges();
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

void Trainer::Impl::start_up() {
  // A lone worker without a standby has no survivor to recover with: lost after set-up too, the
  // driver that starts its workers starts it again.
  const bool alone = pool->spawns() && config.num_workers == 1 && config.recovery.standby_workers == 0;
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
  for (auto& ev : events) {
    ev.failure += " (during start-up)";
    start_events.push_back(std::move(ev));
  }
  events.clear();
}

void Trainer::Impl::form_first_group(bool recover) {
  // Every replica is set up: a worker lost from here on is an ordinary recovery (a standby takes
  // its place, or the survivors go on), nothing to roll back. Lost before the first snapshot,
  // the re-formed group has nothing to restore yet, and the snapshot is taken again.
  try {
    connect_group();
  } catch (const std::exception& e) {
    if (!recover) throw;
    recover_or_rethrow(e);
  }
  const auto give_out = [&] {
    take_snapshot(/*before_steps=*/true);
    if (pool->members().size() > 1 || config.devices_per_worker > 1)
      send_state(snapshot, snapshot_feedback);
  };
  if (recover) {
    recovering(give_out);
  } else {
    give_out();
  }
}

bool Trainer::Impl::set_up_members() {
  try {
    server->wait_registered(
        config.launch.registration_timeout, [&] { pool->check_children(); }, pool->initial_count());
    pool->choose_members();
    server->set_world(generation, config.num_workers * config.devices_per_worker);
    proto::Command setup;
    *setup.mutable_setup()->mutable_placement() = pool->placement(generation);
    auto setups = raw_call(setup);
    signature = setups[0].setup().signature();
    parameters = setups[0].setup().parameters();
    for (size_t w = 1; w < setups.size(); ++w) check_same_model(static_cast<int>(w), setups[w].setup().signature());
    return true;
  } catch (const CommError& e) {
    // A process lost before every replica is set up (local mode): start them all again (the
    // survivors hold nothing yet that a fresh start would not rebuild). Registrations that
    // never came, or a worker that exited by itself before registering, are no loss to recover
    // from; in remote mode the driver cannot start the workers again.
    const bool registration_timeout = dynamic_cast<const TimeoutError*>(&e) != nullptr && e.op() == "register";
    if (!pool->spawns() || registration_timeout || e.op() == "worker start") throw;
    restart_every_worker(e.what());
    return false;
  }
}

void Trainer::Impl::check_same_model(int worker, const std::string& sig) const {
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

void Trainer::Impl::restart_every_worker(const std::string& failure) {
  const auto detected = Clock::now();
  if (!failures.admit(failure + " (during start-up)", detected)) fail(failures.exhausted());
  control::log().warn("trainer: {} during start-up; starting every worker again ({})", failure, failures.position());
  RecoveryEvent ev;
  ev.kind = "restart";
  ev.failure = failure + " (during start-up)";
  ev.detected_at = detected;
  ev.workers_after = config.num_workers;
  if (config.on_recovery) config.on_recovery(ev);
  signature.clear();  // no setups in the background until the members' is known again
  server->abort_generation(generation);
  for (int id : server->alive()) server->evict(id, "the job starts again");
  pool->restart();
  ++generation;
  ev.resumed_at = Clock::now();  // the new processes start; their registration is the next start's
  ev.recovery_s = std::chrono::duration<double>(ev.resumed_at - detected).count();
  start_events.push_back(std::move(ev));
}

void Trainer::Impl::begin_train_call() {
  events = std::exchange(start_events, {});  // the first call reports the start-up's
  catching_up.clear();
  snapshot_s = 0;
  checkpoint_failures = 0;
  straggler_changes.clear();
}

std::function<void()> Trainer::Impl::progress_tick(const TrainOptions& options, const int64_t& done,
                                                   Clock::time_point t0) {
  return [this, &options, &done, t0] {
    if (pool->members().empty()) return;
    watch_stragglers();
    if (!config.on_progress) return;
    const auto w = server->workers().at(static_cast<size_t>(pool->members()[0]));
    const json p = json::parse(w.progress.empty() ? "null" : w.progress, nullptr, false);
    if (!p.is_object()) return;
    const int64_t batches = done + resumed_in_chunk + p.value("batches", int64_t{0});
    config.on_progress({batches, options.num_steps, p.value("loss", 0.0),
                        std::chrono::duration<double>(Clock::now() - t0).count(),
                        p.value("batches_per_epoch", int64_t{0}), stragglers.current()});
  };
}

void Trainer::Impl::add_traces(const std::vector<proto::CommandResult>& outs, double offset_us,
                               runtime::TraceFile* trace) {
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto w = server->workers().at(static_cast<size_t>(pool->members().at(i)));
    const std::string name =
        "worker " + std::to_string(i) + " (host " + w.host + ", pid " + std::to_string(w.pid) + ")";
    const std::string& events = outs[i].epoch().trace_json();
    trace->add(static_cast<int>(i), name, events.empty() ? json() : json::parse(events), offset_us);
  }
}

void Trainer::Impl::record_overlap_trial(const std::vector<proto::CommandResult>& outs, int64_t batches) {
  // Every step waits for the slowest worker: its replicas' slowest steady step counts.
  double steady = 0;
  size_t buckets = 0;
  for (const auto& o : outs) {
    steady = std::max(steady, o.epoch().steady_step_s());
    buckets = std::max(buckets, static_cast<size_t>(o.epoch().buckets()));
  }
  overlap_tuner.record(batches, steady, buckets);
  if (!overlap_tuner.tuning()) control::log().info("trainer: {}", overlap_tuner.summary());
}

Results Trainer::train(const TrainOptions& options) {
  if (options.num_steps < 0) throw ConfigError("num_steps must be >= 0, got " + std::to_string(options.num_steps));
  if (!options.trace_path.empty()) runtime::check_trace_path(options.trace_path);
  auto& d = *impl_;
  d.ensure_usable();
  d.begin_train_call();
  d.try_scale_up();  // lost workers replaced since the last call join now
  const auto t0 = Clock::now();
  int64_t done = 0;  // steps completed in earlier chunks of this call
  const std::function<void()> tick = d.progress_tick(options, done, t0);
  // Chunks of checkpoint_every_steps (more for costly snapshots), a snapshot after each unless
  // it would come too soon (runtime/driver/snapshot_policy.h): a recovery redoes at most one interval.
  std::vector<Results> chunks;
  double step_s = 0;  // seconds per step in the last chunk
  runtime::TraceFile trace;
  while (true) {
    int64_t chunk = d.snapshots->next_chunk(step_s);
    if (options.num_steps > 0) chunk = chunk > 0 ? std::min(chunk, options.num_steps - done) : options.num_steps - done;
    const bool want_size = d.snapshots->wants_size();  // for the snapshot's predicted cost
    proto::Command request;
    proto::TrainRequest& args = *request.mutable_train();
    args.set_profile(options.profile);
    args.set_trace(!options.trace_path.empty());
    args.set_state_bytes(want_size);
    const bool choose_overlap = d.config.comm.forward_overlap_buckets < 0;
    const int64_t planned = chunk;
    if (choose_overlap) {
      chunk = d.overlap_tuner.trial_chunk(chunk);
      args.set_forward_overlap_buckets(static_cast<int32_t>(d.overlap_tuner.next()));
    }
    args.set_max_batches(chunk);
    const auto chunk_t0 = Clock::now();
    int64_t kept = 0;
    auto outs = d.train_chunk(&request, tick, &kept);
    Results r = runtime::results_of_command(outs, true);
    d.note_caught_up(static_cast<int64_t>(r.metrics.count("batches") ? r.metrics.at("batches") : 0));
    if (kept > 0) d.count_kept_steps(&r, kept);
    if (!options.trace_path.empty()) {
      d.add_traces(outs, std::chrono::duration<double, std::micro>(chunk_t0 - t0).count(), &trace);
    }
    const int64_t batches = static_cast<int64_t>(r.metrics.count("batches") ? r.metrics.at("batches") : 0);
    if (want_size && batches > 0 && !outs.empty()) {
      if (const int64_t n = outs[0].epoch().state_bytes(); n > 0) d.snapshots->resized(static_cast<size_t>(n));
    }
    if (choose_overlap && d.overlap_tuner.tuning()) d.record_overlap_trial(outs, batches);
    const double chunk_step_s =
        batches > 0 ? std::chrono::duration<double>(Clock::now() - chunk_t0).count() / static_cast<double>(batches)
                    : step_s;
    // A worker lost between the chunk's end and its snapshot: the recovery went back to the
    // chunk's start, so the chunk is done again.
    const bool call_ends =
        r.batch == 0 || batches == 0 || (options.num_steps > 0 && done + batches >= options.num_steps);
    const bool cut_short = choose_overlap && !call_ends && (planned == 0 || chunk < planned);  // trials
    const bool deferred = d.snapshots->defer(batches, chunk_step_s, {r.epoch, r.batch}, cut_short);
    if (!deferred && !d.snapshot_or_recover()) continue;
    chunks.push_back(r);
    done += batches;
    d.steps_done += batches;
    step_s = chunk_step_s;
    d.publish_gauges(chunk_step_s > 0 ? static_cast<double>(d.config.batch_size) / chunk_step_s : 0);
    if (!deferred) d.persist_snapshot(r.epoch, r.batch, r.batches_per_epoch);  // a checkpoint_dir's
    if (call_ends || chunk == 0) break;
    d.try_scale_up();
  }
  Results total = runtime::merge_chunks(chunks, options.profile, options.reduce_results);
  if (options.profile) total.metrics["snapshot_s"] = d.snapshot_s;
  if (!options.trace_path.empty()) {
    d.add_straggler_notes(&trace, t0);
    trace.write(options.trace_path);
    control::log().info("trainer: trace of {} events written to {}{}", trace.num_events(), options.trace_path,
                        trace.dropped() > 0
                            ? " (" + std::to_string(trace.dropped()) + " more dropped: the limit per chunk)"
                            : std::string());
  }
  d.collect_checkpoints(/*wait=*/true);  // a call returns with its checkpoints on disk
  total.recoveries = d.events;
  total.checkpoint_failures = d.checkpoint_failures;
  total.stragglers = d.stragglers.take_named();
  return total;
}

void Trainer::set_callbacks(std::function<void(const TrainProgress&)> on_progress,
                            std::function<void(const RecoveryEvent&)> on_recovery) {
  impl_->config.on_progress = std::move(on_progress);
  impl_->config.on_recovery = std::move(on_recovery);
}

Results Trainer::validate() {
  auto& d = *impl_;
  d.events = std::exchange(d.start_events, {});
  Results r = runtime::results_of_command(d.call(command(&proto::Command::mutable_validate)), false);
  r.recoveries = d.events;  // a worker lost while the replicas evaluated
  d.record_validation(r);
  return r;
}

Results Trainer::step() { return train({.num_steps = 1}); }

namespace {

// foreach_worker's (each worker's first replica) and foreach_model's (every replica) command.
proto::Command foreach_command(const std::string& name, const json& arg, bool every_replica) {
  if (!runtime::has_worker_function(name)) runtime::find_worker_function(name);  // throws, naming it
  proto::Command run;
  run.mutable_run()->set_name(name);
  run.mutable_run()->set_arg_json(arg.dump());
  run.mutable_run()->set_every_replica(every_replica);
  return run;
}

std::vector<json> foreach_results(const std::vector<proto::CommandResult>& outs, bool every_replica) {
  std::vector<json> out;
  for (const auto& o : outs) {
    json result = json::parse(o.run().result_json());
    if (!every_replica) {
      out.push_back(std::move(result));
      continue;
    }
    for (auto& r : result) out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

// A replay of training would not redo what the function does: the snapshot first.
std::vector<json> Trainer::foreach_worker(const std::string& name, const json& arg) {
  const auto run = foreach_command(name, arg, false);
  impl_->flush_snapshot();
  return foreach_results(impl_->call(run), false);
}

std::vector<json> Trainer::foreach_model(const std::string& name, const json& arg) {
  const auto run = foreach_command(name, arg, true);
  impl_->flush_snapshot();
  return foreach_results(impl_->call(run), true);
}

std::shared_ptr<torch::nn::Module> Trainer::get_model(size_t index) {
  auto& d = *impl_;
  const std::string state = d.recovering([&] { return d.fetch_state(d.pool->members().at(0)); });
  if (!d.local) {
    torch_glue::ReplicaOptions o;
    o.global_batch = d.config.batch_size;
    o.seed = d.config.seed;
    o.info.seed = d.config.seed;
    o.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    d.local = std::make_unique<torch_glue::ReplicaRuntime>(make_operator(d.op_name), o);
    d.local->setup(d.config.config);
  }
  d.local->load_state(state);
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
  try {
    d.collect_checkpoints(/*wait=*/true);
  } catch (const std::exception& e) {
    control::log().warn("trainer: shutdown: {}", e.what());
  }
  if (d.server && !d.broken) {
    try {
      d.server->call(command(&proto::Command::mutable_shutdown), milliseconds(5000), [&] { d.pool->check_children(); });
    } catch (const std::exception& e) {
      control::log().debug("trainer: shutdown: {}", e.what());
    }
  }
  d.save_history(/*ended=*/true);
  if (d.driver_state) {  // its workers are told to stop: nothing for a later driver to take up
    try {
      d.driver_state->write_ended();
    } catch (const std::exception& e) {
      control::log().warn("trainer: {}", e.what());
    }
  }
  d.metrics.reset();  // its scrapes read the server
  if (d.server) {
    d.announce_to_servers("stop");
    d.server->stop_workers();
  }
  if (d.pool) d.pool->stop(3000);
  d.pool.reset();
  d.server.reset();
  remove_orphaned_segments();
  if (!d.config.checkpoints.dir.empty()) {  // an evaluator stops once it has evaluated what came before
    try {
      runtime::mark_job_ended(d.config.checkpoints.dir, true);
    } catch (const std::exception& e) {
      control::log().warn("trainer: cannot mark the job's end in {}: {}", d.config.checkpoints.dir, e.what());
    }
  }
}

const TrainerConfig& Trainer::config() const { return impl_->config; }

int64_t Trainer::parameter_count() const { return impl_->parameters; }

std::optional<JobPosition> Trainer::restarted_at() const { return impl_->restarted_at; }

std::string Trainer::address() const { return impl_->listen_address; }

const std::string& Trainer::token() const { return impl_->token; }
bool Trainer::tls() const { return impl_->tls; }

}  // namespace dsgd
