// The job's ports under attack: garbage bytes, half-open connections and a port scan against the
// driver's and the workers' listening ports while training. The job must be undisturbed: its
// result equals an undisturbed run's. And local mode listens on loopback only.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <torch/nn/module.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <random>
#include <set>
#include <thread>

#include "dsgd/trainer.h"
#include "runtime/builtin_operators.h"
#include "testing/sockets.h"

namespace dsgd {
namespace {

TrainerConfig config() {
  TrainerConfig c;
  c.num_workers = 2;
  c.batch_size = 64;
  c.seed = 7;
  c.allreduce_algo = "ring";  // Gloo on every worker: listening ports of its own
  c.threads_per_worker = 1;
  c.config = {{"model", "cnn"}, {"dataset", "synthetic"}, {"synthetic_samples", 2048}, {"lr", 0.01}, {"dropout", false}};
  return c;
}

std::vector<torch::Tensor> parameters_after(Trainer& t, int64_t steps) {
  t.train({.num_steps = steps});
  std::vector<torch::Tensor> out;
  for (const auto& p : t.get_model()->parameters()) out.push_back(p.detach().clone());
  return out;
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Every port the driver and its workers listen on right now (Gloo's are open only while a group
// forms, so the attacker looks again before every round).
// Local mode must listen on loopback only: a listener anywhere else is counted in *exposed.
std::vector<int> job_ports(std::atomic<int>* exposed) {
  std::vector<testing::Listener> all = testing::listeners(::getpid());
  for (pid_t child : testing::children_of(::getpid())) {
    for (const auto& l : testing::listeners(child)) all.push_back(l);
  }
  std::vector<int> ports;
  for (const auto& l : all) {
    ports.push_back(l.port);
    if (!l.loopback) ++*exposed;
  }
  return ports;
}

TEST(TrainerSecurity, GarbageHalfOpenConnectionsAndAPortScanLeaveTheResultUnchanged) {
  runtime::register_builtin_operators();
  std::vector<torch::Tensor> reference;
  {
    Trainer quiet(runtime::kImageClassifier, config());
    reference = parameters_after(quiet, 20);
  }
  // From before the workers start until training ends: setup, rendezvous and training.
  std::atomic<bool> stop{false};
  std::atomic<int> attacks{0};
  std::atomic<int> exposed{0};
  std::set<int> attacked_ports;
  std::vector<int> half_open;
  std::thread attacker([&] {
    std::mt19937 rng(1);
    std::string garbage(4096, '\0');
    while (!stop) {
      for (int port : job_ports(&exposed)) {
        attacked_ports.insert(port);
        if (half_open.size() < 200) {
          const int fd = connect_to(port);  // connects, then says nothing: a half-open peer
          if (fd >= 0) half_open.push_back(fd);
        }
        for (auto& c : garbage) c = static_cast<char>(rng());
        if (const int fd = connect_to(port); fd >= 0) {  // garbage, then gone
          (void)!::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
          ::close(fd);
        }
        if (const int fd = connect_to(port); fd >= 0) ::close(fd);  // a port scan's probe
        ++attacks;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::vector<torch::Tensor> attacked;
  std::exception_ptr error;
  try {
    Trainer t(runtime::kImageClassifier, config());
    attacked = parameters_after(t, 20);
  } catch (...) {
    error = std::current_exception();
  }
  stop = true;
  attacker.join();
  for (int fd : half_open) ::close(fd);
  if (error) std::rethrow_exception(error);
  std::cout << attacks.load() << " attacks on " << attacked_ports.size() << " ports, " << half_open.size()
            << " half-open connections held\n";
  EXPECT_GT(attacks.load(), 10);
  EXPECT_GE(attacked_ports.size(), 1u);  // the driver's, at least
  EXPECT_EQ(exposed.load(), 0) << "local mode listened beyond loopback";
  ASSERT_EQ(attacked.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(torch::equal(attacked[i], reference[i])) << "parameter " << i << " differs";
  }
}

}  // namespace
}  // namespace dsgd
