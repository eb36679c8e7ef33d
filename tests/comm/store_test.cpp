// Store implementations: the same contract for the memory and file stores, plus prefixes and
// processes sharing a file store.
#include "dsgd/comm/store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "dsgd/common/error.h"
#include "testing/temp_dir.h"

namespace dsgd::comm {
namespace {

using std::chrono::milliseconds;

class StoreContract : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<Store> make() {
    return GetParam() == "memory" ? make_memory_store() : make_file_store(dir_.file("store"));
  }
  testing::TempDir dir_;
};

TEST_P(StoreContract, SetGetOverwriteErase) {
  auto s = make();
  s->set("a", std::string("x\0y", 3));
  EXPECT_EQ(s->get("a", milliseconds(100)), std::string("x\0y", 3));
  s->set("a", "second");
  EXPECT_EQ(s->get("a", milliseconds(100)), "second");
  s->set("odd/key with spaces%", "v");
  EXPECT_EQ(s->get("odd/key with spaces%", milliseconds(100)), "v");
  s->set("empty", "");
  EXPECT_EQ(s->get("empty", milliseconds(100)), "");
  EXPECT_TRUE(s->check({"a", "empty"}));
  EXPECT_FALSE(s->check({"a", "b"}));
  EXPECT_TRUE(s->erase("a"));
  EXPECT_FALSE(s->erase("a"));
  EXPECT_FALSE(s->check({"a"}));
}

TEST_P(StoreContract, GetWaitsForALaterSet) {
  auto s = make();
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    s->set("late", "here");
  });
  EXPECT_EQ(s->get("late", milliseconds(5000)), "here");
  writer.join();
}

TEST_P(StoreContract, WaitTimesOutNamingMissingKeys) {
  auto s = make();
  s->set("present", "1");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    s->wait({"present", "absent1", "absent2"}, milliseconds(200));
    FAIL() << "wait returned without the keys";
  } catch (const TimeoutError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("waited 200 ms for key(s) absent1, absent2"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("present,"), std::string::npos) << msg;
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, milliseconds(200));
  EXPECT_LT(waited, milliseconds(2000));
  EXPECT_THROW(s->get("absent1", milliseconds(10)), TimeoutError);
}

TEST_P(StoreContract, GetManyWaitsForEveryKeyAndKeepsTheirOrder) {
  auto s = make();
  s->set("b", "2");
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    s->set("a", std::string("1\0x", 3));
  });
  EXPECT_EQ(s->get_many({"a", "b"}, milliseconds(5000)), (std::vector<std::string>{std::string("1\0x", 3), "2"}));
  writer.join();
  EXPECT_THROW(s->get_many({"b", "never"}, milliseconds(100)), TimeoutError);
  PrefixStore gen(s, "gen1/");
  gen.set("a", "p");
  EXPECT_EQ(gen.get_many({"a"}, milliseconds(100)), std::vector<std::string>{"p"});
}

TEST_P(StoreContract, AddIsAtomicAcrossThreads) {
  auto s = make();
  EXPECT_EQ(s->add("n", 5), 5);
  EXPECT_EQ(s->add("n", -2), 3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) s->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(s->add("counter", 0), 200);
  s->set("text", "abc");
  EXPECT_THROW(s->add("text", 1), CommError);
}

TEST_P(StoreContract, CompareSet) {
  auto s = make();
  EXPECT_EQ(s->compare_set("leader", "", "rank3"), "rank3");  // absent counts as ""
  EXPECT_EQ(s->compare_set("leader", "", "rank5"), "rank3");  // lost the race
  EXPECT_EQ(s->compare_set("leader", "rank3", "rank7"), "rank7");
}

TEST_P(StoreContract, PrefixesSeparateGenerations) {
  auto base = make();
  PrefixStore gen1(base, "job/gen1/");
  PrefixStore gen2(base, "job/gen2/");
  gen1.set("addr", "old");
  EXPECT_FALSE(gen2.check({"addr"}));
  EXPECT_THROW(gen2.get("addr", milliseconds(20)), TimeoutError);
  gen2.set("addr", "new");
  EXPECT_EQ(gen1.get("addr", milliseconds(10)), "old");
  EXPECT_EQ(base->get("job/gen2/addr", milliseconds(10)), "new");
  EXPECT_EQ(gen2.add("n", 2), 2);
  EXPECT_EQ(gen2.compare_set("c", "", "x"), "x");
  EXPECT_TRUE(gen2.erase("addr"));
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreContract, ::testing::Values("memory", "file"));

TEST(FileStore, ProcessesShareIt) {
  testing::TempDir dir;
  const std::string path = dir.file("shared");
  constexpr int kChildren = 3;
  std::vector<pid_t> pids;
  for (int c = 0; c < kChildren; ++c) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int rc = 0;
      try {
        auto s = make_file_store(path);
        for (int i = 0; i < 20; ++i) s->add("count", 1);
        s->set("child/" + std::to_string(c), "done");
        s->get("go", milliseconds(5000));
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  auto s = make_file_store(path);
  s->wait({"child/0", "child/1", "child/2"}, milliseconds(5000));
  s->set("go", "1");
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(s->add("count", 0), kChildren * 20);
}

TEST(FileStore, UncreatableDirectoryIsAClearError) {
  try {
    make_file_store("/proc/dsgd-cannot-exist/store");
    FAIL() << "created a store under /proc";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/dsgd-cannot-exist/store"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsgd::comm
