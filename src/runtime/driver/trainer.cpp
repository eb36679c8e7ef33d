// The Trainer's calls, each turned into commands to every member by the driver's engine,
// runtime::Job (runtime/driver/job.h, whose parts have a file each here), and the Job's own
// calls: commands to the members, surviving lost workers.
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
#include "runtime/driver/job.h"
#include "runtime/driver/worker_pool.h"
#include "runtime/launch/fork_server.h"
#include "runtime/launch/spawn.h"
#include "runtime/worker/job_spec.h"
#include "runtime/worker/malloc_tuning.h"
#include "runtime/worker/ps_server_process.h"
#include "runtime/worker/trace_file.h"
#include "runtime/worker/worker.h"
#include "runtime/worker/worker_functions.h"

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

namespace runtime {

std::vector<proto::CommandResult> Job::raw_call(const proto::Command& request, std::vector<int> targets,
                                                const std::function<void()>& extra_tick, milliseconds timeout) {
  const bool everyone = targets.empty() || targets == pool->members();
  if (targets.empty()) targets = pool->members();
  using C = proto::Command;
  const auto kind = request.request_case();
  const bool changes = kind == C::kSetState || kind == C::kTrain || kind == C::kRun || kind == C::kStepSchedules ||
                       kind == C::kShareState || kind == C::kReadShare;
  if (changes) members_settled = false;  // one member's change cut short leaves the others apart
  auto out = server->call(request, timeout, [&] {
    restart.touch();  // for a successor: when this driver was last alive
    pool->check_children();
    pool->tend(generation, signature);  // standbys and new workers set up meanwhile
    if (extra_tick) extra_tick();
  }, std::move(targets));
  if (changes && everyone) members_settled = true;
  return out;
}

std::vector<proto::CommandResult> Job::call(const proto::Command& request, bool first_only,
                                            const std::function<void()>& extra_tick) {
  return recovering([&] {
    std::vector<int> targets;
    if (first_only) targets = {pool->members().at(0)};
    return raw_call(request, targets, extra_tick);
  });
}

void Job::ensure_usable() const {
  if (stopped) throw Error("the trainer was shut down");
  if (broken) {
    throw Error(
        "the trainer is unusable after an earlier failure; create a new Trainer (or load a checkpoint into one)");
  }
}

void Job::fail(const std::string& why) {
  broken = true;
  server->stop_workers();
  throw Error(why);
}

}  // namespace runtime

namespace {

// What a train call counts afresh: its recoveries (the start-up's in the first), snapshot
// seconds, checkpoint failures, straggler changes.
void begin_train_call(runtime::Job& d) {
  d.recovery.begin_call();
  d.chunks.begin_call();
  d.state.begin_call();
  d.checkpoints.begin_call();
  d.stragglers.begin_call();
}

std::unique_ptr<runtime::Job> validated_job(const std::string& operator_name, TrainerConfig config) {
  validate_config(operator_name, config);
  return std::make_unique<runtime::Job>(operator_name, std::move(config));
}

}  // namespace

Trainer::Trainer(const std::string& operator_name, TrainerConfig config)
    : job_(validated_job(operator_name, std::move(config))) {
  const auto started = Clock::now();
  auto& d = *job_;
  auto& c = d.config;
  control::DriverServerOptions so;
  so.job = runtime::make_job_spec(operator_name, c);
  const std::optional<runtime::DriverState> previous = d.restart.open(so.job);  // a lost driver's job
  const std::string token = previous ? previous->token : c.launch.token.empty() ? random_token() : c.launch.token;
  const control::TlsKeys tls = previous ? control::decode_keys(previous->tls_keys) : runtime::job_tls_keys(c);
  d.secrets = runtime::JobSecrets{token, control::encode_keys(tls)};
  remove_orphaned_segments();
  so.listen = previous ? previous->address : c.launch.listen.empty() ? "127.0.0.1:0" : c.launch.listen;
  so.token = token;
  so.tls = tls;
  so.num_workers = c.num_workers;
  so.standby_workers = c.recovery.standby_workers;
  so.world_size = c.num_workers * c.devices_per_worker;
  so.heartbeat_timeout = c.recovery.heartbeat_timeout;
  so.reduce_timeout = c.comm.timeout;
  d.restart.start_server(&so, previous);
  d.address = so.listen.substr(0, so.listen.rfind(':')) + ":" + std::to_string(d.server->port());
  std::string binary;  // what the workers the driver starts run
  if (runtime::launcher_of(c) != Launcher::kNone)
    binary = c.launch.worker_binary.empty() ? runtime::self_executable() : c.launch.worker_binary;
  d.pool = std::make_unique<runtime::WorkerPool>(c, *d.server, binary, d.secrets);
  if (!c.checkpoints.dir.empty()) runtime::mark_job_ended(c.checkpoints.dir, false);  // this job runs now

  try {
    d.monitor.start();
    if (!previous || !d.restart.resume(*previous, started)) {
      if (d.pool->spawns()) {
        d.pool->spawn_initial();
      } else {
        control::log().info(
            "driver: waiting for {} worker(s): start each with --dsgd-worker --driver {} --token {}{}",
            c.recovery.min_workers > 0
                ? fmt::format("{} to {}", c.recovery.min_workers, c.num_workers)  // elastic: starts at the first
                : std::to_string(c.num_workers),
            address(), token, d.tls() ? " --tls-dir DIR (DIR: this job's ca.pem, cert.pem, key.pem)" : "");
      }
      d.group.start_up();
      if (d.restart.enabled()) d.checkpoints.persist(0, 0, 0);  // a restart before the first interval starts here
    }
    d.monitor.publish();
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
  if (!options.trace_path.empty()) runtime::check_trace_path(options.trace_path);
  auto& d = *job_;
  d.ensure_usable();
  begin_train_call(d);
  d.recovery.try_scale_up();  // lost workers replaced since the last call join now
  const auto t0 = Clock::now();
  int64_t done = 0;  // steps completed in earlier chunks of this call
  const std::function<void()> tick = d.chunks.progress_tick(options, done, t0);
  // Chunks of checkpoint_every_steps (more for costly snapshots), a snapshot after each unless
  // it would come too soon (runtime/driver/snapshot_policy.h): a recovery redoes at most one interval.
  std::vector<Results> chunks;
  double step_s = 0;  // seconds per step in the last chunk
  runtime::TraceFile trace;
  auto& policy = d.state.policy();
  while (true) {
    int64_t chunk = policy.next_chunk(step_s);
    if (options.num_steps > 0) chunk = chunk > 0 ? std::min(chunk, options.num_steps - done) : options.num_steps - done;
    const bool want_size = policy.wants_size();  // for the snapshot's predicted cost
    proto::Command request;
    proto::TrainRequest& args = *request.mutable_train();
    args.set_profile(options.profile);
    args.set_trace(!options.trace_path.empty());
    args.set_state_bytes(want_size);
    const bool choose_overlap = d.config.comm.forward_overlap_buckets < 0;
    const int64_t planned = chunk;
    if (choose_overlap) chunk = d.chunks.overlap_trial(&args, chunk);
    args.set_max_batches(chunk);
    const auto chunk_t0 = Clock::now();
    int64_t kept = 0;
    auto outs = d.chunks.train(&request, tick, &kept);
    Results r = runtime::results_of_command(outs, true);
    d.chunks.note_caught_up(static_cast<int64_t>(r.metrics.count("batches") ? r.metrics.at("batches") : 0));
    if (kept > 0) d.chunks.count_kept_steps(&r, kept);
    if (!options.trace_path.empty()) {
      d.chunks.add_traces(outs, std::chrono::duration<double, std::micro>(chunk_t0 - t0).count(), &trace);
    }
    const int64_t batches = static_cast<int64_t>(r.metrics.count("batches") ? r.metrics.at("batches") : 0);
    if (want_size && batches > 0 && !outs.empty()) {
      if (const int64_t n = outs[0].epoch().state_bytes(); n > 0) policy.resized(static_cast<size_t>(n));
    }
    if (choose_overlap) d.chunks.record_overlap_trial(outs, batches);
    const double chunk_step_s =
        batches > 0 ? std::chrono::duration<double>(Clock::now() - chunk_t0).count() / static_cast<double>(batches)
                    : step_s;
    // A worker lost between the chunk's end and its snapshot: the recovery went back to the
    // chunk's start, so the chunk is done again.
    const bool call_ends =
        r.batch == 0 || batches == 0 || (options.num_steps > 0 && done + batches >= options.num_steps);
    const bool cut_short = choose_overlap && !call_ends && (planned == 0 || chunk < planned);  // trials
    const bool deferred = policy.defer(batches, chunk_step_s, {r.epoch, r.batch}, cut_short);
    if (!deferred && !d.state.take_or_recover()) continue;
    chunks.push_back(r);
    done += batches;
    d.steps_done += batches;
    step_s = chunk_step_s;
    d.monitor.publish(chunk_step_s > 0 ? static_cast<double>(d.config.batch_size) / chunk_step_s : 0);
    // A checkpoint_dir's: from the snapshot, or (by the workers) at every chunk's end but a trial's.
    if (!deferred || (d.checkpoints.by_workers() && !cut_short)) {
      d.checkpoints.persist(r.epoch, r.batch, r.batches_per_epoch);
    }
    if (call_ends || chunk == 0) break;
    d.recovery.try_scale_up();
  }
  Results total = runtime::merge_chunks(chunks, options.profile, options.reduce_results);
  if (options.profile) total.metrics["snapshot_s"] = d.state.call_seconds();
  if (!options.trace_path.empty()) {
    d.stragglers.add_notes(&trace, t0);
    trace.write(options.trace_path);
    control::log().info("trainer: trace of {} events written to {}{}", trace.num_events(), options.trace_path,
                        trace.dropped() > 0
                            ? " (" + std::to_string(trace.dropped()) + " more dropped: the limit per chunk)"
                            : std::string());
  }
  d.checkpoints.end_call(&total);  // a call returns with its checkpoints on disk
  total.recoveries = d.recovery.events();
  total.stragglers = d.stragglers.take_named();
  return total;
}

void Trainer::set_callbacks(std::function<void(const TrainProgress&)> on_progress,
                            std::function<void(const RecoveryEvent&)> on_recovery) {
  job_->config.on_progress = std::move(on_progress);
  job_->config.on_recovery = std::move(on_recovery);
}

Results Trainer::validate() {
  auto& d = *job_;
  d.recovery.begin_call();
  Results r = runtime::results_of_command(d.call(runtime::command(&proto::Command::mutable_validate)), false);
  r.recoveries = d.recovery.events();  // a worker lost while the replicas evaluated
  d.monitor.record_validation(r);
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
  job_->state.flush();
  return foreach_results(job_->call(run), false);
}

std::vector<json> Trainer::foreach_model(const std::string& name, const json& arg) {
  const auto run = foreach_command(name, arg, true);
  job_->state.flush();
  return foreach_results(job_->call(run), true);
}

std::shared_ptr<torch::nn::Module> Trainer::get_model(size_t index) { return job_->state.model(index); }

int Trainer::ready_standbys() {
  auto& d = *job_;
  if (!d.pool) return 0;
  d.pool->tend(d.generation, d.signature);
  return static_cast<int>(d.pool->ready().size());
}

void Trainer::shutdown() {
  auto& d = *job_;
  if (d.stopped) return;
  d.stopped = true;
  try {
    d.checkpoints.collect(/*wait=*/true);
  } catch (const std::exception& e) {
    control::log().warn("trainer: shutdown: {}", e.what());
  }
  if (d.server && !d.broken) {
    try {
      d.server->call(runtime::command(&proto::Command::mutable_shutdown), milliseconds(5000),
                     [&] { d.pool->check_children(); });
    } catch (const std::exception& e) {
      control::log().debug("trainer: shutdown: {}", e.what());
    }
  }
  d.monitor.save_history(/*ended=*/true);
  d.restart.ended();
  d.monitor.stop();  // its scrapes read the server
  if (d.server) {
    d.group.announce_to_servers("stop");
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

const TrainerConfig& Trainer::config() const { return job_->config; }

int64_t Trainer::parameter_count() const { return job_->parameters; }

std::optional<JobPosition> Trainer::restarted_at() const { return job_->restart.restarted_at(); }

std::string Trainer::address() const { return job_->address; }

const std::string& Trainer::token() const { return job_->secrets.token; }
bool Trainer::tls() const { return job_->tls(); }

}  // namespace dsgd
