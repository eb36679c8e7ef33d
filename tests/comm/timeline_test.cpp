// timeline: spans and instants on their threads, only while recording, and bounded.
#include "comm/timeline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "comm/op_queue.h"

namespace dsgd::comm::timeline {
namespace {

const Event* find(const Recording& r, const std::string& name) {
  for (const auto& e : r.events) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

TEST(Timeline, RecordsNothingWhenNotRecording) {
  { Span s("before"); }
  instant("before");
  start();
  const auto r = stop();
  EXPECT_TRUE(r.events.empty());
  { Span s("after"); }
  EXPECT_FALSE(recording());
  start();
  EXPECT_TRUE(stop().events.empty());
}

TEST(Timeline, SpansAndInstantsOnTheThreadsThatRecordedThem) {
  start();
  set_thread_name("main thread");
  {
    Span s("outer", 3);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    instant("mark", 7);
  }
  std::thread other([] {
    set_thread_name("other thread");
    Span s(std::string("inner of ") + "other");
  });
  other.join();
  const auto r = stop();
  ASSERT_EQ(r.events.size(), 3u);
  const Event* outer = find(r, "outer");
  const Event* mark = find(r, "mark");
  const Event* inner = find(r, "inner of other");
  ASSERT_TRUE(outer && mark && inner);
  EXPECT_EQ(outer->bucket, 3);
  EXPECT_EQ(mark->bucket, 7);
  EXPECT_EQ(inner->bucket, -1);
  EXPECT_GE(outer->duration_us, 5000);
  EXPECT_LT(mark->duration_us, 0);  // an instant
  EXPECT_GE(mark->start_us, outer->start_us + 5000);
  EXPECT_GE(inner->start_us, outer->start_us + outer->duration_us);
  // By start time; threads named, numbered in order of their first event.
  EXPECT_EQ(&r.events[0], outer);
  ASSERT_EQ(r.threads.size(), 2u);
  EXPECT_EQ(r.threads[outer->thread], "main thread");
  EXPECT_EQ(outer->thread, mark->thread);
  EXPECT_EQ(r.threads[inner->thread], "other thread");
}

TEST(Timeline, AnOperationQueuedInABucketScopeNamesTheBucket) {
  OpQueue q("queue");
  start();
  {
    BucketScope scope(4);
    EXPECT_EQ(current_bucket(), 4);
    {
      BucketScope inner(9);
      EXPECT_EQ(current_bucket(), 9);
    }
    EXPECT_EQ(current_bucket(), 4);
    q.submit("op in bucket 4", [] {})->wait(std::chrono::milliseconds(5000));
  }
  EXPECT_EQ(current_bucket(), -1);
  q.submit("op in none", [] {})->wait(std::chrono::milliseconds(5000));
  const auto r = stop();
  const Event* in = find(r, "op in bucket 4");
  const Event* out = find(r, "op in none");
  ASSERT_TRUE(in && out);
  EXPECT_EQ(in->bucket, 4);
  EXPECT_EQ(out->bucket, -1);
  EXPECT_EQ(r.threads[in->thread], "queue");  // on the queue's thread
}

TEST(Timeline, ASpanOpenAcrossARestartIsDropped) {
  start();
  {
    Span old("old");
    start();  // times now count from here: "old" would start before zero
  }
  { Span s("new"); }
  const auto r = stop();
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].name, "new");
  EXPECT_GE(r.events[0].start_us, 0);
}

TEST(Timeline, KeepsAtMostTheLimitAndCountsTheRest) {
  start();
  for (size_t i = 0; i < kMaxEvents + 10; ++i) instant("x");
  const auto r = stop();
  EXPECT_EQ(r.events.size(), kMaxEvents);
  EXPECT_EQ(r.dropped, 10u);
  start();
  instant("y");
  const auto again = stop();
  EXPECT_EQ(again.events.size(), 1u);
  EXPECT_EQ(again.dropped, 0u);
}

}  // namespace
}  // namespace dsgd::comm::timeline
