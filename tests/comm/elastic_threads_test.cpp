// ElasticThreads: blocking tasks each get a thread at once (none waits behind another), and
// threads whose task ended are reused rather than made anew.
#include "comm/elastic_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace dsgd::comm {
namespace {

TEST(ElasticThreads, BlockingTasksRunAtOnceEachOnAThread) {
  ElasticThreads threads;
  std::mutex m;
  std::condition_variable cv;
  int started = 0;
  bool release = false;
  for (int i = 0; i < 8; ++i) {
    threads.run([&] {
      std::unique_lock<std::mutex> lock(m);
      ++started;
      cv.notify_all();
      cv.wait(lock, [&] { return release; });  // blocks until all 8 have started
    });
  }
  {
    std::unique_lock<std::mutex> lock(m);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return started == 8; }))
        << "only " << started << " of 8 blocking tasks started: one waits behind another";
    release = true;
  }
  cv.notify_all();
  threads.join();
  EXPECT_EQ(started, 8);
}

TEST(ElasticThreads, ThreadsOfEndedTasksAreReused) {
  ElasticThreads threads;
  std::atomic<int> done{0};
  for (int i = 0; i < 200; ++i) {
    threads.run([&] { ++done; });
    while (done.load() <= i) std::this_thread::yield();  // one task at a time
  }
  // A task's end and its thread's return to the pool race with the next run(): a few extra
  // threads, not one per task.
  EXPECT_LE(threads.threads(), 50u) << "a thread per task";
  threads.join();
  EXPECT_EQ(done.load(), 200);
  EXPECT_EQ(threads.threads(), 0u);
}

}  // namespace
}  // namespace dsgd::comm
