#include "comm/timeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

namespace dsgd::comm::timeline {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_on{false};
std::atomic<uint64_t> g_generation{0};
std::atomic<int64_t> g_t0_ns{0};
std::atomic<uint32_t> g_next_thread{0};

std::mutex g_mutex;
std::vector<Event> g_events;                // guarded by g_mutex
uint64_t g_dropped = 0;                     // guarded by g_mutex
std::map<uint32_t, std::string> g_names;    // guarded by g_mutex: thread index -> name

thread_local int64_t t_bucket = -1;  // BucketScope's

uint32_t this_thread() {
  thread_local const uint32_t id = g_next_thread.fetch_add(1);
  return id;
}

double now_us() {
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  return static_cast<double>(ns - g_t0_ns.load(std::memory_order_relaxed)) / 1e3;
}

void record(Event e, uint64_t generation) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_on.load(std::memory_order_relaxed) || g_generation.load() != generation) return;
  if (g_events.size() >= kMaxEvents) {
    ++g_dropped;
    return;
  }
  g_events.push_back(std::move(e));
}

}  // namespace

void start() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.clear();
  g_dropped = 0;
  g_t0_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  ++g_generation;
  g_on = true;
}

Recording stop() {
  Recording r;
  std::map<uint32_t, std::string> names;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_on = false;
    r.events.swap(g_events);
    r.dropped = g_dropped;
    names = g_names;
  }
  std::stable_sort(r.events.begin(), r.events.end(),
                   [](const Event& a, const Event& b) { return a.start_us < b.start_us; });
  // Only the threads that recorded something, numbered from 0 in order of their first event.
  std::map<uint32_t, uint32_t> index;
  for (auto& e : r.events) {
    auto [it, added] = index.emplace(e.thread, static_cast<uint32_t>(r.threads.size()));
    if (added) {
      auto name = names.find(e.thread);
      r.threads.push_back(name != names.end() ? name->second : "thread " + std::to_string(e.thread));
    }
    e.thread = it->second;
  }
  return r;
}

bool recording() { return g_on.load(std::memory_order_relaxed); }

void set_thread_name(const std::string& name) {
  const uint32_t id = this_thread();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_names[id] = name;
}

void instant(const char* name, int64_t bucket) {
  if (!recording()) return;
  const uint64_t generation = g_generation.load();
  record({name, bucket, this_thread(), now_us(), -1}, generation);
}

BucketScope::BucketScope(int64_t bucket) : previous_(t_bucket) { t_bucket = bucket; }
BucketScope::~BucketScope() { t_bucket = previous_; }
int64_t current_bucket() { return t_bucket; }

Span::Span(const char* name, int64_t bucket) : on_(recording()), name_(name), bucket_(bucket) {
  if (!on_) return;
  generation_ = g_generation.load();
  start_us_ = now_us();
}

Span::Span(const std::string& name, int64_t bucket) : on_(recording()), bucket_(bucket) {
  if (!on_) return;
  owned_name_ = name;
  generation_ = g_generation.load();
  start_us_ = now_us();
}

Span::~Span() {
  if (!on_) return;
  const double end_us = now_us();
  record({name_ != nullptr ? std::string(name_) : std::move(owned_name_), bucket_, this_thread(), start_us_,
          end_us - start_us_},
         generation_);
}

}  // namespace dsgd::comm::timeline
