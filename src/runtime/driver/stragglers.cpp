#include "runtime/driver/stragglers.h"

#include <algorithm>
#include <utility>

namespace dsgd::runtime {

void StragglerDetector::observe(int worker, int rank, const std::string& host, int64_t pid, int64_t step,
                                int64_t timed_steps, double compute_s, double now_s) {
  Rank& r = ranks_[worker];
  r.rank = rank;
  r.host = host;
  r.pid = pid;
  if (!r.samples.empty() && timed_steps <= r.samples.back().timed_steps) return;  // no new step
  r.samples.push_back({step, timed_steps, compute_s, now_s});
}

bool StragglerDetector::window_rate(Rank& r, double* rate, int64_t* from_step) const {
  if (r.samples.size() < 2) return false;
  const Sample& now = r.samples.back();
  // The newest sample a whole window back; older ones are no longer needed.
  auto start = r.samples.end();
  for (auto it = r.samples.begin(); it != r.samples.end() - 1; ++it) {
    if (now.timed_steps - it->timed_steps >= o_.window_steps && now.t - it->t >= o_.window_s) start = it;
  }
  if (start == r.samples.end()) return false;
  r.samples.erase(r.samples.begin(), start);
  const Sample& then = r.samples.front();
  *rate = (now.compute_s - then.compute_s) / static_cast<double>(now.timed_steps - then.timed_steps);
  *from_step = then.step;
  return true;
}

std::vector<Straggler> StragglerDetector::update() {
  std::map<int, std::pair<double, int64_t>> rates;  // worker -> (compute per step, window start)
  for (auto& [worker, r] : ranks_) {
    double rate = 0;
    int64_t from = 0;
    if (window_rate(r, &rate, &from)) rates[worker] = {rate, from};
  }
  std::vector<Straggler> changed;
  if (rates.size() < 2) return changed;
  for (auto& [worker, r] : ranks_) {
    const auto it = rates.find(worker);
    if (it == rates.end()) continue;
    std::vector<double> others;
    for (const auto& [w, x] : rates) {
      if (w != worker) others.push_back(x.first);
    }
    std::nth_element(others.begin(), others.begin() + static_cast<long>(others.size() / 2), others.end());
    double median = others[others.size() / 2];
    if (others.size() % 2 == 0) {  // the mean of the middle two
      median = (median + *std::max_element(others.begin(), others.begin() + static_cast<long>(others.size() / 2))) / 2;
    }
    const double rate = it->second.first;
    const double ratio = median > 0 ? rate / median : 1;
    const bool slow = ratio >= o_.threshold && rate - median >= o_.min_excess_s;
    // Cleared at half the margin: a rank on the line is not named and cleared over and over.
    const bool cleared = ratio < 1 + (o_.threshold - 1) / 2;
    const int64_t step = r.samples.back().step;
    if (!r.slow && slow) {
      r.slow = true;
      r.event = events_.size();
      events_.push_back({r.rank, r.host, r.pid, ratio, it->second.second, -1});
      changed.push_back(events_.back());
    } else if (r.slow && cleared) {
      r.slow = false;
      events_[r.event].to_step = step;
      changed.push_back(events_[r.event]);
    } else if (r.slow) {
      events_[r.event].slowdown = std::max(events_[r.event].slowdown, ratio);
    }
  }
  return changed;
}

std::vector<Straggler> StragglerDetector::current() const {
  std::vector<Straggler> out;
  for (const auto& e : events_) {
    if (e.to_step < 0) out.push_back(e);
  }
  return out;
}

std::vector<Straggler> StragglerDetector::take_named() {
  std::vector<Straggler> out = std::exchange(events_, {});
  for (auto& [worker, r] : ranks_) {  // the open ones stay, to report their end later
    if (!r.slow) continue;
    events_.push_back(out[r.event]);
    r.event = events_.size() - 1;
  }
  return out;
}

void StragglerDetector::evicted(int64_t pid) {
  int64_t step = 0;
  for (const auto& [worker, r] : ranks_) {
    if (r.pid == pid && !r.samples.empty()) step = r.samples.back().step;
  }
  for (auto& e : events_) {
    if (e.to_step >= 0 || e.pid != pid) continue;
    e.evicted = true;
    e.to_step = std::max(step, e.from_step);
  }
}

void StragglerDetector::reset(int64_t step) {
  for (auto& e : events_) {
    if (e.to_step < 0) e.to_step = step;
  }
  ranks_.clear();
}

}  // namespace dsgd::runtime
