// Sleeps that keep to a schedule: the simulated model's clock (simulated.cpp). A thread asked to
// sleep 1 ms wakes late, by tens of microseconds on an idle machine and by much more when other
// processes keep the cores busy; 64 sleeps a step made a 52 ms simulated step take 60 ms alone and
// 68 ms beside a second worker's communication. The compute being modelled (a GPU's kernels) has no
// such lateness, so what one sleep overran is taken off the next ones.
//
//   PacedSleep pace;                 // one per thread
//   for (int l = 0; l < layers; ++l) pace.sleep(layer_ms);  // the total stays near layers x layer_ms
//
// Not thread-safe. Lateness carried over is capped (kMaxDebtMs), so one long stall (the process
// descheduled, a debugger) shortens the next sleeps by at most that much.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>

namespace dsgd::models {

class PacedSleep {
 public:
  static constexpr double kMaxDebtMs = 20;
  // sleeper(ms) sleeps about ms milliseconds and returns how many it did (tests pass a fake clock).
  using Sleeper = std::function<double(double)>;

  PacedSleep() : sleeper_(&sleep_for_ms) {}
  explicit PacedSleep(Sleeper sleeper) : sleeper_(std::move(sleeper)) {}

  // Sleeps ms milliseconds less what earlier sleeps overran (not at all when that is more).
  void sleep(double ms) {
    if (ms <= 0) return;
    const double target = ms - debt_ms_;
    const double slept = target > 0 ? sleeper_(target) : 0.0;
    debt_ms_ = std::clamp(debt_ms_ + slept - ms, 0.0, kMaxDebtMs);
  }

  // Milliseconds overslept so far and not yet taken off a sleep.
  double debt_ms() const { return debt_ms_; }

 private:
  static double sleep_for_ms(double ms) {
    using Ms = std::chrono::duration<double, std::milli>;
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(Ms(ms));
    return Ms(std::chrono::steady_clock::now() - t0).count();
  }

  Sleeper sleeper_;
  double debt_ms_ = 0;
};

}  // namespace dsgd::models
