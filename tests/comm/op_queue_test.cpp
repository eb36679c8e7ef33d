// OpQueue: order, completion, sticky errors, shutdown.
#include "comm/op_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "dsgd/common/error.h"

namespace dsgd::comm {
namespace {

TEST(OpQueue, RunsInSubmissionOrder) {
  OpQueue q("test");
  std::vector<int> order;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 100; ++i)
    works.push_back(q.submit("op " + std::to_string(i), [&order, i] { order.push_back(i); }));
  works.back()->wait(std::chrono::milliseconds(5000));
  for (auto& w : works) EXPECT_TRUE(w->test());
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(OpQueue, FirstErrorIsStickyForQueuedAndLaterOperations) {
  OpQueue q("test");
  std::atomic<bool> ran_after{false};
  auto bad = q.submit("bad", [] { throw CommError("peer 3 died", "op", 3); });
  auto queued = q.submit("queued", [&] { ran_after = true; });
  EXPECT_THROW(bad->wait(std::chrono::milliseconds(5000)), CommError);
  try {
    queued->wait(std::chrono::milliseconds(5000));
    FAIL() << "an operation after a failure ran";
  } catch (const CommError& e) {
    EXPECT_EQ(e.peer(), 3);
  }
  EXPECT_FALSE(ran_after);
  auto later = q.submit("later", [] {});
  EXPECT_TRUE(later->test());
  EXPECT_THROW(later->wait(), CommError);
}

TEST(OpQueue, WaitWithDeadlineTimesOutAndDestructorFailsTheRest) {
  std::shared_ptr<Work> slow, pending;
  {
    OpQueue q("test");
    slow = q.submit("slow", [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
    pending = q.submit("pending", [] {});
    EXPECT_THROW(slow->wait(std::chrono::milliseconds(10)), TimeoutError);
  }
  EXPECT_TRUE(slow->test());
  EXPECT_TRUE(pending->test());  // ran or failed: never left hanging
}

}  // namespace
}  // namespace dsgd::comm
