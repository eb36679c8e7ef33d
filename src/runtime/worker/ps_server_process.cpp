#include "runtime/worker/ps_server_process.h"

#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "dsgd/common/error.h"
#include "control/log.h"
#include "control/store_service.h"
#include "runtime/worker/worker.h"
#include "strategy/ps_server.h"

namespace dsgd::runtime {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr const char* kSpecKey = "ps-spec";  // in the generation's namespace

// The driver's side of the conversation, for one shard process: the generation key, read with
// a memory of when the driver last answered.
class DriverWatch {
 public:
  DriverWatch(std::shared_ptr<comm::Store> store, milliseconds timeout) : store_(std::move(store)), timeout_(timeout) {}

  // The key's value ("" while unset), or nullopt when the driver did not answer. ConfigError
  // when it refuses this process (a wrong token): asking again would not help.
  std::optional<std::string> generation() {
    try {
      std::string v = store_->check({kPsGenerationKey}) ? store_->get(kPsGenerationKey, milliseconds(1000)) : "";
      last_ok_ = Clock::now();
      return v;
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      last_error_ = e.what();
      return std::nullopt;
    }
  }
  bool lost() const { return Clock::now() - last_ok_.load() > timeout_; }
  const std::string& last_error() const { return last_error_; }

 private:
  std::shared_ptr<comm::Store> store_;
  const milliseconds timeout_;
  std::atomic<Clock::time_point> last_ok_{Clock::now()};
  std::string last_error_;
};

}  // namespace

std::optional<PsServerArgs> parse_ps_server_args(int argc, char** argv) {
  bool server = false;
  PsServerArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) throw ConfigError(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (arg == "--dsgd-ps-server") server = true;
    else if (arg == "--driver") a.driver = value("--driver");
    else if (arg == "--token") a.token = value("--token");
    else if (arg == "--address") a.address = value("--address");
    else if (arg == "--host-id") a.host_id = value("--host-id");
    else if (arg == "--shard") a.shard = std::atoi(value("--shard").c_str());
  }
  if (!server) return std::nullopt;
  if (a.driver.empty()) throw ConfigError("ps shard mode needs --driver HOST:PORT (the driver prints it)");
  if (a.token.empty()) {
    if (const char* t = std::getenv("DSGD_TOKEN")) a.token = t;
  }
  if (a.token.empty()) throw ConfigError("ps shard mode needs the job token: --token T or $DSGD_TOKEN");
  if (a.shard < 0) throw ConfigError("ps shard mode needs --shard S (0 .. num_ps_shards-1)");
  return a;
}

std::shared_ptr<comm::Group> join_ps_servers(const std::shared_ptr<comm::Store>& generation_store,
                                             comm::HierarchicalGroup& group, int num_shards,
                                             const comm::GroupOptions& options) {
  const int leaders = group.num_hosts();
  const int rank = group.leaders() != nullptr ? group.leaders()->rank() : 0;
  if (rank == 0) {
    generation_store->set(kSpecKey, json{{"leaders", leaders}, {"shards", num_shards},
                                         {"timeout_ms", options.timeout.count()}}.dump());
  }
  return comm::Group::create(std::make_shared<comm::PrefixStore>(generation_store, "ps/"), rank, leaders + num_shards,
                             options);
}

namespace {

// Serves generation `g` until its group fails or the driver moves on. ConfigError when this
// process cannot be part of the job (its shard index is out of range).
void serve_generation(const PsServerArgs& a, const std::shared_ptr<comm::Store>& base, DriverWatch& watch, int64_t g,
                      const std::string& address, const std::string& host) {
  auto gen = std::make_shared<comm::PrefixStore>(base, "gen" + std::to_string(g) + "/");
  // Leader 0 writes the spec once its replicas have formed their group; a job of one replica
  // never does (nothing to average), so wait as long as the generation lasts.
  json spec;
  while (true) {
    if (gen->check({kSpecKey})) {
      spec = json::parse(gen->get(kSpecKey, milliseconds(1000)));
      break;
    }
    std::this_thread::sleep_for(milliseconds(100));
    auto v = watch.generation();
    if ((v && *v != std::to_string(g)) || (!v && watch.lost())) return;
  }
  const int leaders = spec.at("leaders").get<int>(), shards = spec.at("shards").get<int>();
  if (a.shard >= shards) {
    throw ConfigError("this process serves ps shard " + std::to_string(a.shard) + " but the job has " +
                      std::to_string(shards) + " (num_ps_shards); start shards 0.." + std::to_string(shards - 1));
  }
  comm::GroupOptions go;
  go.bind_address = address;
  go.host = host;
  go.timeout = milliseconds(spec.at("timeout_ms").get<int64_t>());
  std::shared_ptr<comm::Group> group = comm::Group::create(std::make_shared<comm::PrefixStore>(gen, "ps/"),
                                                           leaders + a.shard, leaders + shards, go);
  strategy::PsServer server(group, leaders);
  // Started by hand (remote mode), say so; spawned by the driver, the driver's output is the user's.
  const auto level = std::getenv("DSGD_WORKER_OF") == nullptr ? spdlog::level::info : spdlog::level::debug;
  control::log().log(level, "ps shard {}: serving generation {} ({} host leader(s), {} shard(s))", a.shard, g,
                     leaders, shards);
  std::atomic<bool> done{false}, moved_on{false};
  std::thread watcher([&] {
    while (!done) {
      std::this_thread::sleep_for(milliseconds(200));
      auto v = watch.generation();
      if (v && *v != std::to_string(g)) {
        moved_on = true;
        server.abort("the job left generation " + std::to_string(g));
        return;
      }
      if (!v && watch.lost()) {
        server.abort("the driver is unreachable: " + watch.last_error());
        return;
      }
    }
  });
  try {
    server.serve();
  } catch (const CommError& e) {  // the job moved on, or a leader was lost (the driver re-forms the job)
    control::log().log(moved_on ? spdlog::level::debug : spdlog::level::warn, "ps shard {}: generation {} ended: {}",
                       a.shard, g, e.what());
  } catch (...) {
    done = true;
    watcher.join();
    throw;
  }
  done = true;
  watcher.join();
}

}  // namespace

}  // namespace dsgd::runtime

namespace dsgd {

int run_ps_server(const PsServerArgs& a) {
  if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) control::log().warn("ps shard: cannot ignore SIGPIPE");
  const std::string address = a.address.empty() ? runtime::route_address(a.driver) : a.address;
  const std::string host = a.host_id.empty() ? runtime::host_name() : a.host_id;
  std::shared_ptr<comm::Store> base;
  try {
    control::StoreClientOptions store_options;
    store_options.tls = runtime::worker_tls_keys(a.tls_ca, a.tls_cert, a.tls_key);
    base = control::connect_store(a.driver, a.token, store_options);
  } catch (const std::exception& e) {
    control::log().error("ps shard {}: cannot reach the driver at {}: {}", a.shard, a.driver, e.what());
    return 2;
  }
  runtime::DriverWatch watch(base, a.driver_timeout);
  int64_t served = 0;  // the newest generation joined
  while (true) {
    std::optional<std::string> v;
    try {
      v = watch.generation();
    } catch (const ConfigError& e) {
      control::log().error("ps shard {}: the driver at {} refuses this process: {}", a.shard, a.driver, e.what());
      return 2;
    }
    if (!v) {
      if (watch.lost()) {
        control::log().error("ps shard {}: no answer from the driver at {} for {} ms ({}); exiting", a.shard, a.driver,
                             a.driver_timeout.count(), watch.last_error());
        return 3;
      }
    } else if (*v == "stop") {
      return 0;
    } else {
      const int64_t g = std::atoll(v->c_str());  // "" and "pending": 0
      if (g > served) {
        served = g;
        try {
          runtime::serve_generation(a, base, watch, g, address, host);
        } catch (const ConfigError& e) {
          control::log().error("ps shard {}: {}", a.shard, e.what());
          return 2;
        } catch (const std::exception& e) {  // a generation that never formed: wait for the next
          control::log().warn("ps shard {}: generation {}: {}", a.shard, g, e.what());
        }
        continue;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace dsgd
