// The worker's side of the Driver service (control/driver_service.h): DriverClient.
#include <atomic>
#include <cstring>
#include <thread>

#include "dsgd/control.grpc.pb.h"
#include "dsgd/common/error.h"
#include "control/driver_service.h"
#include "control/grpc_util.h"
#include "control/log.h"

namespace dsgd::control {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct DriverClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<proto::Driver::Stub> stub;
  std::atomic<int64_t> grace_ms{0};
  std::atomic<Clock::rep> answered{Clock::now().time_since_epoch().count()};  // the last answer's time
  std::atomic<bool> waiting{false};  // said so in the log, not answered since
};

DriverClient::DriverClient(std::string address, std::string token, TlsKeys tls)
    : address_(std::move(address)), token_(std::move(token)), tls_(std::move(tls)), impl_(std::make_unique<Impl>()) {
  impl_->channel = make_channel(address_, tls_);
  impl_->stub = proto::Driver::NewStub(impl_->channel);
}

void DriverClient::set_driver_grace(milliseconds grace) { impl_->grace_ms = grace.count(); }

Clock::duration DriverClient::since_answered() const {
  return Clock::now() - Clock::time_point(Clock::duration(impl_->answered.load()));
}

template <typename F>
auto DriverClient::patiently(F call) -> decltype(call()) {
  while (true) {
    try {
      auto out = call();
      impl_->answered = Clock::now().time_since_epoch().count();
      if (impl_->waiting.exchange(false)) log().info("a driver answers at {} again", address_);
      return out;
    } catch (const DriverUnreachable& e) {
      const milliseconds grace(impl_->grace_ms.load());
      if (grace.count() <= 0 || since_answered() > grace) throw;
      if (!impl_->waiting.exchange(true)) {
        log().warn("the driver at {} stopped answering ({}); waiting up to {} s for a driver to take its place "
                   "(recovery.driver_grace)",
                   address_, e.what(), grace.count() / 1000);
      }
      // A call fails at once while the channel is down, and nothing polls its attempts to connect
      // again but a call in flight (gRPC's backup poller looks every 5 s): this wait does.
      std::this_thread::sleep_for(milliseconds(50));
      impl_->channel->WaitForConnected(std::chrono::system_clock::now() + milliseconds(1000));
    }
  }
}

DriverClient::~DriverClient() = default;

DriverClient::Registration DriverClient::register_worker(const std::string& host, const std::string& address,
                                                         int64_t pid, int64_t spawn_index, milliseconds timeout) {
  proto::RegisterRequest req;
  req.set_host(host);
  req.set_address(address);
  req.set_pid(pid);
  req.set_version(DSGD_VERSION_STRING);
  req.set_protocol(kControlProtocol);
  req.set_spawn_index(spawn_index);
  const auto deadline = Clock::now() + timeout;
  // A driver that closes the connection at once, again and again, is up and refuses our keys:
  // asking until the deadline would not help. A call that timed out is asked again (a driver
  // taking a hundred workers' handshakes at once can be slow; it knows a retry by its pid).
  int refused = 0;
  while (true) {
    grpc::ClientContext ctx;
    prepare(ctx, token_, milliseconds(15000));
    proto::RegisterReply reply;
    const grpc::Status s = impl_->stub->Register(&ctx, req, &reply);
    if (s.ok()) return {reply.worker(), reply.job()};
    refused = refused_at_connect(s) ? refused + 1 : 0;
    const bool again =
        s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!again || Clock::now() >= deadline || refused >= 5) {
      raise(s, "driver at " + address_ + ": register", address_, tls_.enabled());
    }
    std::this_thread::sleep_for(milliseconds(200));
  }
}

void DriverClient::raise_from_driver(const grpc::Status& s, const std::string& call) const {
  const std::string where = "driver at " + address_ + ": " + call;
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE) raise(s, where, address_, tls_.enabled());
  try {
    raise(s, where, address_, tls_.enabled());
  } catch (const CommError& e) {  // its words, its type
    throw DriverUnreachable(e.what(), e.op());
  }
}

proto::Command DriverClient::poll(int64_t worker, milliseconds wait) {
  proto::PollRequest req;
  req.set_worker(worker);
  req.set_wait_ms(wait.count());
  return patiently([&] {
    grpc::ClientContext ctx;
    prepare(ctx, token_, wait + milliseconds(10000));
    proto::Command reply;
    const grpc::Status s = impl_->stub->Poll(&ctx, req, &reply);
    if (!s.ok()) raise_from_driver(s, "poll");
    return reply;
  });
}

void DriverClient::complete(const proto::CommandResult& req) {
  // Through a driver's restart: the new one, which never sent the command, keeps the result
  // unread (its commands are numbered beyond the old one's).
  patiently([&] {
    grpc::ClientContext ctx;
    prepare(ctx, token_, milliseconds(60000));
    proto::Empty reply;
    const grpc::Status s = impl_->stub->Complete(&ctx, req, &reply);
    if (!s.ok()) raise_from_driver(s, "complete");
    return true;
  });
}

DriverClient::Beat DriverClient::heartbeat(int64_t worker, const std::string& progress, int64_t known_abort_generation,
                                          milliseconds wait, milliseconds timeout) {
  proto::HeartbeatRequest req;
  req.set_worker(worker);
  req.set_progress(progress);
  req.set_known_abort_generation(known_abort_generation);
  req.set_wait_ms(wait.count());
  return patiently([&] {
    grpc::ClientContext ctx;
    prepare(ctx, token_, wait + timeout);
    proto::HeartbeatReply reply;
    const grpc::Status s = impl_->stub->Heartbeat(&ctx, req, &reply);
    if (!s.ok()) raise_from_driver(s, "heartbeat");
    return Beat{reply.stop(), reply.abort_generation()};
  });
}

void DriverClient::average(int64_t generation, int64_t rank, uint64_t seq, float* data, size_t count,
                           milliseconds timeout) {
  proto::ReduceRequest req;
  req.set_generation(generation);
  req.set_rank(rank);
  req.set_seq(seq);
  req.set_data(reinterpret_cast<const char*>(data), count * sizeof(float));
  grpc::ClientContext ctx;
  prepare(ctx, token_, timeout + milliseconds(5000));
  proto::ReduceReply reply;
  const grpc::Status s = impl_->stub->Reduce(&ctx, req, &reply);
  if (!s.ok()) raise(s, "driver at " + address_ + ": average #" + std::to_string(seq), address_, tls_.enabled());
  if (reply.data().size() != count * sizeof(float)) {
    throw CommError("driver at " + address_ + ": average #" + std::to_string(seq) + " came back with " +
                        std::to_string(reply.data().size()) + " bytes, expected " +
                        std::to_string(count * sizeof(float)),
                    "average");
  }
  std::memcpy(data, reply.data().data(), count * sizeof(float));
}

}  // namespace dsgd::control
