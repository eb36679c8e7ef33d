#include "runtime/worker.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include "runtime/control/log.h"
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <torch/serialize.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "dsgd/comm/hierarchical.h"
#include "dsgd/error.h"
#include "dsgd/operator.h"
#include "runtime/control/driver_service.h"
#include "runtime/control/store_service.h"
#include "runtime/metrics_wire.h"
#include "runtime/ps_server_process.h"
#include "runtime/trace_file.h"
#include "strategy/strategy.h"
#include "torch/replica.h"

namespace dsgd {

namespace {
struct FunctionRegistry {
  std::mutex mutex;
  std::map<std::string, WorkerFunction> functions;
};
FunctionRegistry& functions() {
  static FunctionRegistry r;
  return r;
}
}  // namespace

void register_worker_function(const std::string& name, WorkerFunction fn) {
  auto& r = functions();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.functions[name] = std::move(fn);
}

namespace runtime {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

bool has_worker_function(const std::string& name) {
  auto& r = functions();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.functions.count(name) > 0;
}

WorkerFunction find_worker_function(const std::string& name) {
  auto& r = functions();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.functions.find(name);
  if (it == r.functions.end()) {
    throw ConfigError("no worker function '" + name + "' is registered in this binary (DSGD_REGISTER_WORKER_FUNCTION)");
  }
  return it->second;
}

std::optional<WorkerArgs> parse_worker_args(int argc, char** argv) {
  bool worker = false;
  WorkerArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) throw ConfigError(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (arg == "--dsgd-worker") worker = true;
    else if (arg == "--driver") a.driver = value("--driver");
    else if (arg == "--token") a.token = value("--token");
    else if (arg == "--address") a.address = value("--address");
    else if (arg == "--host-id") a.host_id = value("--host-id");
    else if (arg == "--spawn-index") a.spawn_index = std::stoll(value("--spawn-index"));
  }
  if (!worker) return std::nullopt;
  if (a.driver.empty()) throw ConfigError("worker mode needs --driver HOST:PORT (the driver prints it)");
  if (a.token.empty()) {
    if (const char* t = std::getenv("DSGD_TOKEN")) a.token = t;
  }
  if (a.token.empty()) throw ConfigError("worker mode needs the job token: --token T or $DSGD_TOKEN");
  return a;
}

std::string route_address(const std::string& driver) {
  const auto colon = driver.rfind(':');
  const std::string host = driver.substr(0, colon);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      if (inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf))) out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return out;
}

std::string host_name() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

namespace {

class Worker {
 public:
  Worker(control::DriverClient& client, std::string token, int64_t index, json job, std::string address,
         std::string host_id)
      : client_(client), token_(std::move(token)), index_(index), job_(std::move(job)), address_(std::move(address)),
        host_id_(std::move(host_id)) {
    dpw_ = job_.at("devices_per_worker").get<int>();
    world_ = job_.at("num_workers").get<int>() * dpw_;
    heartbeat_timeout_ = milliseconds(job_.at("heartbeat_timeout_ms").get<int64_t>());
    comm_timeout_ = milliseconds(job_.at("comm_timeout_ms").get<int64_t>());
    int threads = job_.value("threads_per_worker", 0);
    if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
    threads_per_replica_ = std::max(1, threads / dpw_);
    at::set_num_threads(threads_per_replica_);
  }

  int serve() {
    std::thread heartbeat([this] { heartbeat_loop(); });
    int rc = 0;
    try {
      while (!stop_) {
        auto cmd = client_.poll(index_, milliseconds(1000));
        if (cmd.id == 0) continue;
        busy_ = true;
        std::string out_json, out_blob, error, kind;
        bool ok = true;
        try {
          run(cmd, out_json, out_blob);
        } catch (const ConfigError& e) {
          ok = false, error = e.what(), kind = "config";
        } catch (const TimeoutError& e) {
          ok = false, error = e.what(), kind = "timeout";
        } catch (const CommError& e) {
          ok = false, error = e.what(), kind = "comm";
        } catch (const std::exception& e) {
          ok = false, error = e.what(), kind = "error";
        }
        if (!ok) control::log().error("worker {}: {} failed: {}", index_, cmd.kind, error);
        client_.complete(index_, cmd.id, ok, error, kind, out_json, out_blob);
        busy_ = false;
        if (cmd.kind == "shutdown") stop_ = true;
      }
    } catch (const std::exception& e) {
      control::log().error("worker {}: lost the driver at {}: {}; exiting", index_, client_.address(), e.what());
      rc = 3;
    }
    stop_ = true;
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

 private:
  void heartbeat_loop() {
    const auto interval = std::clamp(heartbeat_timeout_ / 5, milliseconds(100), milliseconds(1000));
    auto last_ok = Clock::now();
    while (!stop_) {
      std::this_thread::sleep_for(interval);
      try {
        json p;
        if (auto* r = progress_source_.load()) {
          p["batches"] = r->progress().batches.load();
          p["loss"] = r->progress().loss.load();
        }
        const auto beat = client_.heartbeat(index_, p.is_null() ? std::string() : p.dump(),
                                            std::max(heartbeat_timeout_ / 2, milliseconds(500)));
        last_ok = Clock::now();
        if (beat.abort_generation > 0 && beat.abort_generation >= generation_) abort_communication(beat.abort_generation);
        if (beat.stop) {
          if (busy_) {
            control::log().warn("worker {}: the driver ended the job during a command; exiting", index_);
            std::_Exit(0);
          }
          stop_ = true;
        }
      } catch (const std::exception& e) {
        if (Clock::now() - last_ok > heartbeat_timeout_) {
          control::log().error("worker {}: no answer from the driver at {} for {} ms ({}); exiting", index_,
                        client_.address(), heartbeat_timeout_.count(), e.what());
          std::_Exit(4);
        }
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

  void run(const control::DriverClient::Command& cmd, std::string& out_json, std::string& out_blob) {
    const json in = cmd.json.empty() ? json::object() : json::parse(cmd.json);
    if (cmd.kind == "setup") {
      place(in);
      setup();
      json out;
      out["signature"] = replicas_[0]->signature();
      int64_t parameters = 0;
      for (const auto& m : replicas_[0]->op().models()) {
        for (const auto& p : m->parameters()) parameters += p.requires_grad() ? p.numel() : 0;
      }
      out["parameters"] = parameters;
      out_json = out.dump();
    } else if (cmd.kind == "connect") {
      connect(in);
    } else if (cmd.kind == "set_state") {
      each_replica([&](int i) { replicas_[static_cast<size_t>(i)]->load_state(cmd.blob); });
    } else if (cmd.kind == "gather_state") {
      // Every replica takes part; only the worker whose state is read next ("keep") keeps a copy.
      each_replica([&](int i) { replicas_[static_cast<size_t>(i)]->gather_server_state(); });
      if (in.value("keep", -1) != index_) {
        for (auto& r : replicas_) r->drop_server_state_copy();
      }
    } else if (cmd.kind == "get_state") {
      const auto t0 = std::chrono::steady_clock::now();
      out_blob = replicas_.at(0)->save_state();
      for (auto& r : replicas_) r->drop_server_state_copy();  // saved: the servers hold it
      control::log().debug("worker {}: state of {} bytes serialised in {:.3f} s", index_, out_blob.size(),
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    } else if (cmd.kind == "get_pickle") {
      c10::Dict<std::string, at::Tensor> dict;
      for (auto& [name, t] : replicas_.at(0)->named_tensors()) dict.insert(name, t.detach().clone());
      const auto bytes = torch::pickle_save(dict);
      out_blob.assign(bytes.begin(), bytes.end());
    } else if (cmd.kind == "train" || cmd.kind == "validate") {
      const bool train = cmd.kind == "train";
      std::vector<Metrics> parts(static_cast<size_t>(dpw_));
      for (auto& r : replicas_) r->progress().batches = 0;
      // forward_overlap_buckets chosen by the driver (-1 in the job): T for this call, 0 when the
      // call names none (a replay), the same on every worker.
      const bool chosen_overlap = job_.value("forward_overlap_buckets", int64_t{0}) < 0;
      const size_t overlap = chosen_overlap && train ? in.value("forward_overlap_buckets", size_t{0}) : 0;
      const bool trace = train && in.value("trace", false);
      if (trace) comm::timeline::start();
      try {
        each_replica([&](int i) {
          auto& r = *replicas_[static_cast<size_t>(i)];
          if (chosen_overlap && train) r.set_forward_overlap_buckets(overlap);
          parts[static_cast<size_t>(i)] =
              train ? r.train(in.value("max_batches", int64_t{0}), in.value("profile", false)) : r.validate();
        });
      } catch (...) {
        if (trace) comm::timeline::stop();
        throw;
      }
      json out;
      if (trace) out["trace"] = runtime::trace_json(comm::timeline::stop());
      out["metrics"] = metrics_to_json(weighted_mean(parts));
      if (chosen_overlap && train) {  // for the driver's choice (trainer.cpp, OverlapTuner)
        double steady = 0;
        for (auto& r : replicas_) steady = std::max(steady, r->steady_step_seconds());
        out["steady_step_s"] = steady;
        out["buckets"] = replicas_[0]->num_buckets();
      }
      if (train && in.value("state_bytes", false)) {  // for the driver's snapshot schedule (SnapshotPolicy)
        const auto t0 = std::chrono::steady_clock::now();
        out["state_bytes"] = replicas_[0]->state_bytes();
        control::log().debug("worker {}: state of {} bytes counted in {:.3f} s", index_, out["state_bytes"].get<size_t>(),
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      out["epoch"] = replicas_[0]->position().epoch;
      out["batch"] = replicas_[0]->position().batch;
      out["batches_per_epoch"] = replicas_[0]->batches_per_epoch();
      out_json = out.dump();
    } else if (cmd.kind == "run") {
      auto fn = find_worker_function(in.at("name").get<std::string>());
      out_json = json{{"result", fn(replicas_.empty() ? nullptr : &replicas_[0]->op(), in.value("arg", json()))}}.dump();
    } else if (cmd.kind == "position") {
      out_json = json{{"epoch", replicas_.at(0)->position().epoch}, {"batch", replicas_.at(0)->position().batch}}.dump();
    } else if (cmd.kind == "step_schedules") {
      for (auto& r : replicas_) r->step_schedules();
    } else if (cmd.kind == "ping") {
      // idle: answered
    } else if (cmd.kind == "shutdown") {
      // answered by serve()
    } else {
      throw ConfigError("unknown command '" + cmd.kind + "' (driver and worker built from different dsgd versions?)");
    }
  }

  void setup() {
    const std::string hook = job_.value("initialization_hook", "");
    if (!hook.empty()) find_worker_function(hook)(nullptr, job_.value("config", json::object()));
    progress_source_ = nullptr;
    replicas_.clear();
    for (int i = 0; i < dpw_; ++i) {
      torch_glue::ReplicaOptions o;
      o.seed = job_.at("seed").get<uint64_t>();
      o.info = {rank_base_ + i, world_, position_, i, o.seed};
      o.global_batch = job_.at("batch_size").get<int64_t>();
      o.grad_shard_bytes = job_.at("grad_shard_bytes").get<size_t>();
      o.scheduler_step_freq = job_.at("scheduler_step_freq").get<std::string>();
      o.threads = threads_per_replica_;
      o.overlap = job_.value("overlap", true);
      o.forward_overlap_buckets = job_.value("forward_overlap_buckets", int64_t{0});
      o.nonfinite = job_.value("nonfinite_policy", std::string("skip"));
      replicas_.push_back(
          std::make_unique<torch_glue::ReplicaRuntime>(make_operator(job_.at("operator").get<std::string>()), o));
    }
    // One after the other: setup draws from LibTorch's global generator (seeded per replica).
    const json config = job_.value("config", json::object());
    for (auto& r : replicas_) r->setup(config);
    for (auto& r : replicas_) {
      if (r->signature() != replicas_[0]->signature()) {
        throw ConfigError("the replicas of worker " + std::to_string(index_) + " built different models from one config");
      }
    }
    progress_source_ = replicas_[0].get();
  }

  // This worker's place in the job: worker in["ranks"][my id] of in["num_workers"].
  void place(const json& in) {
    const int num_workers = in.value("num_workers", job_.at("num_workers").get<int>());
    position_ = in.contains("ranks") ? in.at("ranks").at(std::to_string(index_)).get<int>() : static_cast<int>(index_);
    world_ = num_workers * dpw_;
    rank_base_ = position_ * dpw_;
  }

  // Joins generation in["generation"] at the place in["ranks"] gives.
  void connect(const json& in) {
    const std::string strategy = job_.at("strategy").get<std::string>();
    const int64_t generation = in.value("generation", int64_t{1});
    place(in);
    for (auto& r : replicas_) r->attach(nullptr);  // hooks off before the old strategies go
    {
      std::lock_guard<std::mutex> lock(strategies_mutex_);
      strategies_.clear();
    }
    groups_.clear();
    generation_ = generation;
    for (int i = 0; i < dpw_; ++i) replicas_[static_cast<size_t>(i)]->set_info(rank_base_ + i, world_, position_);
    if (world_ == 1) return;  // one replica: nothing to average, no hooks
    std::vector<std::shared_ptr<strategy::GradientStrategy>> strategies(static_cast<size_t>(dpw_));
    groups_.assign(static_cast<size_t>(dpw_), nullptr);
    if (strategy == "allreduce" || strategy == "ps" || strategy == "ps_async") {
      auto base = control::connect_store(client_.address(), token_);
      const std::string prefix = "gen" + std::to_string(generation) + "/";
      each_replica([&](int i) {
        auto store = std::make_shared<comm::PrefixStore>(base, prefix);
        comm::GroupOptions go;
        go.bind_address = address_;
        go.host = host_id_;
        go.timeout = comm_timeout_;
        comm::ShmOptions so;
        so.timeout = comm_timeout_;
        so.shared_bytes = replicas_[static_cast<size_t>(i)]->gradient_bytes();  // gradients live there
        const int rank = rank_base_ + i;
        auto group = std::shared_ptr<comm::HierarchicalGroup>(comm::HierarchicalGroup::create(store, rank, world_, go, so));
        groups_[static_cast<size_t>(i)] = group;
        if (strategy == "ps_async") {
          const int shards = job_.value("num_ps_shards", 0);
          strategies[static_cast<size_t>(i)] = strategy::make_ps_async_strategy(
              group, shards > 0 ? shards : group->num_hosts(), job_.value("max_staleness", 4));
        } else if (strategy == "ps") {
          const int shards = job_.value("num_ps_shards", 0);
          strategy::PsOptions po{.num_shards = shards > 0 ? shards : group->num_hosts(),
                                 .update_on_shards = job_.value("ps_update_on_shards", false),
                                 .shard_processes = job_.value("ps_placement", std::string("workers")) == "processes"};
          if (po.shard_processes && group->local().rank() == 0) {
            po.servers = join_ps_servers(store, *group, po.num_shards, go);
          }
          strategies[static_cast<size_t>(i)] = strategy::make_ps_strategy(group, po);
        } else {
          strategies[static_cast<size_t>(i)] =
              strategy::make_allreduce_strategy(group, job_.value("allreduce_algo", std::string("auto")));
        }
      });
    } else if (strategy == "simple") {
      for (int i = 0; i < dpw_; ++i) {
        const int64_t rank = rank_base_ + i;
        const auto timeout = comm_timeout_;
        auto& client = client_;
        strategies[static_cast<size_t>(i)] = strategy::make_simple_strategy(
            [&client, generation, rank, timeout](uint64_t seq, float* data, size_t count) {
              client.average(generation, rank, seq, data, count, timeout);
            });
      }
    } else {
      throw ConfigError("unknown strategy '" + strategy + "'");
    }
    {
      std::lock_guard<std::mutex> lock(strategies_mutex_);
      strategies_ = strategies;
      // An abort for this generation may have come while the group formed.
      if (aborted_generation_ >= generation) {
        for (auto& st : strategies_) st->abort("generation " + std::to_string(generation) + " aborted");
      }
    }
    for (int i = 0; i < dpw_; ++i) replicas_[static_cast<size_t>(i)]->attach(strategies[static_cast<size_t>(i)]);
  }

  control::DriverClient& client_;
  const std::string token_;
  const int64_t index_;
  const json job_;
  const std::string address_;
  const std::string host_id_;
  int dpw_ = 1;
  int world_ = 1;
  int threads_per_replica_ = 1;
  milliseconds heartbeat_timeout_{10000};
  milliseconds comm_timeout_{60000};
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};
  std::atomic<torch_glue::ReplicaRuntime*> progress_source_{nullptr};
  std::atomic<int64_t> generation_{0};
  int rank_base_ = 0;
  int position_ = 0;                     // this worker's index among the live workers
  std::mutex strategies_mutex_;          // strategies_ is read by the heartbeat thread
  int64_t aborted_generation_ = 0;       // guarded by strategies_mutex_
  std::vector<std::shared_ptr<comm::HierarchicalGroup>> groups_;
  std::vector<std::shared_ptr<strategy::GradientStrategy>> strategies_;
  std::vector<std::unique_ptr<torch_glue::ReplicaRuntime>> replicas_;  // after strategies_: hooks go first
};

}  // namespace

int run_worker(const WorkerArgs& args) {
  if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) control::log().warn("worker: cannot ignore SIGPIPE");
  control::DriverClient client(args.driver, args.token);
  const std::string address = args.address.empty() ? route_address(args.driver) : args.address;
  const std::string host = host_name();
  const std::string host_id = args.host_id.empty() ? host : args.host_id;
  control::DriverClient::Registration reg;
  try {
    reg = client.register_worker(host_id, address, ::getpid(), args.spawn_index, args.registration_timeout);
  } catch (const std::exception& e) {
    control::log().error("worker: cannot register with the driver at {}: {}", args.driver, e.what());
    return 2;
  }
  json job;
  try {
    job = json::parse(reg.job);
  } catch (const std::exception& e) {
    control::log().error("worker: the driver sent a malformed job spec: {}", e.what());
    return 2;
  }
  Worker worker(client, args.token, reg.worker, std::move(job), address, host_id);
  return worker.serve();
}

}  // namespace runtime
}  // namespace dsgd
