#include "runtime/control/grpc_util.h"

#include "runtime/control/log.h"

#include "dsgd/error.h"

namespace dsgd::control {

bool token_ok(const grpc::ServerContext* ctx, const std::string& token, const char* method) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(kTokenKey);
  if (it != md.end() && std::string(it->second.data(), it->second.size()) == token) return true;
  log().warn("control: rejected {} from {}: {} job token", method, ctx->peer(), it == md.end() ? "no" : "wrong");
  return false;
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

void prepare(grpc::ClientContext& ctx, const std::string& token, std::chrono::milliseconds timeout) {
  ctx.AddMetadata(kTokenKey, token);
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
}

void raise(const grpc::Status& s, const std::string& where, const std::string& address) {
  const std::string prefix = where + ": ";
  switch (s.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      throw TimeoutError(prefix + (s.error_message().empty() ? "no answer in time" : s.error_message()), where);
    case grpc::StatusCode::PERMISSION_DENIED:
      throw ConfigError(prefix + "rejected: wrong or missing job token (pass the driver's --token)");
    case grpc::StatusCode::UNAVAILABLE:
      throw CommError(prefix + "unreachable (" + s.error_message() + "); is the driver running at " + address + "?",
                      where);
    default:
      throw CommError(prefix + s.error_message(), where);
  }
}

void configure(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
}

}  // namespace dsgd::control
