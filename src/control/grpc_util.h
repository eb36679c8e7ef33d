// What every control-plane service and client shares: the job token in the call metadata,
// deadlines, unlimited message sizes (states and gradient buckets can be hundreds of MB), and
// gRPC statuses turned into dsgd errors that name the server. Torch-free.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "control/tls.h"

namespace dsgd::control {

inline constexpr const char* kTokenKey = "dsgd-token";

// True if the call carries `token`; otherwise logs the rejection (method, peer) and returns false.
bool token_ok(const grpc::ServerContext* ctx, const std::string& token, const char* method);

// Calls this process's control-plane servers (driver, store) have received so far: every one that
// reached the token check, refused or not. The control plane's load, for metrics and bench/scale.sh.
int64_t calls_served();

// A channel to `address` without message-size limits; with `tls` enabled, mutual TLS where the
// server must show a certificate of tls.ca naming kTlsServerName.
std::shared_ptr<grpc::Channel> make_channel(const std::string& address, const TlsKeys& tls = {});

// Sets the token and a deadline `timeout` from now.
void prepare(grpc::ClientContext& ctx, const std::string& token, std::chrono::milliseconds timeout);

// Throws the dsgd error for a failed status: TimeoutError (deadline), ConfigError (token),
// CommError (unreachable, other). `where` names the server and the call; `tls`: whether this
// process dialled with TLS (an unreachable driver may be one that refused our keys, or none).
[[noreturn]] void raise(const grpc::Status& status, const std::string& where, const std::string& address,
                        bool tls = false);

// Whether a call failed because the server closed the connection before the first call: at the
// TLS handshake (keys of another CA, or none), not a server that is down or slow.
bool refused_at_connect(const grpc::Status& status);

// Server options shared by the driver's services.
void configure(grpc::ServerBuilder& builder);

}  // namespace dsgd::control
