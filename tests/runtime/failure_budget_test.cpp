// recovery.max_failures counted within recovery.failure_window (runtime/driver/failure_budget.h).
#include "runtime/driver/failure_budget.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace dsgd::runtime {
namespace {

using std::chrono::seconds;

RecoveryConfig budget_of(int max_failures, std::chrono::milliseconds window) {
  RecoveryConfig r;
  r.max_failures = max_failures;
  r.failure_window = window;
  return r;
}

// --max-failures 2 --failure-window 30s: losses 40 s apart are survived however many there are.
TEST(FailureBudget, LossesFurtherApartThanTheWindowAreSurvived) {
  FailureBudget b(budget_of(2, seconds(30)));
  const auto t0 = FailureBudget::Clock::now();
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(b.admit("worker lost", t0 + seconds(40 * i))) << "loss " << i + 1;
  EXPECT_EQ(b.total(), 6);
  EXPECT_EQ(b.position(), "failure 1 of at most 2 within 30s");
}

// Three within 30 s end the job, and the message names the budget and every failure.
TEST(FailureBudget, OneLossMoreThanTheBudgetWithinTheWindowEndsTheJob) {
  FailureBudget b(budget_of(2, seconds(30)));
  const auto t0 = FailureBudget::Clock::now();
  EXPECT_TRUE(b.admit("worker 1 lost", t0));
  EXPECT_TRUE(b.admit("worker 0 lost", t0 + seconds(10)));
  EXPECT_FALSE(b.admit("worker 1 lost again", t0 + seconds(25)));
  EXPECT_EQ(b.exhausted(),
            "giving up after 3 failures (max_failures 2 within 30s):\n  1. worker 1 lost\n  2. worker 0 lost\n"
            "  3. worker 1 lost again");
}

// A window slides: two early losses age out, two late ones are still within it.
TEST(FailureBudget, TheWindowSlidesWithTheLatestLoss) {
  FailureBudget b(budget_of(2, seconds(30)));
  const auto t0 = FailureBudget::Clock::now();
  EXPECT_TRUE(b.admit("a", t0));
  EXPECT_TRUE(b.admit("b", t0 + seconds(20)));
  EXPECT_TRUE(b.admit("c", t0 + seconds(45)));  // a is out of [15 s, 45 s]
  EXPECT_FALSE(b.admit("d", t0 + seconds(49)));  // b, c, d within [19 s, 49 s]
}

// failure_window 0: the whole job, as before there was a window.
TEST(FailureBudget, AWindowOfZeroCountsOverTheWholeJob) {
  FailureBudget b(budget_of(1, std::chrono::milliseconds(0)));
  const auto t0 = FailureBudget::Clock::now();
  EXPECT_TRUE(b.admit("a", t0));
  EXPECT_FALSE(b.admit("b", t0 + std::chrono::hours(100)));
  EXPECT_EQ(b.exhausted(), "giving up after 2 failures (max_failures 1):\n  1. a\n  2. b");
}

TEST(FailureBudget, TheDefaultLetsALongJobLive) {
  const RecoveryConfig r;
  EXPECT_EQ(r.failure_window, std::chrono::hours(1));
  FailureBudget b(r);
  const auto t0 = FailureBudget::Clock::now();
  for (int day = 0; day < 14; ++day) {  // a loss every 8 hours for two weeks
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(b.admit("lost", t0 + std::chrono::hours(24 * day + 8 * k)));
  }
}

}  // namespace
}  // namespace dsgd::runtime
