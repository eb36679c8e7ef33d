// The rendezvous store over gRPC: the Store contract through the wire, the job token, deadlines,
// an unreachable server, and a Gloo group formed through it.
#include <gtest/gtest.h>

#include <thread>

#include "dsgd/comm/group.h"
#include "dsgd/common/error.h"
#include "dsgd/control.grpc.pb.h"
#include "control/driver_service.h"
#include "control/grpc_util.h"
#include "control/store_service.h"
#include "testing/ranks.h"

namespace dsgd::control {
namespace {

using std::chrono::milliseconds;

class GrpcStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StoreServer::start(comm::make_memory_store(), "127.0.0.1:0", "secret-token");
    address_ = "127.0.0.1:" + std::to_string(server_->port());
    store_ = connect_store(address_, "secret-token");
  }
  std::unique_ptr<StoreServer> server_;
  std::string address_;
  std::shared_ptr<comm::Store> store_;
};

TEST_F(GrpcStoreTest, ContractThroughTheWire) {
  store_->set("a", std::string("x\0y", 3));
  EXPECT_EQ(store_->get("a", milliseconds(1000)), std::string("x\0y", 3));
  EXPECT_TRUE(store_->check({"a"}));
  EXPECT_FALSE(store_->check({"a", "b"}));
  EXPECT_EQ(store_->add("n", 5), 5);
  EXPECT_EQ(store_->add("n", -2), 3);
  EXPECT_EQ(store_->compare_set("leader", "", "r3"), "r3");
  EXPECT_EQ(store_->compare_set("leader", "", "r5"), "r3");
  EXPECT_TRUE(store_->erase("a"));
  EXPECT_FALSE(store_->erase("a"));
}

TEST_F(GrpcStoreTest, GetWaitsForALaterSetFromAnotherClient) {
  auto other = connect_store(address_, "secret-token");
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(100));
    other->set("late", "here");
  });
  EXPECT_EQ(store_->get("late", milliseconds(5000)), "here");
  writer.join();
}

TEST_F(GrpcStoreTest, GetManyIsOneCallThatWaitsForEveryKey) {
  auto other = connect_store(address_, "secret-token");
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(100));
    other->set("late", "here");
  });
  store_->set("early", std::string("x\0y", 3));
  const int64_t before = server_->calls();
  EXPECT_EQ(store_->get_many({"late", "early"}, milliseconds(5000)),
            (std::vector<std::string>{"here", std::string("x\0y", 3)}));
  writer.join();
  EXPECT_EQ(server_->calls() - before, 2) << "the set and one get_many";
  try {
    store_->get_many({"early", "never"}, milliseconds(300));
    FAIL() << "get_many returned without every key";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
}

TEST_F(GrpcStoreTest, WaitTimesOutNamingTheMissingKeys) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    store_->wait({"never"}, milliseconds(300));
    FAIL() << "wait returned without the key";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(3000));
}

TEST_F(GrpcStoreTest, WrongOrMissingTokenIsRejectedAndChangesNothing) {
  auto intruder = connect_store(address_, "guess");
  try {
    intruder->set("a", "evil");
    FAIL() << "a wrong token was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong or missing job token"), std::string::npos) << e.what();
  }
  EXPECT_THROW(intruder->get("a", milliseconds(10)), ConfigError);
  EXPECT_THROW(connect_store(address_, "")->add("n", 1), ConfigError);
  EXPECT_FALSE(store_->check({"a"}));
  EXPECT_EQ(store_->add("n", 0), 0);
  EXPECT_EQ(server_->rejected_calls(), 3);
}

TEST(GrpcStore, UnreachableServerIsAClearErrorWithinTheDeadline) {
  StoreClientOptions o;
  o.rpc_timeout = milliseconds(500);
  auto store = connect_store("127.0.0.1:1", "t", o);  // nothing listens on port 1
  const auto t0 = std::chrono::steady_clock::now();
  try {
    store->set("k", "v");
    FAIL() << "set reached a server that does not exist";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:1"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(3000));
}

TEST(GrpcStore, GlooGroupFormsThroughTheDriversStore) {
  auto server = StoreServer::start(comm::make_memory_store(), "127.0.0.1:0", "job-token");
  const std::string address = "127.0.0.1:" + std::to_string(server->port());
  testing::run_ranks(3, [&](int rank) {
    auto store = std::make_shared<comm::PrefixStore>(connect_store(address, "job-token"), "job1/gen1/");
    comm::GroupOptions o;
    o.timeout = milliseconds(10000);
    auto group = comm::Group::create(store, rank, 3, o);
    int64_t x = rank + 1;
    group->allreduce(&x, 1, comm::DataType::kInt64, comm::ReduceOp::kSum);
    EXPECT_EQ(x, 6);
  });
}

// Each rank publishes one key and reads everyone's in one call, Gloo's full mesh likewise: the
// driver serves a few calls a rank whatever the group's size, not a few per pair of ranks.
TEST(GrpcStore, AGroupMeetsInAFewCallsARankWhateverItsSize) {
  auto server = StoreServer::start(comm::make_memory_store(), "127.0.0.1:0", "job-token");
  const std::string address = "127.0.0.1:" + std::to_string(server->port());
  auto calls_per_rank = [&](int size) {
    const int64_t before = server->calls();
    testing::run_ranks(size, [&](int rank) {
      auto store = std::make_shared<comm::PrefixStore>(connect_store(address, "job-token"),
                                                       "size" + std::to_string(size) + "/");
      comm::GroupOptions o;
      o.timeout = milliseconds(20000);
      auto group = comm::Group::create(store, rank, size, o);
      int64_t x = 1;
      group->allreduce(&x, 1, comm::DataType::kInt64, comm::ReduceOp::kSum);
      EXPECT_EQ(x, size);
    });
    return static_cast<double>(server->calls() - before) / size;
  };
  // Publish and read the ranks; Gloo: publish and read the hosts, publish and read the addresses;
  // say and hear "connected". Gloo's own way reads each peer's keys in calls of their own: 20 at 8.
  EXPECT_LE(calls_per_rank(2), 8);
  EXPECT_LE(calls_per_rank(8), 8) << "calls a rank grow with the group: a meeting of N ranks costs N^2";
}

// A worker from another build (another control protocol) is refused at registration, with
// both versions named, instead of misreading the commands; one of this build registers.
TEST(DriverService, AWorkerOfAnotherControlProtocolIsRefusedNamingBoth) {
  DriverServerOptions options;
  options.listen = "127.0.0.1:0";
  options.token = "t";
  auto server = DriverServer::start(options);
  const std::string address = "127.0.0.1:" + std::to_string(server->port());
  auto stub = proto::Driver::NewStub(make_channel(address));
  proto::RegisterRequest old_worker;  // protocol unset: what a build before kControlProtocol sends
  old_worker.set_host("h");
  old_worker.set_pid(1);
  proto::RegisterReply reply;
  grpc::ClientContext ctx;
  prepare(ctx, "t", milliseconds(5000));
  const grpc::Status s = stub->Register(&ctx, old_worker, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("control protocol 0"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("this driver " + std::to_string(kControlProtocol)), std::string::npos)
      << s.error_message();
  EXPECT_TRUE(server->workers().empty());
  DriverClient client(address, "t");
  EXPECT_EQ(client.register_worker("h", "127.0.0.1", 2, -1, milliseconds(5000)).worker, 0);
}

// A registration asked again (its answer lost to a timeout) keeps the worker's place: a full job
// of one does not refuse it, and no second worker appears; another process is still refused.
TEST(DriverService, ARegistrationAskedAgainGetsTheSamePlace) {
  DriverServerOptions options;
  options.token = "t";
  options.num_workers = 1;
  auto server = DriverServer::start(options);
  const std::string address = "127.0.0.1:" + std::to_string(server->port());
  DriverClient client(address, "t");
  EXPECT_EQ(client.register_worker("h", "127.0.0.1", 7, 0, milliseconds(5000)).worker, 0);
  EXPECT_EQ(client.register_worker("h", "127.0.0.1", 7, 0, milliseconds(5000)).worker, 0);
  EXPECT_EQ(server->workers().size(), 1u);
  EXPECT_THROW(client.register_worker("h", "127.0.0.1", 8, 1, milliseconds(5000)), CommError);
}

}  // namespace
}  // namespace dsgd::control
