#include "control/grpc_util.h"

#include <absl/synchronization/mutex.h>

#include <atomic>

#include "control/log.h"

#include "dsgd/common/error.h"

namespace dsgd::control {

namespace {
std::atomic<int64_t> g_calls_served{0};

// Debian's Abseil is built without NDEBUG, so every absl::Mutex gRPC locks also tracks lock order
// for deadlock reports: 7% of a 128-worker driver's CPU (perf). Off, once, before gRPC's first use.
void no_deadlock_tracking() {
  static const bool once = [] {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    return true;
  }();
  (void)once;
}
}  // namespace

int64_t calls_served() { return g_calls_served.load(std::memory_order_relaxed); }

bool token_ok(const grpc::ServerContext* ctx, const std::string& token, const char* method) {
  g_calls_served.fetch_add(1, std::memory_order_relaxed);
  const auto& md = ctx->client_metadata();
  auto it = md.find(kTokenKey);
  if (it != md.end() && std::string(it->second.data(), it->second.size()) == token) return true;
  log().warn("control: rejected {} from {}: {} job token", method, ctx->peer(), it == md.end() ? "no" : "wrong");
  return false;
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& address, const TlsKeys& tls) {
  no_deadlock_tracking();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  if (tls.enabled()) args.SetSslTargetNameOverride(kTlsServerName);
  // A server that went away is tried again at least every second (gRPC's default backs off to
  // two minutes): a driver started again in its place (recovery.driver_state_dir) is found
  // within a second of its start, and so is a driver that was slow to come up.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, channel_credentials(tls), args);
}

void prepare(grpc::ClientContext& ctx, const std::string& token, std::chrono::milliseconds timeout) {
  ctx.AddMetadata(kTokenKey, token);
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
}

bool refused_at_connect(const grpc::Status& s) {
  const std::string& m = s.error_message();
  // While connecting (not a call cut off by a driver that went away): the TLS handshake failed,
  // or the server hung up on our first bytes.
  return s.error_code() == grpc::StatusCode::UNAVAILABLE && m.find("failed to connect") != std::string::npos &&
         (m.find("andshake") != std::string::npos || m.find("Socket closed") != std::string::npos);
}

void raise(const grpc::Status& s, const std::string& where, const std::string& address, bool tls) {
  const std::string prefix = where + ": ";
  switch (s.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      throw TimeoutError(prefix + (s.error_message().empty() ? "no answer in time" : s.error_message()), where);
    case grpc::StatusCode::PERMISSION_DENIED:
      throw ConfigError(prefix + "rejected: wrong or missing job token (pass the driver's --token)");
    case grpc::StatusCode::UNAVAILABLE:
      if (refused_at_connect(s)) {
        throw CommError(prefix + "refused at the connection (" + s.error_message() + "): " +
                            (tls ? "the TLS handshake failed: this process and the driver hold no keys of one CA "
                                   "(or the driver runs without TLS); give every process the job's keys (--tls-dir "
                                   "DIR, as the driver's)"
                                 : "the driver runs with TLS and this process has none of the job's keys: give it "
                                   "the job's keys (--tls-dir DIR, as the driver's)"),
                        where);
      }
      throw CommError(prefix + "unreachable (" + s.error_message() + "); is the driver running at " + address + "?",
                      where);
    default:
      throw CommError(prefix + s.error_message(), where);
  }
}

void configure(grpc::ServerBuilder& builder) {
  no_deadlock_tracking();
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
}

}  // namespace dsgd::control
