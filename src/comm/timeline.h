// Timeline: what each thread of this process did when, for a training call's trace (Horovod's
// timeline, PyTorch's profiler trace): spans (forward, a bucket's allreduce on its lane, a wait
// for a bucket) and instants (a bucket launched), each on the thread that did it. The runtime
// turns them into Chrome trace events (runtime/trace_file.h; TrainOptions::trace_path).
//
//   timeline::start();                               // recording from now, times from now
//   { timeline::Span s("forward"); run_forward(); }  // a span, if recording
//   timeline::instant("launch", bucket);
//   { timeline::BucketScope b(bucket); queue.submit(...); }  // the queued operation's span names it
//   auto events = timeline::stop();                  // recording stops; the events, by start
//
// Off (the default), a span costs one relaxed atomic load. At the bottom of the layers (comm) so
// that every layer can record. Thread-safe; one recording per process at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsgd::comm::timeline {

struct Event {
  std::string name;
  int64_t bucket = -1;        // the gradient bucket it concerns; -1 = none
  uint32_t thread = 0;        // index into Recording::threads
  double start_us = 0;        // since start()
  double duration_us = -1;    // < 0: an instant
};

struct Recording {
  std::vector<Event> events;         // by start time
  std::vector<std::string> threads;  // each thread's name (set_thread_name), or "thread <i>"
  uint64_t dropped = 0;              // events past kMaxEvents, not kept
};

// A recording keeps at most this many events (about 100 MB); later ones are counted, not kept.
constexpr size_t kMaxEvents = size_t{1} << 20;

// Starts recording (dropping anything recorded before); times count from now.
void start();
// Stops recording and returns what was recorded since start().
Recording stop();
bool recording();
// Names the calling thread in recordings (a queue's name, "replica 0"); the last name set wins.
void set_thread_name(const std::string& name);
void instant(const char* name, int64_t bucket = -1);

// The bucket the calling thread is launching, for the spans of the operations it queues
// (OpQueue::submit takes it along to its thread): set for its lifetime.
class BucketScope {
 public:
  explicit BucketScope(int64_t bucket);
  ~BucketScope();
  BucketScope(const BucketScope&) = delete;
  BucketScope& operator=(const BucketScope&) = delete;

 private:
  int64_t previous_;
};
// The innermost BucketScope's bucket on this thread; -1 = none.
int64_t current_bucket();

// Records [construction, destruction) as one span, if recording at construction. `name` must
// outlive the span (a literal), or pass a std::string (copied only when recording).
class Span {
 public:
  explicit Span(const char* name, int64_t bucket = -1);
  Span(const std::string& name, int64_t bucket = -1);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_;
  const char* name_ = nullptr;
  std::string owned_name_;
  int64_t bucket_;
  double start_us_ = 0;
  uint64_t generation_ = 0;  // the recording it belongs to: a span across stop()/start() is dropped
};

}  // namespace dsgd::comm::timeline
