#include "control/driver_service.h"

#include "control/log.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "dsgd/control.grpc.pb.h"
#include "dsgd/common/error.h"
#include "control/grpc_util.h"
#include "control/store_service.h"

namespace dsgd::control {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct WorkerState {
  WorkerInfo info;
  Clock::time_point last_heartbeat;  // of any call it made
  std::deque<proto::Command> queue;
  std::map<uint64_t, proto::CommandResult> results;
};

// The simple strategy's averages in progress, by sequence number.
struct Average {
  std::vector<std::string> parts;  // by rank
  int arrived = 0;
  int fetched = 0;
  std::string result;
  bool done = false;
};

[[noreturn]] void throw_worker_error(const WorkerInfo& w, const std::string& kind, const proto::CommandResult& r) {
  const std::string msg = "worker " + std::to_string(w.index) + " (host " + w.host + ", pid " + std::to_string(w.pid) +
                          ") failed '" + kind + "': " + r.error();
  switch (r.error_kind()) {
    case proto::ERROR_KIND_CONFIG: throw ConfigError(msg);
    case proto::ERROR_KIND_TIMEOUT: throw TimeoutError(msg, kind, static_cast<int>(w.index), w.host);
    case proto::ERROR_KIND_COMM: throw CommError(msg, kind, static_cast<int>(w.index), w.host);
    case proto::ERROR_KIND_DATA: {  // the file first, as a DataError of this process would name it
      const std::string& path = r.error_path();
      const std::string& what = r.error();
      const std::string problem = what.rfind(path + ": ", 0) == 0 ? what.substr(path.size() + 2) : what;
      throw DataError(path,
                      problem + " (worker " + std::to_string(w.index) + ", host " + w.host + ", in '" + kind + "')");
    }
    default: throw Error(msg);
  }
}

class DriverServerImpl final : public DriverServer, public proto::Driver::Service {
 public:
  explicit DriverServerImpl(const DriverServerOptions& o)
      : options_(o),
        store_(comm::make_memory_store()),
        store_service_(make_store_service(store_, o.token)),
        next_id_(std::max<uint64_t>(1, o.first_command_id)) {
    grpc::ServerBuilder builder;
    configure(builder);
    // Every worker holds two long polls (Heartbeat, Poll), each on a thread of the sync server for
    // its length. At gRPC's default (threads beyond 2 idle ones exit) each call's end stopped a
    // thread and the next call started one: hundreds a second at 128 workers, most of the
    // driver's CPU. Idle threads stay now, as many as the calls that were held at once.
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 1 << 16);
    adopt(o.adopted);  // before the first call
    builder.AddListeningPort(o.listen, server_credentials(o.tls), &port_);
    builder.RegisterService(static_cast<proto::Driver::Service*>(this));
    builder.RegisterService(store_service_.get());
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
      throw CommError("driver: cannot listen on " + o.listen + " (address in use, or not one of this host's?)",
                      "driver serve");
    }
  }
  ~DriverServerImpl() override {
    stop_workers();
    // Let workers hear "stop" in their next heartbeat before the server goes.
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, milliseconds(300), [&] { return false; });
    }
    server_->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
  }

  int port() const override { return port_; }
  std::shared_ptr<comm::Store> store() override { return store_; }
  int64_t rejected_calls() const override { return rejected_; }
  int64_t calls() const override { return calls_served(); }

  void stop_workers() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    notify_everyone();
  }

  void wait_registered(milliseconds timeout, const std::function<void()>& on_tick, int count) override {
    if (count <= 0) count = options_.num_workers;
    // `timeout` without a new registration: a hundred workers starting on a few cores arrive
    // over minutes, each one in time.
    auto deadline = Clock::now() + timeout;
    std::unique_lock<std::mutex> lock(mutex_);
    int arrived = alive_count_locked();
    while (alive_count_locked() < count) {
      if (alive_count_locked() > arrived) {
        arrived = alive_count_locked();
        deadline = Clock::now() + timeout;
      }
      if (Clock::now() >= deadline) {
        throw TimeoutError("driver: " + std::to_string(alive_count_locked()) + " of " +
                               std::to_string(count) + " workers registered, none more within " +
                               std::to_string(timeout.count()) + " ms. Spawned workers must call " +
                               "dsgd::init(argc, argv) first thing in main(); remote workers need this driver's " +
                               "address and token",
                           "register");
      }
      cv_.wait_for(lock, milliseconds(100));
      lock.unlock();
      if (on_tick) on_tick();
      lock.lock();
    }
  }

  std::vector<int> alive() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int> out;
    for (const auto& w : workers_) {
      if (w.info.alive) out.push_back(static_cast<int>(w.info.index));
    }
    return out;
  }

  void evict(int id, const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto* w = worker(id);
    if (w == nullptr || !w->info.alive) return;
    w->info.alive = false;
    w->queue.clear();
    w->results.clear();
    log().warn("driver: evicted worker {} (host {}, pid {}): {}", id, w->info.host, w->info.pid, reason);
    cv_.notify_all();
    queue_cv_.notify_all();
  }

  void abort_generation(int64_t generation) override {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_generation_ = std::max(aborted_generation_, generation);
    for (auto it = averages_.begin(); it != averages_.end();) {
      it = it->first.first <= generation ? averages_.erase(it) : std::next(it);
    }
    notify_everyone();
  }

  void adopt(const std::vector<WorkerInfo>& adopted) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& a : adopted) {
      while (static_cast<int64_t>(workers_.size()) <= a.index) {  // ids never heard of again stay evicted
        WorkerState gap;
        gap.info.index = static_cast<int64_t>(workers_.size());
        gap.info.alive = false;
        workers_.push_back(std::move(gap));
      }
      auto& w = workers_[static_cast<size_t>(a.index)];
      w.info = a;
      w.info.alive = true;
      w.info.heard = false;
      w.last_heartbeat = Clock::now();  // its grace to call in: heartbeat_timeout, as anyone's
    }
    cv_.notify_all();
  }

  std::vector<WorkerInfo> workers() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<WorkerInfo> out;
    for (const auto& w : workers_) {
      WorkerInfo i = w.info;
      i.since_heartbeat_s = std::chrono::duration<double>(Clock::now() - w.last_heartbeat).count();
      out.push_back(i);
    }
    return out;
  }

  std::vector<proto::CommandResult> call(const proto::Command& request, milliseconds timeout,
                                         const std::function<void()>& on_tick, std::vector<int> targets) override {
    const Pending p = send(request, std::move(targets));
    std::unique_lock<std::mutex> lock(mutex_);
    const auto start = Clock::now();
    auto ticked = start;
    while (true) {
      if (auto out = collect_locked(p)) return std::move(*out);
      if (timeout.count() > 0 && Clock::now() - start > timeout) {
        throw TimeoutError("driver: '" + p.kind + "' not finished by every worker within " +
                               std::to_string(timeout.count()) + " ms",
                           p.kind);
      }
      cv_.wait_for(lock, milliseconds(100));
      // A tick every 100 ms, not at every wake-up: hundreds of results arrive at a chunk's end.
      if (on_tick && Clock::now() - ticked >= milliseconds(100)) {
        ticked = Clock::now();
        lock.unlock();
        on_tick();
        lock.lock();
      }
    }
  }

  Pending send(const proto::Command& request, std::vector<int> targets) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (targets.empty()) {
      for (size_t i = 0; i < workers_.size(); ++i) {
        if (workers_[i].info.alive) targets.push_back(static_cast<int>(i));
      }
    }
    Pending p{next_id_++, command_name(request), std::move(targets)};
    for (int t : p.targets) {
      proto::Command c = request;
      c.set_id(p.id);
      workers_.at(static_cast<size_t>(t)).queue.push_back(std::move(c));
    }
    queue_cv_.notify_all();
    return p;
  }

  std::optional<std::vector<proto::CommandResult>> collect(const Pending& pending) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return collect_locked(pending);
  }

  // ---- the service ----
  grpc::Status Register(grpc::ServerContext* ctx, const proto::RegisterRequest* req,
                        proto::RegisterReply* reply) override {
    if (!token_ok(ctx, options_.token, "Register")) return denied();
    if (req->protocol() != kControlProtocol) {
      log().warn("driver: refused worker {} (pid {}): it speaks control protocol {}, this driver {}", req->host(),
                 req->pid(), req->protocol(), kControlProtocol);
      return {grpc::StatusCode::FAILED_PRECONDITION,
              "the worker speaks control protocol " + std::to_string(req->protocol()) + " (dsgd " + req->version() +
                  "), this driver " + std::to_string(kControlProtocol) + " (dsgd " + DSGD_VERSION_STRING +
                  "): start the workers from the same dsgd build as the driver"};
    }
    std::lock_guard<std::mutex> lock(mutex_);
    // A retry of a registration whose answer was lost (its call timed out on a loaded machine):
    // the same process gets the same place, not a second one that would never be heard from.
    for (const auto& w : workers_) {
      if (w.info.alive && w.info.pid == req->pid() && w.info.host == req->host() &&
          w.info.address == req->address() && w.info.spawn_index == req->spawn_index()) {
        reply->set_worker(w.info.index);
        *reply->mutable_job() = options_.job;
        return grpc::Status::OK;
      }
    }
    if (const int most = options_.num_workers + options_.standby_workers; alive_count_locked() >= most) {
      const std::string has =
          std::to_string(options_.num_workers) + " workers" +
          (options_.standby_workers > 0 ? " and " + std::to_string(options_.standby_workers) + " standbys" : "");
      log().warn("driver: refused worker {} (pid {}): the job already has its {}", req->host(), req->pid(), has);
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, "the job already has its " + has};
    }
    WorkerState w;
    w.info.index = static_cast<int64_t>(workers_.size());
    w.info.host = req->host();
    w.info.address = req->address();
    w.info.pid = req->pid();
    w.info.spawn_index = req->spawn_index();
    w.last_heartbeat = Clock::now();
    log().debug("driver: worker {} registered from {} ({}), pid {}", w.info.index, w.info.host, w.info.address,
                  w.info.pid);
    reply->set_worker(w.info.index);
    *reply->mutable_job() = options_.job;
    workers_.push_back(std::move(w));
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Poll(grpc::ServerContext* ctx, const proto::PollRequest* req, proto::Command* reply) override {
    if (!token_ok(ctx, options_.token, "Poll")) return denied();
    std::unique_lock<std::mutex> lock(mutex_);
    auto* w = live(req->worker());
    if (w == nullptr)
      return {grpc::StatusCode::NOT_FOUND, "unknown or evicted worker " + std::to_string(req->worker())};
    heard(w);
    queue_cv_.wait_for(lock, milliseconds(std::clamp<int64_t>(req->wait_ms(), 0, 5000)),
                       [&] { return !w->queue.empty() || !w->info.alive || stop_; });
    if (!w->queue.empty()) {
      *reply = std::move(w->queue.front());
      w->queue.pop_front();
    }
    return grpc::Status::OK;
  }

  grpc::Status Complete(grpc::ServerContext* ctx, const proto::CommandResult* req, proto::Empty*) override {
    if (!token_ok(ctx, options_.token, "Complete")) return denied();
    std::lock_guard<std::mutex> lock(mutex_);
    auto* w = live(req->worker());
    if (w == nullptr)
      return {grpc::StatusCode::NOT_FOUND, "unknown or evicted worker " + std::to_string(req->worker())};
    heard(w);
    w->results[req->id()] = *req;
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply* reply) override {
    if (!token_ok(ctx, options_.token, "Heartbeat")) return denied();
    std::unique_lock<std::mutex> lock(mutex_);
    auto* w = live(req->worker());
    if (w == nullptr)
      return {grpc::StatusCode::NOT_FOUND, "unknown or evicted worker " + std::to_string(req->worker())};
    // Alive when it arrived; the wait below proves nothing (the worker may stop meanwhile).
    heard(w);
    if (!req->progress().empty()) w->info.progress = req->progress();
    beat_cv_.wait_for(lock, milliseconds(std::clamp<int64_t>(req->wait_ms(), 0, 2000)),
                      [&] { return stop_ || aborted_generation_ > req->known_abort_generation(); });
    reply->set_stop(stop_);
    reply->set_abort_generation(aborted_generation_);
    return grpc::Status::OK;
  }

  grpc::Status Reduce(grpc::ServerContext* ctx, const proto::ReduceRequest* req, proto::ReduceReply* reply) override {
    if (!token_ok(ctx, options_.token, "Reduce")) return denied();
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t gen = req->generation();
    const auto world_it = world_of_generation_.find(gen);
    const int world = world_it == world_of_generation_.end() ? options_.world_size : world_it->second;
    if (req->rank() < 0 || req->rank() >= world || req->data().size() % sizeof(float) != 0) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "bad rank or data size"};
    }
    if (gen <= aborted_generation_) {
      return {grpc::StatusCode::ABORTED, "generation " + std::to_string(gen) + " was aborted (recovery)"};
    }
    const auto key = std::make_pair(gen, req->seq());
    auto& a = averages_[key];
    if (a.parts.empty() && !a.done) a.parts.resize(static_cast<size_t>(world));
    if (a.done || !a.parts[static_cast<size_t>(req->rank())].empty()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "duplicate contribution to average #" + std::to_string(req->seq())};
    }
    a.parts[static_cast<size_t>(req->rank())] = req->data();
    if (++a.arrived == world) {
      // Sum in rank order, so the result does not depend on arrival order.
      const size_t n = req->data().size() / sizeof(float);
      std::vector<float> sum(n, 0.0f);
      for (const auto& p : a.parts) {
        if (p.size() != req->data().size()) {
          return {grpc::StatusCode::INVALID_ARGUMENT, "mismatched sizes in average #" + std::to_string(req->seq())};
        }
        const float* v = reinterpret_cast<const float*>(p.data());
        for (size_t i = 0; i < n; ++i) sum[i] += v[i];
      }
      const float inv = 1.0f / static_cast<float>(world);
      for (auto& x : sum) x *= inv;
      a.result.assign(reinterpret_cast<const char*>(sum.data()), n * sizeof(float));
      a.parts.clear();
      a.done = true;
      reduce_cv_.notify_all();
    }
    const bool ready = reduce_cv_.wait_for(lock, options_.reduce_timeout, [&] {
      auto it = averages_.find(key);
      return stop_ || gen <= aborted_generation_ || (it != averages_.end() && it->second.done);
    });
    auto it = averages_.find(key);
    if (stop_ || gen <= aborted_generation_ || it == averages_.end()) {
      return {grpc::StatusCode::ABORTED, "average #" + std::to_string(req->seq()) + " aborted"};
    }
    if (!ready) {
      return {grpc::StatusCode::DEADLINE_EXCEEDED,
              "average #" + std::to_string(req->seq()) + ": only " + std::to_string(it->second.arrived) + " of " +
                  std::to_string(world) + " replicas contributed"};
    }
    reply->set_data(it->second.result);
    if (++it->second.fetched == world) averages_.erase(it);
    return grpc::Status::OK;
  }

  void set_world(int64_t generation, int world) override {
    std::lock_guard<std::mutex> lock(mutex_);
    world_of_generation_[generation] = world;
  }

 private:
  grpc::Status denied() {
    ++rejected_;
    return {grpc::StatusCode::PERMISSION_DENIED, "wrong or missing job token"};
  }
  void heard(WorkerState* w) {
    w->last_heartbeat = Clock::now();
    if (!w->info.heard) {
      w->info.heard = true;
      log().info("driver: worker {} (host {}, pid {}) is back", w->info.index, w->info.host, w->info.pid);
      cv_.notify_all();
    }
  }
  WorkerState* worker(int64_t index) {
    if (index < 0 || index >= static_cast<int64_t>(workers_.size())) return nullptr;
    return &workers_[static_cast<size_t>(index)];
  }
  // A live worker, or null (unknown or evicted: its calls are refused, and it exits).
  WorkerState* live(int64_t index) {
    auto* w = worker(index);
    return w != nullptr && w->info.alive ? w : nullptr;
  }
  // The results of `p` once every target answered; throws the first error, or CommError for a
  // target evicted or silent for heartbeat_timeout.
  std::optional<std::vector<proto::CommandResult>> collect_locked(const Pending& p) {
    size_t done = 0;
    const auto now = Clock::now();
    for (int t : p.targets) {
      auto& w = workers_.at(static_cast<size_t>(t));
      const auto who = [&w] {
        return "worker " + std::to_string(w.info.index) + " (host " + w.info.host + ", pid " +
               std::to_string(w.info.pid) + ")";
      };
      if (!w.info.alive) {
        throw CommError(who() + " was evicted during '" + p.kind + "'", p.kind, static_cast<int>(w.info.index),
                        w.info.host);
      }
      auto it = w.results.find(p.id);
      if (it != w.results.end()) {
        if (!it->second.ok()) {
          proto::CommandResult r = std::move(it->second);
          w.results.erase(it);
          throw_worker_error(w.info, p.kind, r);
        }
        ++done;
        continue;
      }
      if (now - w.last_heartbeat > options_.heartbeat_timeout) {
        throw CommError(who() + " lost: no heartbeat for " +
                            std::to_string(std::chrono::duration_cast<milliseconds>(now - w.last_heartbeat).count()) +
                            " ms during '" + p.kind + "'",
                        p.kind, static_cast<int>(w.info.index), w.info.host);
      }
    }
    if (done < p.targets.size()) return std::nullopt;
    std::vector<proto::CommandResult> out;
    for (int t : p.targets) {
      auto& w = workers_[static_cast<size_t>(t)];
      auto it = w.results.find(p.id);
      out.push_back(std::move(it->second));
      w.results.erase(it);
    }
    return out;
  }
  void notify_everyone() {
    cv_.notify_all();
    queue_cv_.notify_all();
    beat_cv_.notify_all();
    reduce_cv_.notify_all();
  }
  int alive_count_locked() const {
    int n = 0;
    for (const auto& w : workers_) n += w.info.alive ? 1 : 0;
    return n;
  }

  const DriverServerOptions options_;
  std::shared_ptr<comm::Store> store_;
  std::unique_ptr<grpc::Service> store_service_;
  mutable std::mutex mutex_;
  // One condition a kind of waiter, so that an event wakes only those it concerns: with hundreds
  // of workers, each long-polling twice, one shared condition woke every poll and heartbeat at
  // each of a chunk's hundreds of Complete calls.
  std::condition_variable cv_;         // the driver's own waits: registrations, results, evictions
  std::condition_variable queue_cv_;   // Poll: a command queued
  std::condition_variable beat_cv_;    // Heartbeat: an abort or the stop
  std::condition_variable reduce_cv_;  // Reduce: an average complete
  // A deque: Poll holds a WorkerState* across its wait, while Register may append (a vector
  // would reallocate under it).
  std::deque<WorkerState> workers_;       // guarded by mutex_
  std::map<std::pair<int64_t, uint64_t>, Average> averages_;  // guarded by mutex_; by (generation, seq)
  std::map<int64_t, int> world_of_generation_;                 // guarded by mutex_
  int64_t aborted_generation_ = 0;                             // guarded by mutex_
  uint64_t next_id_;                      // guarded by mutex_
  bool stop_ = false;                     // guarded by mutex_
  std::atomic<int64_t> rejected_{0};
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;  // last: shut down first
};

}  // namespace

std::string command_name(const proto::Command& command) {
  const auto* oneof = proto::Command::descriptor()->FindOneofByName("request");
  const auto* field = proto::Command::GetReflection()->GetOneofFieldDescriptor(command, oneof);
  return field != nullptr ? field->name() : "none";
}

std::unique_ptr<DriverServer> DriverServer::start(const DriverServerOptions& options) {
  return std::make_unique<DriverServerImpl>(options);
}

}  // namespace dsgd::control
