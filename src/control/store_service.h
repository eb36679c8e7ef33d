// The rendezvous store over gRPC: the driver serves a comm::Store to workers on other hosts.
//
//   auto server = dsgd::control::StoreServer::start(dsgd::comm::make_memory_store(), "127.0.0.1:0", token);
//   auto store = dsgd::control::connect_store("127.0.0.1:" + std::to_string(server->port()), token);
//   auto group = dsgd::comm::Group::create(store, rank, size);     // ranks meet through the driver
//
// Every call carries the job token ("dsgd-token" metadata); the server rejects and logs a wrong
// or missing one and changes nothing. Every call has a deadline: waits their own timeout plus a
// margin, the rest StoreClientOptions::rpc_timeout. An unreachable server is a dsgd::CommError
// naming the address. Torch-free; thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "dsgd/comm/store.h"
#include "control/tls.h"

namespace grpc {
class Service;
}

namespace dsgd::control {

// The store as a gRPC service, to serve next to others on one server (the driver's).
std::unique_ptr<grpc::Service> make_store_service(std::shared_ptr<comm::Store> store, const std::string& token);

class StoreServer {
 public:
  // Serves `store` on `address` ("host:port"; port 0 picks a free one). Throws dsgd::CommError
  // if the address cannot be bound.
  // `tls` enabled: mutual TLS, clients need a certificate of tls.ca.
  static std::unique_ptr<StoreServer> start(std::shared_ptr<comm::Store> store, const std::string& address,
                                            const std::string& token, const TlsKeys& tls = {});
  virtual ~StoreServer() = default;  // stops serving; calls in flight are cancelled
  virtual int port() const = 0;
  // Calls rejected for a wrong or missing token so far.
  virtual int64_t rejected_calls() const = 0;
  // Calls received by this process's control-plane servers (this one's, and a driver's if any).
  virtual int64_t calls() const = 0;
};

struct StoreClientOptions {
  std::chrono::milliseconds rpc_timeout{10000};  // deadline of calls that do not wait for keys
  TlsKeys tls;                                   // enabled: mutual TLS with these keys
};

std::shared_ptr<comm::Store> connect_store(const std::string& address, const std::string& token,
                                           const StoreClientOptions& options = {});

}  // namespace dsgd::control
