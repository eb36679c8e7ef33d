// A train() call's chunks (runtime/driver/train_chunks.h).
#include "runtime/driver/train_chunks.h"

#include <algorithm>
#include <string>

#include "control/log.h"
#include "runtime/driver/job.h"
#include "runtime/worker/trace_file.h"

namespace dsgd::runtime {

using json = nlohmann::json;

std::function<void()> TrainChunks::progress_tick(const TrainOptions& options, const int64_t& done,
                                                 Clock::time_point t0) {
  return [this, &options, &done, t0] {
    const auto& members = job_.pool->members();
    if (members.empty()) return;
    job_.stragglers.watch();
    const auto& on_progress = job_.config.on_progress;
    if (!on_progress) return;
    const auto w = job_.server->workers().at(static_cast<size_t>(members[0]));
    const json p = json::parse(w.progress.empty() ? "null" : w.progress, nullptr, false);
    if (!p.is_object()) return;
    const int64_t batches = done + resumed_ + p.value("batches", int64_t{0});
    on_progress({batches, options.num_steps, p.value("loss", 0.0),
                 std::chrono::duration<double>(Clock::now() - t0).count(), p.value("batches_per_epoch", int64_t{0}),
                 job_.stragglers.current()});
  };
}

TrainChunks::Position TrainChunks::first_member_position() {
  const auto p = job_.call(command(&proto::Command::mutable_position), true)[0].position();
  return {p.epoch(), p.batch()};
}

std::vector<proto::CommandResult> TrainChunks::train(proto::Command* request, const std::function<void()>& tick,
                                                     int64_t* kept) {
  start_ = first_member_position();
  size_ = request->train().max_batches();
  resume(0, false);
  request->mutable_train()->set_chunk(in_flight_ = ++sent_);
  auto outs = job_.recovering([&] {
    *kept = resumed_;
    if (*kept == 0 && !completed_) return job_.raw_call(*request, {}, tick);
    proto::Command rest = *request;
    if (completed_) rest.mutable_train()->set_results_only(true);
    if (size_ > 0 && !completed_) rest.mutable_train()->set_max_batches(size_ - *kept);
    return job_.raw_call(rest, {}, tick);
  });
  in_flight_ = 0;
  return outs;
}

void TrainChunks::note_caught_up(int64_t batches) {
  auto& events = job_.recovery.events();
  for (const auto& [i, redo] : catching_up_) {
    if (i >= events.size() || batches <= 0) continue;
    auto& ev = events[i];
    const double since = std::chrono::duration<double>(Clock::now() - ev.resumed_at).count();
    ev.caught_up_s = ev.recovery_s + static_cast<double>(redo) * since / static_cast<double>(batches);
  }
  catching_up_.clear();
}

void TrainChunks::count_kept_steps(Results* r, int64_t kept) const {
  r->metrics["batches"] += static_cast<double>(kept);
  if (r->metrics.count("num_samples")) {
    r->metrics["num_samples"] += static_cast<double>(kept * job_.config.batch_size);
  }
}

void TrainChunks::add_traces(const std::vector<proto::CommandResult>& outs, double offset_us, TraceFile* trace) const {
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto w = job_.server->workers().at(static_cast<size_t>(job_.pool->members().at(i)));
    const std::string name =
        "worker " + std::to_string(i) + " (host " + w.host + ", pid " + std::to_string(w.pid) + ")";
    const std::string& events = outs[i].epoch().trace_json();
    trace->add(static_cast<int>(i), name, events.empty() ? json() : json::parse(events), offset_us);
  }
}

int64_t TrainChunks::overlap_trial(proto::TrainRequest* args, int64_t steps) {
  const int64_t chunk = overlap_tuner_.trial_chunk(steps);
  args->set_forward_overlap_buckets(static_cast<int32_t>(overlap_tuner_.next()));
  return chunk;
}

void TrainChunks::record_overlap_trial(const std::vector<proto::CommandResult>& outs, int64_t batches) {
  if (!overlap_tuner_.tuning()) return;
  // Every step waits for the slowest worker: its replicas' slowest steady step counts.
  double steady = 0;
  size_t buckets = 0;
  for (const auto& o : outs) {
    steady = std::max(steady, o.epoch().steady_step_s());
    buckets = std::max(buckets, static_cast<size_t>(o.epoch().buckets()));
  }
  overlap_tuner_.record(batches, steady, buckets);
  if (!overlap_tuner_.tuning()) control::log().info("trainer: {}", overlap_tuner_.summary());
}

}  // namespace dsgd::runtime
