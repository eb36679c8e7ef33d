// The driver's side of the control plane: one gRPC server with the Driver service
// (proto/dsgd/control.proto: registration, command polling, heartbeats, the simple strategy's
// central average) and the rendezvous Store, both behind the job token.
//
//   auto server = DriverServer::start({.listen = "127.0.0.1:0", .token = t, .num_workers = 2, .job = spec});
//   server->wait_registered(60s, check_children);
//   proto::Command train;
//   train.mutable_train()->set_max_batches(10);
//   std::vector<proto::CommandResult> results = server->call(train, timeout, on_tick);
//
// Workers pull commands; call queues one per worker and waits for every result. It fails
// fast, naming the worker (index, host, pid), when a worker reports an error, misses heartbeats
// for heartbeat_timeout, or `on_tick` (called every ~100 ms: the driver's own liveness checks
// and progress display) throws. Torch-free; thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dsgd/comm/store.h"
#include "dsgd/control.pb.h"
#include "dsgd/common/error.h"
#include "control/tls.h"

namespace grpc {
class Status;
}  // namespace grpc

namespace dsgd::control {

// The version of proto/dsgd/control.proto's messages: raise it with every change a driver and a
// worker of different builds would misread. A worker that registers with another is refused
// (FAILED_PRECONDITION), naming both.
// 1: JSON job and commands; 2: JobSpec, typed commands; 3: JobSpec.device, .precision;
// 4: long-poll heartbeats, Placement.hosts; 5: JobSpec.step (the step settings as one JSON);
// 6: states in pieces only (StateChunk, ReadStateRequest); 7: Store.GetMany; 8: JobSpec.driver_grace_ms;
// 9: ShareStateRequest; 10: JobSpec.settings (every setting as one JSON, dsgd/runtime/settings.h).
inline constexpr uint32_t kControlProtocol = 11;

struct WorkerInfo {
  int64_t index = -1;
  std::string host;
  std::string address;
  int64_t pid = 0;
  int64_t spawn_index = -1;
  std::string progress;                     // the last heartbeat's progress JSON
  double since_heartbeat_s = 0;
  bool alive = true;                        // false once evicted
  bool heard = true;                        // false for an adopted worker that has not called yet
};

struct DriverServerOptions {
  std::string listen = "127.0.0.1:0";       // host:port; port 0 picks a free one
  std::string token;
  int num_workers = 1;
  int standby_workers = 0;                  // registrations taken beyond num_workers
                                            // (TrainerConfig::recovery.standby_workers)
  int world_size = 1;                       // replicas at the start (the simple strategy's averages
                                            // take it from each call's generation afterwards)
  proto::JobSpec job;                       // handed to each worker at registration
  TlsKeys tls;                              // enabled: mutual TLS, clients need a cert of tls.ca
  std::chrono::milliseconds heartbeat_timeout{10000};
  std::chrono::milliseconds reduce_timeout{60000};
  // Commands are numbered from here. A driver started again in another's place starts beyond
  // every number its predecessor could have used, so that a worker's late result of an old
  // command is never taken for the answer to a new one.
  uint64_t first_command_id = 1;
  // A driver started again in its predecessor's place (TrainerConfig::recovery.driver_state_dir)
  // takes that one's workers as registered under their old ids, from its first call on (a worker
  // that called before would be refused, and exit); heard = false until each calls.
  std::vector<WorkerInfo> adopted;
};


// A call to the driver that found nobody there (connection refused or reset): the driver is down,
// and with a driver that restarts in place it may be back at the same address.
class DriverUnreachable : public CommError {
 public:
  using CommError::CommError;
};

// The request's name as the proto spells it ("train", "set_state"): for messages and logs.
std::string command_name(const proto::Command& command);

class DriverServer {
 public:
  static std::unique_ptr<DriverServer> start(const DriverServerOptions& options);
  virtual ~DriverServer() = default;  // tells workers to stop (via heartbeats) and stops serving

  virtual int port() const = 0;
  virtual std::shared_ptr<comm::Store> store() = 0;
  // Waits until `count` (0: num_workers) workers are alive, while each comes within `timeout` of the
  // one before; TimeoutError says how many are missing and why that might be. `on_tick` runs
  // every ~100 ms meanwhile (it may throw to give up early).
  virtual void wait_registered(std::chrono::milliseconds timeout, const std::function<void()>& on_tick,
                               int count = 0) = 0;
  // Every worker that ever registered, by id (index); evicted ones have alive = false.
  virtual std::vector<WorkerInfo> workers() const = 0;
  // Ids of the live workers, ascending.
  virtual std::vector<int> alive() const = 0;
  // Removes a worker from the job: its queued commands go, its later calls are refused (so it
  // exits), and a replacement may register in its place.
  virtual void evict(int id, const std::string& reason) = 0;
  // Heartbeats tell workers to fail the communication of `generation` and older, and the simple
  // strategy's averages of those generations fail at once (recovery).
  virtual void abort_generation(int64_t generation) = 0;
  // The number of replicas of `generation` (the simple strategy's averages wait for them all).
  virtual void set_world(int64_t generation, int world) = 0;
  // Sends `request` to `targets` (ids; empty: every live worker) and returns their results (ok,
  // with the request's reply) in that order. Throws the worker's error as dsgd's type, naming
  // the worker; CommError when a worker is lost, TimeoutError after `timeout` (zero: none;
  // heartbeats still bound the wait).
  virtual std::vector<proto::CommandResult> call(const proto::Command& request, std::chrono::milliseconds timeout,
                                                 const std::function<void()>& on_tick,
                                                 std::vector<int> targets = {}) = 0;
  // call() in two halves, for a command that runs while the driver does other things (a standby's
  // setup during training): send queues it and returns its id; collect returns the results once
  // every target has answered (nullopt before), and throws as call() does.
  struct Pending {
    uint64_t id = 0;
    std::string kind;
    std::vector<int> targets;
  };
  virtual Pending send(const proto::Command& request, std::vector<int> targets) = 0;
  virtual std::optional<std::vector<proto::CommandResult>> collect(const Pending& pending) = 0;
  // From now on heartbeats tell every worker to exit.
  virtual void stop_workers() = 0;
  virtual int64_t rejected_calls() const = 0;
  // Calls the control plane (this service and the store) has received, refused ones included
  // (counted per process: with another control-plane server in it, its calls too).
  virtual int64_t calls() const = 0;
};

// ---- the worker's side ----
class DriverClient {
 public:
  // `tls` enabled: mutual TLS with these keys (the driver's must be of the same CA).
  DriverClient(std::string address, std::string token, TlsKeys tls = {});
  ~DriverClient();
  struct Registration {
    int64_t worker = -1;
    proto::JobSpec job;
  };
  // Retries until the driver answers or `timeout` passes. CommError when the driver refuses (a
  // full job, another control protocol).
  Registration register_worker(const std::string& host, const std::string& address, int64_t pid,
                               int64_t spawn_index, std::chrono::milliseconds timeout);
  // Calls below throw DriverUnreachable when nobody answers at the driver's address. With a
  // driver grace (a driver that restarts in place: JobSpec.driver_grace_ms) they ride that out:
  // each is tried again as soon as the address accepts a connection, until the driver has been
  // silent for the grace. Thread-safe: a worker that stops sets it to 0, and calls in flight end
  // at their next failure.
  void set_driver_grace(std::chrono::milliseconds grace);
  // Since the driver last answered one of this client's calls (since its construction if none).
  std::chrono::steady_clock::duration since_answered() const;
  // Long poll; id 0 when nothing came within `wait`.
  proto::Command poll(int64_t worker, std::chrono::milliseconds wait);
  // The result of a polled command (its worker and id set).
  void complete(const proto::CommandResult& result);
  struct Beat {
    bool stop = false;
    int64_t abort_generation = 0;
  };
  // Says this worker is alive, and hears the driver's news: answered at once when the driver has
  // aborted a generation after `known_abort_generation` (or ends the job), else after `wait`.
  // `timeout`: beyond `wait`.
  Beat heartbeat(int64_t worker, const std::string& progress, int64_t known_abort_generation,
                 std::chrono::milliseconds wait, std::chrono::milliseconds timeout);
  // The simple strategy: blocks until the average of call `seq` of `generation` from every
  // replica comes back.
  void average(int64_t generation, int64_t rank, uint64_t seq, float* data, size_t count,
               std::chrono::milliseconds timeout);
  const std::string& address() const { return address_; }
  const TlsKeys& tls() const { return tls_; }

 private:
  // raise() for a failed call to the driver; DriverUnreachable where nobody answered.
  [[noreturn]] void raise_from_driver(const grpc::Status& status, const std::string& call) const;
  // `call()`, again while the driver is unreachable within the grace; marks it answered.
  template <typename F>
  auto patiently(F call) -> decltype(call());
  struct Impl;
  std::string address_;
  std::string token_;
  TlsKeys tls_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsgd::control
