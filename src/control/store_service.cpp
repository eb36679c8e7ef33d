#include "control/store_service.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <atomic>

#include "dsgd/common/error.h"
#include "dsgd/store.grpc.pb.h"
#include "control/grpc_util.h"

namespace dsgd::control {
namespace {

using std::chrono::milliseconds;

// Waits get this much longer than their own timeout, so the server's answer (naming the missing
// keys) arrives before the client's deadline.
constexpr milliseconds kWaitMargin{2000};

class StoreServiceImpl final : public proto::Store::Service {
 public:
  StoreServiceImpl(std::shared_ptr<comm::Store> store, std::string token)
      : store_(std::move(store)), token_(std::move(token)) {}

  grpc::Status Set(grpc::ServerContext* ctx, const proto::SetRequest* req, proto::Empty*) override {
    return guarded(ctx, "Set", [&] { store_->set(req->key(), req->value()); });
  }
  grpc::Status Get(grpc::ServerContext* ctx, const proto::GetRequest* req, proto::BytesReply* reply) override {
    return guarded(ctx, "Get", [&] { reply->set_value(store_->get(req->key(), milliseconds(req->timeout_ms()))); });
  }
  grpc::Status Check(grpc::ServerContext* ctx, const proto::KeysRequest* req, proto::BoolReply* reply) override {
    return guarded(ctx, "Check", [&] { reply->set_value(store_->check({req->keys().begin(), req->keys().end()})); });
  }
  grpc::Status Wait(grpc::ServerContext* ctx, const proto::KeysRequest* req, proto::Empty*) override {
    return guarded(ctx, "Wait",
                   [&] { store_->wait({req->keys().begin(), req->keys().end()}, milliseconds(req->timeout_ms())); });
  }
  grpc::Status GetMany(grpc::ServerContext* ctx, const proto::KeysRequest* req,
                       proto::BytesListReply* reply) override {
    return guarded(ctx, "GetMany", [&] {
      for (auto& v : store_->get_many({req->keys().begin(), req->keys().end()}, milliseconds(req->timeout_ms())))
        reply->add_values(std::move(v));
    });
  }
  grpc::Status Add(grpc::ServerContext* ctx, const proto::AddRequest* req, proto::IntReply* reply) override {
    return guarded(ctx, "Add", [&] { reply->set_value(store_->add(req->key(), req->delta())); });
  }
  grpc::Status CompareSet(grpc::ServerContext* ctx, const proto::CompareSetRequest* req,
                          proto::BytesReply* reply) override {
    return guarded(ctx, "CompareSet",
                   [&] { reply->set_value(store_->compare_set(req->key(), req->expected(), req->desired())); });
  }
  grpc::Status Erase(grpc::ServerContext* ctx, const proto::KeyRequest* req, proto::BoolReply* reply) override {
    return guarded(ctx, "Erase", [&] { reply->set_value(store_->erase(req->key())); });
  }

  int64_t rejected() const { return rejected_; }

 private:
  // Checks the token, runs `fn`, and turns dsgd errors into gRPC statuses.
  template <typename Fn>
  grpc::Status guarded(grpc::ServerContext* ctx, const char* method, Fn&& fn) {
    if (!token_ok(ctx, token_, method)) {
      ++rejected_;
      return {grpc::StatusCode::PERMISSION_DENIED, "wrong or missing job token"};
    }
    try {
      fn();
      return grpc::Status::OK;
    } catch (const TimeoutError& e) {
      return {grpc::StatusCode::DEADLINE_EXCEEDED, e.what()};
    } catch (const std::exception& e) {
      return {grpc::StatusCode::INTERNAL, e.what()};
    }
  }

  std::shared_ptr<comm::Store> store_;
  const std::string token_;
  std::atomic<int64_t> rejected_{0};
};

class StoreServerImpl : public StoreServer {
 public:
  StoreServerImpl(std::shared_ptr<comm::Store> store, const std::string& address, const std::string& token,
                  const TlsKeys& tls)
      : service_(std::move(store), token) {
    grpc::ServerBuilder builder;
    configure(builder);
    builder.AddListeningPort(address, server_credentials(tls), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
      throw CommError("store server: cannot listen on " + address + " (address in use, or not this host's?)",
                      "store serve");
    }
  }
  ~StoreServerImpl() override { server_->Shutdown(std::chrono::system_clock::now() + milliseconds(500)); }
  int port() const override { return port_; }
  int64_t rejected_calls() const override { return service_.rejected(); }
  int64_t calls() const override { return calls_served(); }

 private:
  StoreServiceImpl service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

class GrpcStore : public comm::Store {
 public:
  GrpcStore(const std::string& address, std::string token, const StoreClientOptions& options)
      : address_(address),
        token_(std::move(token)),
        options_(options),
        stub_(proto::Store::NewStub(make_channel(address, options.tls))) {}

  void set(const std::string& key, const std::string& value) override {
    proto::SetRequest req;
    req.set_key(key);
    req.set_value(value);
    proto::Empty reply;
    call("set " + key, options_.rpc_timeout, [&](grpc::ClientContext* c) { return stub_->Set(c, req, &reply); });
  }
  std::string get(const std::string& key, milliseconds timeout) override {
    proto::GetRequest req;
    req.set_key(key);
    req.set_timeout_ms(timeout.count());
    proto::BytesReply reply;
    call("get " + key, timeout + kWaitMargin, [&](grpc::ClientContext* c) { return stub_->Get(c, req, &reply); });
    return reply.value();
  }
  bool check(const std::vector<std::string>& keys) override {
    proto::KeysRequest req;
    for (const auto& k : keys) req.add_keys(k);
    proto::BoolReply reply;
    call("check", options_.rpc_timeout, [&](grpc::ClientContext* c) { return stub_->Check(c, req, &reply); });
    return reply.value();
  }
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    proto::KeysRequest req;
    for (const auto& k : keys) req.add_keys(k);
    req.set_timeout_ms(timeout.count());
    proto::Empty reply;
    call("wait", timeout + kWaitMargin, [&](grpc::ClientContext* c) { return stub_->Wait(c, req, &reply); });
  }
  std::vector<std::string> get_many(const std::vector<std::string>& keys, milliseconds timeout) override {
    proto::KeysRequest req;
    for (const auto& k : keys) req.add_keys(k);
    req.set_timeout_ms(timeout.count());
    proto::BytesListReply reply;
    call("get_many", timeout + kWaitMargin, [&](grpc::ClientContext* c) { return stub_->GetMany(c, req, &reply); });
    if (reply.values_size() != static_cast<int>(keys.size())) {
      throw CommError("store at " + address_ + ": get_many of " + std::to_string(keys.size()) + " keys returned " +
                          std::to_string(reply.values_size()) + " values",
                      "store get_many");
    }
    return {reply.values().begin(), reply.values().end()};
  }
  int64_t add(const std::string& key, int64_t delta) override {
    proto::AddRequest req;
    req.set_key(key);
    req.set_delta(delta);
    proto::IntReply reply;
    call("add " + key, options_.rpc_timeout, [&](grpc::ClientContext* c) { return stub_->Add(c, req, &reply); });
    return reply.value();
  }
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override {
    proto::CompareSetRequest req;
    req.set_key(key);
    req.set_expected(expected);
    req.set_desired(desired);
    proto::BytesReply reply;
    call("compare_set " + key, options_.rpc_timeout,
         [&](grpc::ClientContext* c) { return stub_->CompareSet(c, req, &reply); });
    return reply.value();
  }
  bool erase(const std::string& key) override {
    proto::KeyRequest req;
    req.set_key(key);
    proto::BoolReply reply;
    call("erase " + key, options_.rpc_timeout, [&](grpc::ClientContext* c) { return stub_->Erase(c, req, &reply); });
    return reply.value();
  }

 private:
  // One RPC with the token and a deadline; failures become dsgd errors naming the server.
  template <typename Fn>
  void call(const std::string& what, milliseconds deadline, Fn&& fn) {
    grpc::ClientContext ctx;
    prepare(ctx, token_, deadline);
    const grpc::Status s = fn(&ctx);
    if (!s.ok()) raise(s, "store at " + address_ + ": " + what, address_, options_.tls.enabled());
  }

  const std::string address_;
  const std::string token_;
  const StoreClientOptions options_;
  std::unique_ptr<proto::Store::Stub> stub_;
};

}  // namespace

std::unique_ptr<grpc::Service> make_store_service(std::shared_ptr<comm::Store> store, const std::string& token) {
  return std::make_unique<StoreServiceImpl>(std::move(store), token);
}

std::unique_ptr<StoreServer> StoreServer::start(std::shared_ptr<comm::Store> store, const std::string& address,
                                                const std::string& token, const TlsKeys& tls) {
  return std::make_unique<StoreServerImpl>(std::move(store), address, token, tls);
}

std::shared_ptr<comm::Store> connect_store(const std::string& address, const std::string& token,
                                           const StoreClientOptions& options) {
  return std::make_shared<GrpcStore>(address, token, options);
}

}  // namespace dsgd::control
