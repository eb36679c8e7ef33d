#include "runtime/worker/worker.h"

#include <signal.h>
#include <sys/prctl.h>
#include "control/log.h"
#include <unistd.h>

#include <ATen/Parallel.h>
#include <torch/serialize.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "dsgd/comm/hierarchical.h"
#include "dsgd/common/error.h"
#include "dsgd/torch/operator.h"
#include "dsgd/torch/self_contained_model.h"
#include "control/driver_service.h"
#include "control/store_service.h"
#include "runtime/worker/crash_stack.h"
#include "runtime/worker/job_spec.h"
#include "runtime/worker/malloc_tuning.h"
#include "runtime/worker/ps_server_process.h"
#include "runtime/worker/trace_file.h"
#include "runtime/worker/worker_functions.h"
#include "runtime/worker/worker_shares.h"
#include "strategy/strategy.h"
#include "torch/replica/replica.h"
#include "torch/state/replica_state.h"

namespace dsgd::runtime {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

class Worker {
 public:
  Worker(control::DriverClient& client, std::string token, int64_t index, proto::JobSpec job, std::string address,
         std::string host_id)
      : client_(client), token_(std::move(token)), index_(index), job_(std::move(job)),
        settings_(job_settings(job_)), address_(std::move(address)), host_id_(std::move(host_id)) {
    dpw_ = settings_.devices_per_worker;
    world_ = settings_.num_workers * dpw_;
    int threads = settings_.threads_per_worker;
    if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
    threads_per_replica_ = std::max(1, threads / dpw_);
    at::set_num_threads(threads_per_replica_);
    // A driver that restarts in place (recovery.driver_state_dir) finds its workers alive: they
    // outlive the process that started them, and their calls wait for the next one.
    if (!settings_.recovery.driver_state_dir.empty()) {
      ::prctl(PR_SET_PDEATHSIG, 0);
      client_.set_driver_grace(settings_.recovery.driver_grace);
    }
  }

  int serve() {
    std::thread heartbeat([this] { heartbeat_loop(); });
    int rc = 0;
    try {
      while (!stop_) {
        // A long poll, answered at once by a command or the job's end: its length only sets how
        // many idle calls the driver answers (each worker's were half its load at 128 workers).
        const proto::Command cmd = client_.poll(index_, milliseconds(5000));
        if (cmd.id() == 0) continue;
        busy_ = true;
        proto::CommandResult result;
        try {
          result = run(cmd);
          result.set_ok(true);
        } catch (const std::exception& e) {
          result.Clear();
          result.set_error(e.what());
          result.set_error_kind(error_kind(e));
          if (const auto* data = dynamic_cast<const DataError*>(&e)) result.set_error_path(data->path());
          control::log().error("worker {}: {} failed: {}", index_, control::command_name(cmd), e.what());
        }
        result.set_worker(index_);
        result.set_id(cmd.id());
        busy_ = false;  // before its result lands: the driver may end the job at once after it
        client_.complete(result);
        if (cmd.has_shutdown()) stop_ = true;
      }
    } catch (const std::exception& e) {
      control::log().error("worker {}: lost the driver at {}: {}; exiting", index_, client_.address(), e.what());
      rc = 3;
    }
    stop_ = true;
    client_.set_driver_grace(milliseconds(0));  // the job is over for this worker: no waiting for a driver
    heartbeat.join();
    {
      std::lock_guard<std::mutex> lock(strategies_mutex_);
      for (auto& s : strategies_) {
        if (s) s->abort("worker shutting down");
      }
    }
    replicas_.clear();
    groups_.clear();
    return rc;
  }

  ~Worker() {
    if (retiring_.joinable()) retiring_.join();
  }

 private:
  // Long-polls the driver: a beat at least every `interval` (the driver's liveness check), and
  // an abort of the group heard within moments of the driver's decision.
  void heartbeat_loop() {
    const auto interval = std::clamp(settings_.recovery.heartbeat_timeout / 4, milliseconds(100), milliseconds(1000));
    int64_t known_abort = 0;
    while (!stop_) {
      try {
        json p;
        if (auto* r = progress_source_.load()) {
          p["chunk"] = progress_chunk_.load();  // before batches: a new chunk's are reset by then
          p["batches"] = r->times().progress().batches.load();
          p["loss"] = r->times().progress().loss.load();
          p["batches_per_epoch"] = r->times().progress().batches_per_epoch.load();
          p["step_s"] = r->times().progress().step_s.load();
          p["step"] = r->times().progress().step.load();
          p["timed_steps"] = r->times().progress().timed_steps.load();
          p["compute_s"] = r->times().progress().compute_s.load();
          p["wait_s"] = r->times().progress().wait_s.load();
        }
        const auto beat = client_.heartbeat(index_, p.is_null() ? std::string() : p.dump(), known_abort, interval,
                                            std::max(settings_.recovery.heartbeat_timeout / 2, milliseconds(500)));
        known_abort = std::max(known_abort, beat.abort_generation);
        if (beat.abort_generation > 0 && beat.abort_generation >= generation_)
          abort_communication(beat.abort_generation);
        if (beat.stop) {
          if (busy_) {
            control::log().warn("worker {}: the driver ended the job during a command; exiting", index_);
            std::_Exit(0);
          }
          stop_ = true;
        }
      } catch (const std::exception& e) {
        if (client_.since_answered() > settings_.recovery.heartbeat_timeout) {
          control::log().error("worker {}: no answer from the driver at {} for {} ms ({}); exiting", index_,
                        client_.address(), settings_.recovery.heartbeat_timeout.count(), e.what());
          std::_Exit(4);
        }
        std::this_thread::sleep_for(interval);
      }
    }
  }

  // Recovery: the driver lost a worker; fail whatever waits on the old group at once.
  void abort_communication(int64_t generation) {
    std::lock_guard<std::mutex> lock(strategies_mutex_);
    if (aborted_generation_ >= generation) return;
    aborted_generation_ = generation;
    for (auto& s : strategies_) {
      if (s) s->abort("the driver is re-forming the job (generation " + std::to_string(generation) + " aborted)");
    }
  }

  // Runs fn(replica index) for every replica: inline for one, one thread each for more.
  void each_replica(const std::function<void(int)>& fn) {
    if (dpw_ == 1) {
      fn(0);
      return;
    }
    std::vector<std::exception_ptr> errors(static_cast<size_t>(dpw_));
    std::vector<std::thread> threads;
    for (int i = 0; i < dpw_; ++i) {
      threads.emplace_back([&, i] {
        try {
          at::set_num_threads(threads_per_replica_);
          fn(i);
        } catch (...) {
          errors[static_cast<size_t>(i)] = std::current_exception();
          // One replica failing leaves the others waiting in a collective: fail them too.
          std::lock_guard<std::mutex> lock(strategies_mutex_);
          for (auto& s : strategies_) {
            if (s) s->abort("replica " + std::to_string(i) + " of this worker failed");
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
  }

  // One command: its handler, and the reply it gives.
  proto::CommandResult run(const proto::Command& cmd) {
    proto::CommandResult out;
    shares_.wait_for_copy(cmd);
    using C = proto::Command;
    switch (cmd.request_case()) {
      case C::kSetup: *out.mutable_setup() = on_setup(cmd.setup()); break;
      case C::kConnect: connect(cmd.connect().placement()); break;
      case C::kStateChunk: on_state_chunk(cmd.state_chunk()); break;
      case C::kSetState: on_set_state(cmd.set_state()); break;
      case C::kGetFeedback: *out.mutable_feedback() = on_get_feedback(); break;
      case C::kGatherState: on_gather_state(cmd.gather_state()); break;
      case C::kGetState: *out.mutable_state() = on_get_state(cmd.get_state()); break;
      case C::kShareState: on_share_state(cmd.share_state()); break;
      case C::kReadState: *out.mutable_state() = on_read_state(cmd.read_state()); break;
      case C::kGetPickle: *out.mutable_pickle() = on_get_pickle(); break;
      case C::kWriteShare: *out.mutable_share() = shares_.write(replicas_, cmd.write_share(), settings_); break;
      case C::kFinishShare: *out.mutable_share() = shares_.finish(); break;
      case C::kReadShare: *out.mutable_share() = read_shares(replicas_, cmd.read_share()); break;
      case C::kTrain: *out.mutable_epoch() = on_epoch(&cmd.train()); break;
      case C::kValidate: *out.mutable_epoch() = on_epoch(nullptr); break;
      case C::kRun: *out.mutable_run() = on_run(cmd.run()); break;
      case C::kPosition: *out.mutable_position() = position(); break;
      case C::kStepSchedules: for (auto& r : replicas_) r->step_schedules(); break;
      case C::kPing: break;      // idle: answered
      case C::kShutdown: break;  // answered, then serve() stops
      case C::REQUEST_NOT_SET:
        throw ConfigError("a command this worker does not know: start the workers from the same dsgd build as the "
                          "driver");
    }
    if (out.reply_case() == proto::CommandResult::REPLY_NOT_SET) out.mutable_done();
    return out;
  }

  static proto::ErrorKind error_kind(const std::exception& e) {
    if (dynamic_cast<const ConfigError*>(&e)) return proto::ERROR_KIND_CONFIG;
    if (dynamic_cast<const TimeoutError*>(&e)) return proto::ERROR_KIND_TIMEOUT;
    if (dynamic_cast<const CommError*>(&e)) return proto::ERROR_KIND_COMM;
    if (dynamic_cast<const DataError*>(&e)) return proto::ERROR_KIND_DATA;
    return proto::ERROR_KIND_OTHER;
  }

  torch_glue::ReplicaRuntime& replica(int i) { return *replicas_.at(static_cast<size_t>(i)); }

  proto::Position position() {
    proto::Position p;
    p.set_epoch(replicas_.at(0)->position().epoch);
    p.set_batch(replicas_.at(0)->position().batch);
    for (const auto& r : replicas_) p.set_torn(p.torn() || r->boundary().torn());
    return p;
  }

  proto::SetupReply on_setup(const proto::SetupRequest& in) {
    place(in.placement());
    setup();
    if (in.standby()) each_replica([&](int i) { replica(i).make_spare_state(); });
    return setup_reply(replicas_, settings_, world_);
  }

  // Every replica takes part; only the worker whose state is read next ("keep") keeps a copy.
  void on_gather_state(const proto::GatherStateRequest& in) {
    each_replica([&](int i) { replica(i).gather_server_state(/*keep=*/in.keep() == index_ && i == 0); });
    if (in.keep() != index_) {
      for (auto& r : replicas_) r->drop_server_state_copy();
    }
  }

  void on_state_chunk(const proto::StateChunk& in) {
    if (in.offset() == 0) transfer_.incoming.clear();
    if (in.offset() != transfer_.incoming.size()) {
      throw Error("state chunk at byte " + std::to_string(in.offset()) + ", expected " +
                  std::to_string(transfer_.incoming.size()) + ": the driver's pieces came out of order");
    }
    transfer_.incoming.append(in.data());
  }

  // Feedback saved by a world of another size is no one's here: each replica starts from zero.
  void on_set_state(const proto::SetStateRequest& in) {
    const auto& fb = in.feedback();
    const bool ours = static_cast<int>(fb.size()) == world_;
    each_replica([&](int i) {
      const auto it = ours ? fb.find(rank_base_ + i) : fb.end();
      replica(i).load_state(transfer_.incoming, it != fb.end() ? it->second : std::string());
    });
    std::string().swap(transfer_.incoming);
  }

  void on_share_state(const proto::ShareStateRequest& in) {
    const bool load = std::find(in.load().begin(), in.load().end(), index_) != in.load().end();
    each_replica([&](int i) {
      strategy::Sharing* sharing = nullptr;
      {
        std::lock_guard<std::mutex> lock(strategies_mutex_);
        const auto& s = strategies_.at(static_cast<size_t>(i));
        sharing = s ? s->sharing() : nullptr;
      }
      if (sharing == nullptr) throw Error("share_state needs a strategy whose group broadcasts (allreduce)");
      const auto t0 = Clock::now();
      const bool root = rank_base_ + i == in.root();
      const size_t bytes = replica(i).share_state(*sharing, static_cast<int>(in.root()), load);
      control::log().debug("worker {}: state of {} bytes {} over the group in {:.3f} s", index_, bytes,
                           root ? "sent" : load ? "received and loaded" : "passed",
                           std::chrono::duration<double>(Clock::now() - t0).count());
    });
  }

  proto::FeedbackReply on_get_feedback() {
    proto::FeedbackReply out;
    for (int i = 0; i < dpw_; ++i) {
      std::string bytes = replica(i).save_feedback();
      if (!bytes.empty()) (*out.mutable_feedback())[rank_base_ + i] = std::move(bytes);
    }
    return out;
  }

  proto::StateReply on_get_state(const proto::GetStateRequest& in) {
    const auto t0 = Clock::now();
    transfer_.outgoing = replicas_.at(0)->save_state();
    for (auto& r : replicas_) r->drop_server_state_copy();  // saved: the servers hold it
    control::log().debug("worker {}: state of {} bytes serialised in {:.3f} s", index_, transfer_.outgoing.size(),
                         std::chrono::duration<double>(Clock::now() - t0).count());
    proto::ReadStateRequest first;
    first.set_bytes(in.chunk_bytes() > 0 ? in.chunk_bytes() : transfer_.outgoing.size());
    return on_read_state(first);
  }

  // A piece of the state the last get_state serialised; the bytes go with the last piece.
  proto::StateReply on_read_state(const proto::ReadStateRequest& in) {
    const size_t total = transfer_.outgoing.size();
    if (in.offset() > total) {
      throw Error("read_state at byte " + std::to_string(in.offset()) + " of a state of " + std::to_string(total) +
                  " bytes: no get_state before it");
    }
    proto::StateReply out;
    out.set_total(total);
    const size_t n = std::min<size_t>(in.bytes(), total - in.offset());
    if (in.offset() == 0 && n == total) {
      out.set_state(std::move(transfer_.outgoing));  // whole: nothing to copy
    } else {
      out.set_state(transfer_.outgoing.substr(in.offset(), n));
    }
    if (in.offset() + n >= total) std::string().swap(transfer_.outgoing);
    return out;
  }

  proto::PickleReply on_get_pickle() {
    proto::PickleReply out;
    out.set_pickle(model_pickle(replicas_));
    auto& first = *replicas_.at(0);
    if (first.options().step.zero_stage == 3) {
      for (auto& r : replicas_) r->drop_server_state_copy();  // sharded again
    }
    return out;
  }

  // train (`train` set) or validate (null) on every replica.
  proto::EpochReply on_epoch(const proto::TrainRequest* train) {
    if (train != nullptr && train->results_only()) {  // the chunk's reply again, or none
      if (train->chunk() != 0 && last_chunk_.first == train->chunk()) return last_chunk_.second;
      proto::EpochReply out;
      out.set_untrained(true);
      *out.mutable_position() = position();
      out.set_batches_per_epoch(replicas_[0]->batches_per_epoch());
      return out;
    }
    std::vector<Metrics> parts(static_cast<size_t>(dpw_));
    for (auto& r : replicas_) r->times().progress().batches = 0;
    progress_chunk_ = train != nullptr ? train->chunk() : 0;  // after the reset: see heartbeat_loop
    // forward_overlap_buckets chosen by the driver (-1 in the job): T for this call, 0 when the
    // call names none (a replay), the same on every worker.
    const bool chosen_overlap = train != nullptr && settings_.comm.forward_overlap_buckets < 0;
    const bool trace = train != nullptr && train->trace();
    if (trace) comm::timeline::start();
    try {
      each_replica([&](int i) {
        auto& r = replica(i);
        if (chosen_overlap)
          r.set_forward_overlap_buckets(static_cast<size_t>(std::max(0, train->forward_overlap_buckets())));
        parts[static_cast<size_t>(i)] = train ? r.train(train->max_batches(), train->profile()) : r.validate();
      });
    } catch (...) {
      if (trace) comm::timeline::stop();
      throw;
    }
    proto::EpochReply out;
    if (trace) out.set_trace_json(runtime::trace_json(comm::timeline::stop()).dump());
    for (const auto& [k, v] : weighted_mean(parts)) (*out.mutable_metrics())[k] = v;
    if (const double mib = peak_resident_mib(); mib > 0) (*out.mutable_metrics())["peak_rss_mib"] = mib;
    if (chosen_overlap) {  // for the driver's choice (trainer.cpp, OverlapTuner)
      double steady = 0;
      for (auto& r : replicas_) steady = std::max(steady, r->times().steady_step_seconds());
      out.set_steady_step_s(steady);
      out.set_buckets(static_cast<int64_t>(replicas_[0]->num_buckets()));
    }
    if (train != nullptr && train->state_bytes()) {  // for the driver's snapshot schedule (SnapshotPolicy)
      const auto t0 = Clock::now();
      out.set_state_bytes(static_cast<int64_t>(replicas_[0]->state_bytes()));
      control::log().debug("worker {}: state of {} bytes counted in {:.3f} s", index_, out.state_bytes(),
                           std::chrono::duration<double>(Clock::now() - t0).count());
    }
    *out.mutable_position() = position();
    out.set_batches_per_epoch(replicas_[0]->batches_per_epoch());
    if (train != nullptr) last_chunk_ = {train->chunk(), out};
    return out;
  }

  proto::RunReply on_run(const proto::RunRequest& in) {
    auto fn = find_worker_function(in.name());
    const json arg = in.arg_json().empty() ? json() : json::parse(in.arg_json());
    proto::RunReply out;
    if (!in.every_replica()) {
      out.set_result_json(fn(replicas_.empty() ? nullptr : &replicas_[0]->op(), arg).dump());
      return out;
    }
    json results = json::array();
    for (auto& r : replicas_) results.push_back(fn(&r->op(), arg));
    out.set_result_json(results.dump());
    return out;
  }

  void setup() {
    const json& config = settings_.config;
    const std::string& hook = settings_.initialization_hook;
    if (!hook.empty()) find_worker_function(hook)(nullptr, config);
    progress_source_ = nullptr;
    replicas_.clear();
    for (int i = 0; i < dpw_; ++i) {
      const ReplicaInfo info{rank_base_ + i, world_, position_, i, settings_.seed};
      replicas_.push_back(std::make_unique<torch_glue::ReplicaRuntime>(
          make_operator(job_.operator_name()), replica_options(settings_, info, threads_per_replica_)));
    }
    // One after the other: setup draws from LibTorch's global generator (seeded per replica).
    for (auto& r : replicas_) r->setup(config);
    for (auto& r : replicas_) {
      if (r->signature() != replicas_[0]->signature()) {
        throw ConfigError("the replicas of worker " + std::to_string(index_) +
                          " built different models from one config");
      }
    }
    progress_source_ = replicas_[0].get();
  }

  // This worker's place in the job: its position among placement's live workers.
  void place(const proto::Placement& placement) {
    const auto it = placement.ranks().find(index_);
    if (it == placement.ranks().end()) {
      throw ConfigError("worker " + std::to_string(index_) + " is not in the placement of generation " +
                        std::to_string(placement.generation()));
    }
    position_ = it->second;
    world_ = placement.num_workers() * dpw_;
    rank_base_ = position_ * dpw_;
  }

  // The old groups go on a thread of their own: unmapping a host's shared gradients (0.17 s at
  // gpt-base) need not delay the new group.
  void retire_groups() {
    std::vector<std::shared_ptr<strategy::GradientStrategy>> old_strategies;
    {
      std::lock_guard<std::mutex> lock(strategies_mutex_);
      old_strategies.swap(strategies_);
    }
    if (retiring_.joinable()) retiring_.join();
    retiring_ = std::thread([s = std::move(old_strategies), g = std::exchange(groups_, {})]() mutable {
      s.clear();  // each strategy before its group
      g.clear();
    });
  }

  // Joins the placement's generation of the group.
  void connect(const proto::Placement& placement) {
    const Strategy strategy = settings_.strategy.value();
    const int64_t generation = placement.generation();
    const auto t0 = Clock::now();
    place(placement);
    for (auto& r : replicas_) r->attach(nullptr);  // hooks off before the old strategies go
    retire_groups();
    const auto t1 = Clock::now();
    generation_ = generation;
    for (int i = 0; i < dpw_; ++i) replicas_[static_cast<size_t>(i)]->set_info(rank_base_ + i, world_, position_);
    if (world_ == 1) return;
    const auto moved = placement.hosts().find(index_);  // a standby in a lost worker's place
    const std::string host =
        moved != placement.hosts().end() ? moved->second : host_id_;  // one replica: nothing to average, no hooks
    std::vector<std::shared_ptr<strategy::GradientStrategy>> strategies(static_cast<size_t>(dpw_));
    groups_.assign(static_cast<size_t>(dpw_), nullptr);
    const strategy::StrategyOptions so = strategy_options(settings_);
    if (strategy == Strategy::kSimple) {  // the driver averages: no group
      for (int i = 0; i < dpw_; ++i) {
        const int64_t rank = rank_base_ + i;
        auto o = so;
        o.central_average = [&client = client_, generation, rank, timeout = settings_.comm.timeout](
                                uint64_t seq, float* data, size_t count) {
          client.average(generation, rank, seq, data, count, timeout);
        };
        strategies[static_cast<size_t>(i)] = strategy::make_strategy(o, nullptr);
      }
    } else {
      if (!store_) {  // one channel (one TLS handshake) for every generation
        control::StoreClientOptions store_options;
        store_options.tls = client_.tls();
        store_ = control::connect_store(client_.address(), token_, store_options);
      }
      auto base = store_;
      const std::string prefix = "gen" + std::to_string(generation) + "/";
      each_replica([&](int i) {
        auto store = std::make_shared<comm::PrefixStore>(base, prefix);
        comm::GroupOptions go;
        go.bind_address = address_;
        go.host = host;
        go.timeout = settings_.comm.timeout;
        comm::ShmOptions sho;
        sho.timeout = settings_.comm.timeout;
        sho.shared_bytes = replicas_[static_cast<size_t>(i)]->gradient_bytes(world_);  // gradients live there
        const int rank = rank_base_ + i;
        auto group =
            std::shared_ptr<comm::HierarchicalGroup>(comm::HierarchicalGroup::create(store, rank, world_, go, sho));
        groups_[static_cast<size_t>(i)] = group;
        auto o = so;
        o.join_ps_servers = [store, group, go](int shards) { return join_ps_servers(store, *group, shards, go); };
        strategies[static_cast<size_t>(i)] = strategy::make_strategy(o, group);
      });
    }
    {
      std::lock_guard<std::mutex> lock(strategies_mutex_);
      strategies_ = strategies;
      // An abort for this generation may have come while the group formed.
      if (aborted_generation_ >= generation) {
        for (auto& st : strategies_) st->abort("generation " + std::to_string(generation) + " aborted");
      }
    }
    const auto t2 = Clock::now();
    for (int i = 0; i < dpw_; ++i) replicas_[static_cast<size_t>(i)]->attach(strategies[static_cast<size_t>(i)]);
    const auto seconds = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    control::log().debug("worker {}: generation {} connected in {:.3f} s (the old group left {:.3f}, the new "
                         "formed {:.3f}, hooks attached {:.3f})",
                         index_, generation, seconds(t0, Clock::now()), seconds(t0, t1), seconds(t1, t2),
                         seconds(t2, Clock::now()));
  }

  control::DriverClient& client_;
  std::shared_ptr<comm::Store> store_;  // the driver's rendezvous store, once connected
  struct StateTransfer {   // the whole state's, in pieces (control.proto's StateChunk)
    std::string incoming;  // StateChunks so far
    std::string outgoing;  // the state get_state serialised, until its last piece is read
  } transfer_;
  BackgroundShares shares_;  // periodic checkpoints' writes
  const std::string token_;
  const int64_t index_;
  const proto::JobSpec job_;
  const TrainerConfig settings_;  // job_'s settings, read once
  const std::string address_;
  const std::string host_id_;
  int dpw_ = 1;
  int world_ = 1;
  int threads_per_replica_ = 1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};
  std::atomic<torch_glue::ReplicaRuntime*> progress_source_{nullptr};
  std::atomic<uint64_t> progress_chunk_{0};  // TrainRequest::chunk of the batches in progress
  std::pair<uint64_t, proto::EpochReply> last_chunk_;  // the last chunk trained to its end: for results_only
  std::atomic<int64_t> generation_{0};
  int rank_base_ = 0;
  int position_ = 0;                     // this worker's index among the live workers
  std::mutex strategies_mutex_;          // strategies_ is read by the heartbeat thread
  int64_t aborted_generation_ = 0;       // guarded by strategies_mutex_
  std::vector<std::shared_ptr<comm::HierarchicalGroup>> groups_;
  std::vector<std::shared_ptr<strategy::GradientStrategy>> strategies_;
  std::vector<std::unique_ptr<torch_glue::ReplicaRuntime>> replicas_;  // after strategies_: hooks go first
  std::thread retiring_;  // the last generation's groups, let go of in the background
};

}  // namespace
}  // namespace dsgd::runtime

namespace dsgd {

int run_worker(const WorkerArgs& args) {
  if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) control::log().warn("worker: cannot ignore SIGPIPE");
  runtime::print_stack_on_crash();
  control::TlsKeys tls;
  try {
    tls = runtime::worker_tls_keys(args.tls_ca, args.tls_cert, args.tls_key);
  } catch (const std::exception& e) {
    control::log().error("worker: {}", e.what());
    return 2;
  }
  control::DriverClient client(args.driver, args.token, tls);
  const std::string address = args.address.empty() ? runtime::route_address(args.driver) : args.address;
  const std::string host = runtime::host_name();
  const std::string host_id = args.host_id.empty() ? host : args.host_id;
  control::DriverClient::Registration reg;
  try {
    reg = client.register_worker(host_id, address, ::getpid(), args.spawn_index, args.registration_timeout);
  } catch (const std::exception& e) {
    control::log().error("worker: cannot register with the driver at {}: {}", args.driver, e.what());
    return 2;
  }
  runtime::Worker worker(client, args.token, reg.worker, std::move(reg.job), address, host_id);
  return worker.serve();
}

}  // namespace dsgd
