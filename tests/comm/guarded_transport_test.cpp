// The handshake in front of Gloo's connections (comm/gloo/guarded_transport.h): strangers who
// reach a pair's listening port before the real peer (half-open, garbage, a port scan's probe,
// a wrong or replayed hello) never take the peer's place, a hello gives no secret away, and a
// group forms while every port of the process is under that attack.
#include "comm/gloo/guarded_transport.h"

#include <arpa/inet.h>
#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "dsgd/comm/group.h"
#include "testing/port_attacker.h"
#include "testing/ranks.h"

namespace dsgd::comm {
namespace {

using std::chrono::milliseconds;

int port_of(const gloo::transport::Pair& pair) {
  const std::vector<char> bytes = pair.address().bytes();
  sockaddr_storage ss{};
  std::memcpy(&ss, bytes.data(), std::min(bytes.size(), sizeof ss));
  return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
}

// True if the peer closed `fd` within `within` (the guard dropped this stranger).
bool closed_by_peer(int fd, milliseconds within) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(within.count())) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

// What a stranger can send first: everything but the connecting rank's own hello.
std::string hello_like(int listener, int connector, const PairSecret& secret) {
  const PairHello h = pair_hello(listener, connector, secret);
  return std::string(reinterpret_cast<const char*>(h.data()), h.size());
}

// The hello as it was before it carried an HMAC: the secret itself after the ranks.
std::string hello_with_the_secret_in_clear(int listener, int connector, const PairSecret& secret) {
  std::string h = hello_like(listener, connector, secret).substr(0, 16);
  return h.append(reinterpret_cast<const char*>(secret.data()), secret.size());
}

bool holds(const std::string& bytes, const PairSecret& secret) {
  return bytes.find(std::string(reinterpret_cast<const char*>(secret.data()), secret.size())) != std::string::npos;
}

// What a recording of a hello gives away: not the secret, and nothing another pair or a later
// formation accepts.
TEST(GuardedTransport, AHelloProvesTheSecretWithoutSendingIt) {
  const PairSecret s = random_pair_secret(), next = random_pair_secret();
  const std::string h = hello_like(0, 1, s);
  ASSERT_EQ(h.size(), 32u);
  EXPECT_EQ(h.substr(0, 8), "dsgdpair");
  EXPECT_FALSE(holds(h, s)) << "the secret crosses the network in the clear";
  for (size_t i = 16; i + 4 <= 32; ++i) {  // nor any 4 bytes of it where it used to be
    EXPECT_NE(std::memcmp(h.data() + i, s.data() + (i - 16), 4), 0) << i;
  }
  EXPECT_EQ(h, hello_like(0, 1, s));       // the listener computes what it expects alike
  EXPECT_NE(h, hello_like(2, 1, s));       // another listener: another hello
  EXPECT_NE(h, hello_like(0, 2, s));       // another connector
  EXPECT_NE(h, hello_like(0, 1, next));    // the next formation's secret
}

TEST(GuardedTransport, StrangersWhoArriveFirstNeverTakeAPeersPlace) {
  const std::vector<PairSecret> secrets = {random_pair_secret(), random_pair_secret()};
  std::vector<std::shared_ptr<gloo::transport::Device>> devices;
  std::vector<std::shared_ptr<gloo::transport::Context>> contexts;
  std::vector<gloo::transport::Pair*> pairs;
  for (int r = 0; r < 2; ++r) {
    devices.push_back(make_guarded_device("127.0.0.1", r, secrets));
    contexts.push_back(devices.back()->createContext(r, 2));
    contexts.back()->setTimeout(milliseconds(5000));
    pairs.push_back(contexts.back()->createPair(1 - r).get());  // listening from here on
  }
  // Both pairs listen until connect(); whichever side listens then, every stranger is there first.
  std::vector<int> held;  // stay open: half-open strangers and the ones with a wrong hello
  std::mt19937 rng(5);
  for (int r = 0; r < 2; ++r) {
    const int port = port_of(*pairs[static_cast<size_t>(r)]);
    const int peer = 1 - r;
    for (int i = 0; i < 40; ++i) {  // say nothing: more than a pair holds, the oldest are dropped
      if (const int fd = testing::connect_loopback(port); fd >= 0) held.push_back(fd);
    }
    if (const int fd = testing::connect_loopback(port); fd >= 0) ::close(fd);         // a port scan's probe
    if (const int fd = testing::connect_loopback(port); fd >= 0) {                    // garbage, then gone
      std::string junk(4096, '\0');
      for (auto& c : junk) c = static_cast<char>(rng());
      (void)!::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
      ::close(fd);
    }
    // The right ranks with a wrong secret; the listener's own secret; ranks swapped; a prefix;
    // the real peer's hello recorded in an earlier formation (its secret then); the secret itself
    // where the MAC goes (the hello before it carried one).
    const PairSecret& real = secrets[static_cast<size_t>(peer)];
    PairSecret wrong = real;
    wrong[15] ^= 1;
    for (const std::string& h :
         {hello_like(r, peer, wrong), hello_like(r, peer, secrets[static_cast<size_t>(r)]), hello_like(peer, r, real),
          hello_like(r, peer, real).substr(0, 31), hello_like(r, peer, random_pair_secret()),
          hello_with_the_secret_in_clear(r, peer, real)}) {
      if (const int fd = testing::connect_loopback(port); fd >= 0) {
        ASSERT_EQ(::send(fd, h.data(), h.size(), MSG_NOSIGNAL), static_cast<ssize_t>(h.size()));
        held.push_back(fd);
      }
    }
  }
  std::this_thread::sleep_for(milliseconds(50));  // the loop accepts them all as candidates

  std::vector<std::vector<char>> addresses = {pairs[0]->address().bytes(), pairs[1]->address().bytes()};
  std::exception_ptr errors[2];
  std::thread other([&] {
    try {
      pairs[1]->connect(addresses[0]);
    } catch (...) {
      errors[1] = std::current_exception();
    }
  });
  try {
    pairs[0]->connect(addresses[1]);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  other.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  // The connected pairs carry data both ways, so each holds the real peer.
  std::vector<int> out = {11, 22}, in = {0, 0};
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> send, recv;
  for (int r = 0; r < 2; ++r) {
    send.push_back(contexts[static_cast<size_t>(r)]->createUnboundBuffer(&out[static_cast<size_t>(r)], sizeof(int)));
    recv.push_back(contexts[static_cast<size_t>(r)]->createUnboundBuffer(&in[static_cast<size_t>(r)], sizeof(int)));
    recv.back()->recv(1 - r, 7);
    send.back()->send(1 - r, 7);
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(send[static_cast<size_t>(r)]->waitSend(milliseconds(5000)));
    EXPECT_TRUE(recv[static_cast<size_t>(r)]->waitRecv(milliseconds(5000)));
  }
  EXPECT_EQ(in[0], 22);
  EXPECT_EQ(in[1], 11);
  // Every stranger got in (the listener kept listening), and the listening side dropped its
  // strangers when the peer arrived (the connecting side's went with its listener when it
  // started to connect).
  EXPECT_EQ(held.size(), 2u * (40 + 6));
  for (int fd : held) {
    EXPECT_TRUE(closed_by_peer(fd, milliseconds(2000))) << "a stranger's connection is still held open";
    ::close(fd);
  }
}

// A store as slow as the job's (a gRPC round trip to the driver): Gloo's listeners stay open
// while the ranks fetch each other's addresses, long enough for the attacker to find them.
class SlowStore final : public Store {
 public:
  explicit SlowStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  void set(const std::string& k, const std::string& v) override { inner_->set(k, v); }
  std::string get(const std::string& k, milliseconds t) override {
    std::this_thread::sleep_for(milliseconds(20));
    return inner_->get(k, t);
  }
  bool check(const std::vector<std::string>& k) override { return inner_->check(k); }
  void wait(const std::vector<std::string>& k, milliseconds t) override { inner_->wait(k, t); }
  int64_t add(const std::string& k, int64_t d) override { return inner_->add(k, d); }
  std::string compare_set(const std::string& k, const std::string& e, const std::string& v) override {
    return inner_->compare_set(k, e, v);
  }
  bool erase(const std::string& k) override { return inner_->erase(k); }

 private:
  std::shared_ptr<Store> inner_;
};

// Every listening port of this process, attacked as in the trainer's security test, while
// groups of 3 form and reduce again and again: none fails, every result is right.
TEST(GuardedTransport, GroupsFormUnderAPortScanWithGarbageAndHalfOpenConnections) {
  std::atomic<bool> stop{false};
  std::atomic<int> attacks{0};
  std::thread attacker([&] {
    std::mt19937 rng(1);
    std::vector<int> half_open;
    std::string garbage(512, '\0');
    while (!stop) {
      for (const auto& l : testing::listeners(::getpid())) {
        if (half_open.size() < 200) {
          if (const int fd = testing::connect_loopback(l.port); fd >= 0) half_open.push_back(fd);
        }
        for (auto& c : garbage) c = static_cast<char>(rng());
        if (const int fd = testing::connect_loopback(l.port); fd >= 0) {
          (void)!::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
          ::close(fd);
        }
        if (const int fd = testing::connect_loopback(l.port); fd >= 0) ::close(fd);
        ++attacks;
      }
      std::this_thread::yield();
    }
    for (int fd : half_open) ::close(fd);
  });
  constexpr int kFormations = 15, kSize = 3;
  int formed = 0;
  std::string failures;
  for (int f = 0; f < kFormations; ++f) {
    auto store = std::make_shared<SlowStore>(make_memory_store());
    std::atomic<int> right{0};
    try {
      testing::run_ranks(kSize, [&](int rank) {
        GroupOptions o;
        o.timeout = milliseconds(3000);
        auto group = Group::create(store, rank, kSize, o);
        std::vector<float> v(1000, static_cast<float>(rank + 1));
        group->allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, AllreduceAlgorithm::kRing);
        if (std::all_of(v.begin(), v.end(), [](float x) { return x == 6.0f; })) ++right;
      });
    } catch (const std::exception& e) {
      failures += "\n  formation " + std::to_string(f) + ": " + e.what();
    }
    formed += right == kSize;
  }
  stop = true;
  attacker.join();
  EXPECT_EQ(formed, kFormations) << failures;
  EXPECT_GT(attacks.load(), 0) << "the attacker never found a listening port";
}

}  // namespace
}  // namespace dsgd::comm
