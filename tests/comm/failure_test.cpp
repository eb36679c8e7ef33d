// Failure behaviour with ranks as processes (fork) meeting through a file store: a killed rank
// makes every survivor fail fast naming it; a stopped rank makes them fail at the deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "dsgd/comm/group.h"
#include "dsgd/common/error.h"
#include "testing/temp_dir.h"

namespace dsgd::comm {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// One iteration of the operation under test, on 1 MiB.
void step(Group& g, const std::string& op, std::vector<float>& buf, std::vector<float>& out) {
  const int n = g.size(), r = g.rank();
  const size_t bytes = buf.size() * sizeof(float);
  if (op == "allreduce") g.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kAverage);
  if (op == "broadcast") g.broadcast(buf.data(), bytes, 0);
  if (op == "allgather") g.allgather(buf.data(), out.data(), bytes / n);
  if (op == "reduce_scatter")
    g.reduce_scatter(buf.data(), out.data(), buf.size() / n, DataType::kFloat32, ReduceOp::kSum);
  if (op == "barrier") g.barrier();
  if (op == "sendrecv") {  // a ring: send right, receive from the left
    auto s = g.send_async(buf.data(), bytes, (r + 1) % n, 7);
    g.recv(out.data(), bytes, (r + n - 1) % n, 7);
    s->wait();
  }
}

// Child body: forms the group, reports "ready", then runs `op` until an error; writes
// "<elapsed ms since the victim was signalled>|<peer>|<kind>|<message>" under result/<rank>.
[[noreturn]] void run_child(const std::string& dir, int rank, int size, milliseconds timeout, const std::string& op) {
  int rc = 0;
  try {
    auto store = make_file_store(dir);
    GroupOptions o;
    o.timeout = timeout;
    auto group = Group::create(store, rank, size, o);
    std::vector<float> buf(1 << 18, 1.0f), out(1 << 18);
    store->set("ready/" + std::to_string(rank), "1");
    try {
      for (int i = 0; i < 100000000; ++i) step(*group, op, buf, out);
      store->set("result/" + std::to_string(rank), "no error");
    } catch (const CommError& e) {
      const auto now = Clock::now().time_since_epoch();
      const int64_t signalled = std::stoll(store->get("signalled_at", milliseconds(10000)));
      const int64_t elapsed_ms = std::chrono::duration_cast<milliseconds>(now).count() - signalled;
      const bool is_timeout = dynamic_cast<const TimeoutError*>(&e) != nullptr;
      store->set("result/" + std::to_string(rank), std::to_string(elapsed_ms) + "|" + std::to_string(e.peer()) + "|" +
                                                       (is_timeout ? "timeout|" : "comm|") + e.what());
    }
    // Survivors stay alive until every result is in, as they would in a real job: a survivor
    // that exited early would be a second dead peer for the others.
    store->get("exit", milliseconds(60000));
  } catch (const std::exception& e) {
    rc = 2;
  }
  ::_exit(rc);
}

struct Outcome {
  int64_t elapsed_ms;
  int peer;
  std::string kind;
  std::string message;
};

// Forks `size` ranks, sends `sig` to `victim` once all are communicating, and returns each
// survivor's outcome. Kills and reaps everything before returning.
std::vector<Outcome> run_failure(int size, int victim, int sig, milliseconds timeout,
                                 const std::string& op = "allreduce") {
  testing::TempDir dir;
  const std::string store_dir = dir.file("store");
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) run_child(store_dir, r, size, timeout, op);
    pids.push_back(pid);
  }
  auto store = make_file_store(store_dir);
  std::vector<std::string> ready;
  for (int r = 0; r < size; ++r) ready.push_back("ready/" + std::to_string(r));
  store->wait(ready, milliseconds(20000));
  std::this_thread::sleep_for(milliseconds(200));  // mid-allreduce
  store->set("signalled_at", std::to_string(
                                 std::chrono::duration_cast<milliseconds>(Clock::now().time_since_epoch()).count()));
  ::kill(pids[victim], sig);
  std::vector<Outcome> outcomes;
  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    const std::string v = store->get("result/" + std::to_string(r), timeout * 3 + milliseconds(10000));
    Outcome o;
    const auto a = v.find('|'), b = v.find('|', a + 1), c = v.find('|', b + 1);
    EXPECT_NE(c, std::string::npos) << "rank " << r << ": " << v;
    if (c == std::string::npos) continue;
    o.elapsed_ms = std::stoll(v.substr(0, a));
    o.peer = std::stoi(v.substr(a + 1, b - a - 1));
    o.kind = v.substr(b + 1, c - b - 1);
    o.message = v.substr(c + 1);
    outcomes.push_back(o);
  }
  store->set("exit", "1");
  for (pid_t pid : pids) ::kill(pid, SIGKILL);
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  return outcomes;
}

TEST(GroupFailure, KilledRankMakesSurvivorsFailFastNamingIt) {
  for (int size : {2, 3}) {
    const int victim = size - 1;
    auto outcomes = run_failure(size, victim, SIGKILL, milliseconds(10000));
    ASSERT_EQ(outcomes.size(), static_cast<size_t>(size - 1));
    for (const auto& o : outcomes) {
      EXPECT_LT(o.elapsed_ms, 2000) << o.message;  // far below the 10 s deadline
      EXPECT_EQ(o.kind, "comm") << o.message;
      EXPECT_EQ(o.peer, victim) << o.message;
      EXPECT_NE(o.message.find("rank " + std::to_string(victim) + " (host "), std::string::npos) << o.message;
    }
  }
}

class EveryOperation : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryOperation, KilledRankFailsSurvivorsFastNamingIt) {
  auto outcomes = run_failure(3, 2, SIGKILL, milliseconds(10000), GetParam());
  ASSERT_EQ(outcomes.size(), 2u);
  for (const auto& o : outcomes) {
    EXPECT_LT(o.elapsed_ms, 2000) << o.message;
    EXPECT_EQ(o.kind, "comm") << o.message;
    EXPECT_EQ(o.peer, 2) << o.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, EveryOperation,
                         ::testing::Values("broadcast", "allgather", "reduce_scatter", "barrier", "sendrecv"));

TEST(GroupFailure, StoppedRankMakesSurvivorsFailAtTheDeadline) {
  const milliseconds timeout(1500);
  auto outcomes = run_failure(3, 1, SIGSTOP, timeout);
  ASSERT_EQ(outcomes.size(), 2u);
  for (const auto& o : outcomes) {
    EXPECT_EQ(o.kind, "timeout") << o.message;
    EXPECT_GE(o.elapsed_ms, 1000) << o.message;          // not before the deadline (minus one op's start)
    EXPECT_LT(o.elapsed_ms, 2 * timeout.count()) << o.message;
    EXPECT_NE(o.message.find("no progress for 1500 ms"), std::string::npos) << o.message;
  }
}

}  // namespace
}  // namespace dsgd::comm
