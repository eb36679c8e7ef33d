// dsgd::fit: the epoch loop over a Trainer (dsgd/runtime/fit.h).
#include "dsgd/runtime/fit.h"

#include <algorithm>
#include <chrono>

namespace dsgd {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The phases TrainOptions::profile reports: the metric, and its key in profile_ms.
struct Phase {
  const char* metric;
  const char* key;
};
constexpr Phase kPhases[] = {
    {"forward_s", "forward"}, {"backward_s", "backward"}, {"optimizer_s", "optimizer"}, {"comm_wait_s", "comm_wait"}};

// Milliseconds per step of each phase of one train() call of `batches` steps and `epoch_s`
// seconds; "other" is what the phases leave of the step.
std::map<std::string, double> profile_of(const Results& r, int64_t batches, double epoch_s) {
  std::map<std::string, double> ms;
  double phases = 0;
  for (const auto& p : kPhases) {
    if (!r.metrics.count(p.metric)) continue;
    ms[p.key] = 1000 * r.metrics.at(p.metric);
    phases += ms[p.key];
  }
  if (r.metrics.count("snapshot_s")) {  // the call's total, between chunks
    ms["snapshot"] = 1000 * r.metrics.at("snapshot_s") / static_cast<double>(batches);
    phases += ms["snapshot"];
  }
  ms["step"] = 1000 * epoch_s / static_cast<double>(batches);
  ms["other"] = std::max(0.0, ms["step"] - phases);
  return ms;
}

// Milliseconds per step of each phase over the epochs of a run, weighted by their steps.
std::map<std::string, double> mean_profile(const std::vector<EpochSummary>& history,
                                           const std::vector<int64_t>& steps) {
  std::map<std::string, double> sum;
  double n = 0;
  for (size_t i = 0; i < history.size(); ++i) {
    if (history[i].profile_ms.empty()) continue;
    const auto w = static_cast<double>(steps[i]);
    for (const auto& [k, v] : history[i].profile_ms) sum[k] += w * v;
    n += w;
  }
  if (n > 0) {
    for (auto& [k, v] : sum) v /= n;
  }
  return sum;
}

// The loop's state, which the Trainer's callbacks read while a call runs.
class Loop {
 public:
  Loop(Trainer& trainer, const FitOptions& o, ProgressListener* listener)
      : trainer_(trainer), o_(o), listener_(listener), saved_(trainer.config()) {
    // A driver that took a lost one's job up goes on with the job's epochs and steps.
    if (const auto at = trainer.restarted_at()) {
      epoch_ = at->epoch - at->first_epoch + 1;
      result_.steps = at->steps;
    }
    trainer_.set_callbacks([this](const TrainProgress& p) { on_progress(p); },
                           [this](const RecoveryEvent& e) {
                             // Whole events, kept in case the call is stopped before it returns them.
                             if (e.kind == "scale_up" || e.resumed_at != Clock::time_point{}) in_call_.push_back(e);
                             if (listener_ != nullptr) listener_->on_recovery(e);
                           });
  }
  ~Loop() { trainer_.set_callbacks(saved_.on_progress, saved_.on_recovery); }
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  FitResult run() {
    const auto wall_start = Clock::now();
    while (epoch_ <= o_.epochs) {
      const int64_t left = o_.max_steps > 0 ? o_.max_steps - result_.steps : 0;
      if (o_.max_steps > 0 && left <= 0) break;
      bool epoch_ended = false;
      try {
        if (o_.stop && o_.stop()) throw Stopped{};
        epoch_ended = train_epoch(left);
      } catch (const Stopped&) {
        stopped();
        break;
      }
      if (listener_ != nullptr) listener_->on_epoch(result_.history.back());
      if (!epoch_ended) break;  // stopped inside the epoch: max_steps reached
      ++epoch_;
    }
    if (o_.profile) result_.profile_ms = mean_profile(result_.history, epoch_steps_);
    result_.parameters = trainer_.parameter_count();
    result_.control_tls = trainer_.tls();
    if (comm_steps_ > 0) result_.comm_bytes_per_step = comm_bytes_ / static_cast<double>(comm_steps_);
    result_.samples_per_s = result_.train_s > 0 ? static_cast<double>(result_.samples) / result_.train_s : 0;
    result_.wall_s = seconds_since(wall_start);
    return result_;
  }

 private:
  struct Stopped {};  // thrown from a progress tick through the Trainer's call

  // FitOptions::stop said so: the steps and recoveries of the call cut short are counted.
  void stopped() {
    result_.interrupted = true;
    result_.steps += in_call_batches_;
    result_.samples += in_call_batches_ * trainer_.config().batch_size;
    if (in_call_t0_ != Clock::time_point{}) result_.train_s += seconds_since(in_call_t0_);
    result_.recoveries.insert(result_.recoveries.end(), in_call_.begin(), in_call_.end());
  }

  // One train() call (to the epoch's end, or `left` steps), then validate: whether the epoch ended.
  bool train_epoch(int64_t left) {
    const auto t0 = Clock::now();
    in_call_.clear();
    in_call_batches_ = 0;
    in_call_t0_ = t0;
    const Results r = trainer_.train(
        {.num_steps = left, .profile = o_.profile, .trace_path = trace_path_of(o_.trace_path, epoch_, o_.epochs)});
    in_call_.clear();
    in_call_t0_ = {};
    const double epoch_s = seconds_since(t0);
    batches_per_epoch_ = r.batches_per_epoch;
    const auto batches = static_cast<int64_t>(r.metrics.at("batches"));
    const auto samples = static_cast<int64_t>(r.metrics.at("num_samples"));
    result_.steps += batches;
    result_.samples += samples;
    if (const auto it = r.metrics.find("comm_bytes_per_step"); it != r.metrics.end()) {
      comm_bytes_ += it->second * static_cast<double>(batches);
      comm_steps_ += batches;
    }
    if (const auto it = r.metrics.find("peak_rss_mib"); it != r.metrics.end())
      result_.worker_peak_rss_mib = std::max(result_.worker_peak_rss_mib, it->second);
    if (const auto it = r.metrics.find("parameter_bytes"); it != r.metrics.end()) result_.parameter_bytes = it->second;
    if (const auto it = r.metrics.find("optimizer_state_bytes"); it != r.metrics.end())
      result_.optimizer_state_bytes = it->second;
    if (const auto it = r.metrics.find("gradient_bytes"); it != r.metrics.end()) result_.gradient_bytes = it->second;
    result_.train_s += epoch_s;
    result_.checkpoint_failures += r.checkpoint_failures;
    result_.checkpoint_waits_s.insert(result_.checkpoint_waits_s.end(), r.checkpoint_waits_s.begin(),
                                      r.checkpoint_waits_s.end());
    result_.checkpoints_behind += r.checkpoints_behind;
    add_stragglers(r);
    EpochSummary e;
    e.epoch = epoch_;
    e.train_loss = r.metrics.count("loss") ? r.metrics.at("loss") : 0;
    e.samples_per_s = epoch_s > 0 ? static_cast<double>(samples) / epoch_s : 0;
    e.epoch_s = epoch_s;
    add_recoveries(r, &e);
    const bool profiled = o_.profile && batches > 0;
    if (profiled) e.profile_ms = profile_of(r, batches, epoch_s);
    epoch_steps_.push_back(profiled ? batches : 0);
    if (o_.evaluate) {
      const Results v = trainer_.validate();
      add_recoveries(v, &e);
      // An operator without validation data reports nothing; a language model no accuracy.
      e.test_loss = v.metrics.count("loss") ? v.metrics.at("loss") : -1;
      e.test_accuracy = v.metrics.count("accuracy") ? v.metrics.at("accuracy") : -1;
    }
    result_.history.push_back(e);
    result_.epochs = epoch_;
    result_.train_loss = e.train_loss;
    result_.test_loss = e.test_loss;
    result_.test_accuracy = e.test_accuracy;
    return r.batch == 0;
  }

  void add_recoveries(const Results& r, EpochSummary* e) {
    for (const auto& ev : r.recoveries) {
      result_.recoveries.push_back(ev);
      if (ev.kind != "scale_up") ++e->recoveries;
    }
  }

  // A straggler still slow at a call's end comes again from the next: one entry, brought up to date.
  void add_stragglers(const Results& r) {
    for (const auto& s : r.stragglers) {
      auto same = std::find_if(result_.stragglers.begin(), result_.stragglers.end(), [&](const Straggler& x) {
        return x.pid == s.pid && x.host == s.host && x.from_step == s.from_step;
      });
      if (same == result_.stragglers.end()) {
        result_.stragglers.push_back(s);
      } else {
        *same = s;
      }
    }
  }

  void on_progress(const TrainProgress& p) {
    if (in_call_t0_ != Clock::time_point{}) in_call_batches_ = p.batches;
    if (o_.stop && o_.stop()) throw Stopped{};
    if (saved_.on_progress) saved_.on_progress(p);
    // Before the first call has returned, worker 0's count (the first epoch's progress too).
    const int64_t per_epoch = batches_per_epoch_ > 0 ? batches_per_epoch_ : p.batches_per_epoch;
    if (listener_ == nullptr || per_epoch == 0) return;
    const int64_t all = per_epoch * o_.epochs;
    const double elapsed = result_.train_s + p.elapsed_s;
    const int64_t step = result_.steps + p.batches;
    const int64_t batch_size = trainer_.config().batch_size;
    listener_->on_batch({.epoch = epoch_,
                         .epochs = o_.epochs,
                         .batch = p.batches,
                         .batches_per_epoch = per_epoch,
                         .step = step,
                         .total_steps = o_.max_steps > 0 ? std::min(o_.max_steps, all) : all,
                         .loss = p.loss,
                         .samples_per_s = elapsed > 0 ? static_cast<double>(step * batch_size) / elapsed : 0,
                         .elapsed_s = elapsed,
                         .stragglers = p.stragglers});
  }

  Trainer& trainer_;
  const FitOptions& o_;
  ProgressListener* listener_;
  const TrainerConfig saved_;  // the callbacks to put back (and to call on, for on_progress)
  FitResult result_;
  int64_t epoch_ = 1;
  int64_t batches_per_epoch_ = 0;     // known after the first call
  std::vector<int64_t> epoch_steps_;  // each epoch's profiled steps, to weigh its profile
  double comm_bytes_ = 0;             // sent to other hosts, summed over the calls that counted them
  int64_t comm_steps_ = 0;
  // The train() call in progress: whole recovery events so far, steps done, when it began.
  std::vector<RecoveryEvent> in_call_;
  int64_t in_call_batches_ = 0;
  Clock::time_point in_call_t0_{};
};

}  // namespace

std::string trace_path_of(const std::string& path, int64_t epoch, int64_t epochs) {
  if (path.empty() || epochs <= 1) return path;
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  const std::string suffix = "-epoch" + std::to_string(epoch);
  return has_ext ? path.substr(0, dot) + suffix + path.substr(dot) : path + suffix;
}

FitResult fit(Trainer& trainer, const FitOptions& options, ProgressListener* listener) {
  return Loop(trainer, options, listener).run();
}

nlohmann::json to_json(const RecoveryEvent& e) {
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& [name, s] : e.phases) phases[name] = phases.value(name, 0.0) + s;
  const auto resumed = std::chrono::system_clock::now() - (std::chrono::steady_clock::now() - e.resumed_at);
  return {{"kind", e.kind},
          {"resumed_at_unix_s", std::chrono::duration<double>(resumed.time_since_epoch()).count()},
          {"failure", e.failure},
          {"lost", e.lost},
          {"at_step", e.at_step},
          {"rolled_back_steps", e.rolled_back_steps},
          {"from_peer", e.from_peer},
          {"detect_s", e.detect_s},
          {"recovery_s", e.recovery_s},
          {"caught_up_s", e.caught_up_s},
          {"workers_after", e.workers_after},
          {"standbys_used", e.standbys_used},
          {"phases_s", phases}};
}

nlohmann::json to_json(const Straggler& s) {
  return {{"rank", s.rank},         {"host", s.host},           {"pid", s.pid},
          {"slowdown", s.slowdown}, {"from_step", s.from_step}, {"to_step", s.to_step},
          {"evicted", s.evicted}};
}

nlohmann::json to_json(const FitResult& r) {
  nlohmann::json recoveries = nlohmann::json::array();
  for (const auto& e : r.recoveries) recoveries.push_back(to_json(e));
  nlohmann::json stragglers = nlohmann::json::array();
  for (const auto& s : r.stragglers) stragglers.push_back(to_json(s));
  nlohmann::json history = nlohmann::json::array();
  for (const auto& e : r.history) {
    history.push_back({{"epoch", e.epoch},
                       {"train_loss", e.train_loss},
                       {"test_loss", e.test_loss},
                       {"test_accuracy", e.test_accuracy},
                       {"samples_per_s", e.samples_per_s},
                       {"epoch_s", e.epoch_s},
                       {"recoveries", e.recoveries}});
    if (!e.profile_ms.empty()) history.back()["profile_ms"] = e.profile_ms;
  }
  nlohmann::json j = {{"test_accuracy", r.test_accuracy}, {"test_loss", r.test_loss},
                      {"train_loss", r.train_loss},       {"epochs", r.epochs},
                      {"steps", r.steps},                 {"samples", r.samples},
                      {"samples_per_s", r.samples_per_s}, {"train_s", r.train_s},
                      {"wall_s", r.wall_s},               {"parameters", r.parameters},
                      {"history", history},               {"recoveries", recoveries},
                      {"stragglers", stragglers},
                      {"checkpoint_failures", r.checkpoint_failures},
                      {"control_plane", r.control_tls ? "tls" : "plaintext"}};
  if (!r.checkpoint_waits_s.empty()) {
    std::vector<double> w = r.checkpoint_waits_s;
    std::sort(w.begin(), w.end());
    j["checkpoints"] = {{"count", w.size()},
                        {"wait_s_median", w[w.size() / 2]},
                        {"wait_s_max", w.back()},
                        {"behind", r.checkpoints_behind}};
  }
  if (!r.profile_ms.empty()) j["profile_ms"] = r.profile_ms;
  if (r.comm_bytes_per_step >= 0) j["comm_bytes_per_step"] = r.comm_bytes_per_step;
  if (r.worker_peak_rss_mib > 0) j["worker_peak_rss_mib"] = r.worker_peak_rss_mib;
  if (r.parameter_bytes > 0) j["parameter_bytes"] = r.parameter_bytes;
  if (r.optimizer_state_bytes > 0) j["optimizer_state_bytes"] = r.optimizer_state_bytes;
  if (r.gradient_bytes > 0) j["gradient_bytes"] = r.gradient_bytes;
  if (r.interrupted) j["interrupted"] = true;
  return j;
}

}  // namespace dsgd
