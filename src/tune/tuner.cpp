// The Tuner: trials as Trainer jobs in slots of cores, their reports, the schedulers' decisions,
// and the search's state in <dir>/tune.json (written after every report, so a killed search
// resumes where it was).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "dsgd/common/error.h"
#include "dsgd/common/log.h"
#include "dsgd/tune/tuner.h"
#include "tune/schedulers.h"

namespace dsgd {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using tune::Asha;

void require(bool ok, const std::string& what) {
  if (!ok) throw ConfigError(what);
}

void write_json_atomically(const fs::path& path, const json& j) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    out.flush();
    if (!out) throw DataError(tmp.string(), "cannot write the search's state");
  }
  fs::rename(tmp, path);
}

// What makes a search the same search: a dir holding another is refused, not mixed in.
json fingerprint(const std::string& op, const SearchSpace& space, const TuneOptions& o) {
  return {{"operator", op},
          {"space", space.to_json()},
          {"num_trials", o.num_trials},
          {"scheduler", o.scheduler},
          {"metric", o.metric},
          {"mode", o.mode},
          {"max_iterations", o.max_iterations},
          {"steps_per_iteration", o.steps_per_iteration},
          {"grace_period", o.grace_period},
          {"reduction_factor", o.reduction_factor},
          {"perturbation_interval", o.perturbation_interval},
          {"quantile", o.quantile},
          {"resample_probability", o.resample_probability},
          {"seed", o.seed}};
}

int cores_of(const TrainerConfig& c) {
  return c.num_workers * c.devices_per_worker * std::max(1, c.threads_per_worker);
}

bool ended(const json& t) {
  const auto s = t.value("state", std::string());
  return s == "done" || s == "stopped" || s == "error";
}

// A fixed pool of threads that lives for the whole search: a Trainer made on one of them keeps
// its workers (their parent-death signal follows the thread that started them).
class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void submit(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(m_);
      tasks_.push_back(std::move(f));
      ++pending_;
    }
    cv_.notify_one();
  }
  void wait_all() {
    std::unique_lock<std::mutex> lock(m_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  void loop() {
    while (true) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        f = std::move(tasks_.front());
        tasks_.erase(tasks_.begin());
      }
      f();
      std::lock_guard<std::mutex> lock(m_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::function<void()>> tasks_;
  size_t pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// One search's run: the state, its lock, and the trials' Trainers.
class Search {
 public:
  Search(const std::string& op, const TrainerConfig& base, const SearchSpace& space, const TuneOptions& o,
         const std::vector<json>& initial)
      : op_(op), base_(base), space_(space), o_(o), dir_(o.dir), gen_(o.seed * 0x9E3779B97F4A7C15ULL + 17) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw DataError(dir_.string(), "cannot create the search's directory: " + ec.message());
    const json fp = fingerprint(op, space, o);
    const fs::path path = dir_ / "tune.json";
    if (fs::exists(path)) {
      std::ifstream in(path);
      try {
        state_ = json::parse(in);
      } catch (const json::exception& e) {
        throw DataError(path.string(), std::string("not a search's state (") + e.what() + "); use another --dir");
      }
      if (!state_.is_object() || state_.value("search", json()) != fp) {
        throw ConfigError(dir_.string() + " holds another search (its space or settings differ); use another dir, "
                                          "or the same settings to resume it");
      }
      int resumed = 0;
      for (auto& t : state_["trials"]) {
        if (!ended(t)) t["state"] = "pending", ++resumed;
      }
      dsgd::log().info("tune: resuming {}: {} of {} trials still to run", dir_.string(), resumed,
                       state_["trials"].size());
    } else {
      state_ = {{"version", 1}, {"search", fp}, {"trials", json::array()}};
      for (size_t i = 0; i < initial.size(); ++i) {
        state_["trials"].push_back({{"id", i},
                                    {"params", initial[i]},
                                    {"state", "pending"},
                                    {"history", json::array()},
                                    {"last", nullptr},
                                    {"best", nullptr},
                                    {"checkpoint", ""},
                                    {"exploited", json::array()},
                                    {"time_s", 0.0}});
      }
      save();
    }
    trainers_.resize(state_["trials"].size());
  }

  TuneResult run() {
    const auto t0 = Clock::now();
    int slots = o_.cores > 0 ? o_.cores : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    int per_trial = 1;
    for (const auto& t : state_["trials"]) per_trial = std::max(per_trial, cores_of(config_of(t["params"])));
    slots = std::max(1, slots / per_trial);
    dsgd::log().info("tune: {} trials, {} at once ({} core(s) each), scheduler {}", state_["trials"].size(), slots,
                     per_trial, o_.scheduler);
    if (o_.scheduler == "pbt") {
      run_pbt(slots);
    } else {
      run_each_to_the_end(slots);
    }
    TuneResult r;
    r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(m_);
    r.trials = state_["trials"];
    r.stopped_early = 0;
    double best = NAN;
    for (size_t i = 0; i < r.trials.size(); ++i) {
      const auto& t = r.trials[i];
      r.iterations += static_cast<int64_t>(t["history"].size());
      if (t["state"] == "stopped") ++r.stopped_early;
      if (!t["last"].is_number()) continue;
      const double v = t["last"].get<double>();
      if (std::isnan(best) || better(v, best)) best = v, r.best = static_cast<int>(i);
    }
    return r;
  }

 private:
  bool better(double a, double b) const { return o_.mode == "max" ? a > b : a < b; }

  TrainerConfig config_of(const json& params) const {
    TrainerConfig c = apply_values(base_, params);
    if (c.threads_per_worker == 0) c.threads_per_worker = 1;
    return c;
  }

  fs::path checkpoint_of(size_t i) const { return dir_ / ("trial-" + std::to_string(i)) / "checkpoint"; }

  void save() { write_json_atomically(dir_ / "tune.json", state_); }

  // One iteration of `trainer`: train (an epoch, or steps_per_iteration steps), validate.
  json iterate(Trainer& trainer) {
    json e = json::object();
    Results r;
    if (o_.steps_per_iteration > 0) {
      int64_t left = o_.steps_per_iteration;
      while (left > 0) {
        r = trainer.train({.num_steps = left});
        left -= static_cast<int64_t>(r.metrics.count("batches") ? r.metrics.at("batches") : left);
      }
    } else {
      r = trainer.train();
    }
    for (const auto& [k, v] : r.metrics) e["train_" + k] = v;
    for (const auto& [k, v] : trainer.validate().metrics) e["test_" + k] = v;
    e["epoch"] = r.epoch;
    return e;
  }

  // The trial's Trainer, made (on this thread) from its checkpoint where its history has one.
  Trainer& trainer_of(size_t i) {
    if (!trainers_[i]) {
      json params;
      bool resume = false;
      {
        std::lock_guard<std::mutex> lock(m_);
        auto& t = state_["trials"][i];
        params = t["params"];
        resume = !t["history"].empty();
        // Cut off before its first save (either format's: docs/CHECKPOINTS.md).
        const auto saved = checkpoint_of(i);
        if (resume && !fs::exists(saved / "checkpoint.dsgd") && !fs::exists(saved / "manifest.json")) {
          t["history"] = json::array();
          resume = false;
        }
      }
      trainers_[i] = std::make_unique<Trainer>(op_, config_of(params));
      if (resume) trainers_[i]->load(checkpoint_of(i).string());  // its own (perturbed) values stay
    }
    return *trainers_[i];
  }

  // Runs trial i's next iteration and records it; returns false when the trial ends (done,
  // stopped, failed).
  bool step(size_t i, int iteration, Asha* asha) {
    try {
      Trainer& trainer = trainer_of(i);
      {
        std::lock_guard<std::mutex> lock(m_);
        state_["trials"][i]["state"] = "running";
      }
      const auto t0 = Clock::now();
      json e = iterate(trainer);
      trainer.save(checkpoint_of(i).string());
      const double took = std::chrono::duration<double>(Clock::now() - t0).count();
      std::lock_guard<std::mutex> lock(m_);
      auto& t = state_["trials"][i];
      if (!e.contains(o_.metric) || !e[o_.metric].is_number()) {
        std::string have;
        for (const auto& [k, v] : e.items()) have += (have.empty() ? "" : ", ") + k;
        throw ConfigError("metric '" + o_.metric + "' was not reported; a trial reports: " + have);
      }
      const double v = e[o_.metric].get<double>();
      t["time_s"] = t["time_s"].get<double>() + took;
      e["iteration"] = iteration;
      e["time_s"] = t["time_s"];
      t["history"].push_back(e);
      t["last"] = v;
      if (std::isfinite(v) && (!t["best"].is_number() || better(v, t["best"].get<double>()))) t["best"] = v;
      t["checkpoint"] = checkpoint_of(i).string();
      bool go_on = iteration < o_.max_iterations;
      if (asha != nullptr && !asha->report(static_cast<int>(i), iteration, v) && go_on) {
        t["state"] = "stopped";
        go_on = false;
      } else if (!go_on) {
        t["state"] = "done";
      }
      save();
      if (o_.on_report) o_.on_report(t);
      return go_on;
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(m_);
      auto& t = state_["trials"][i];
      t["state"] = "error";
      t["error"] = e.what();
      save();
      dsgd::log().warn("tune: trial {} failed: {}", i, e.what());
      if (o_.on_report) o_.on_report(t);
      return false;
    }
  }

  // fifo and asha: each trial to its end (or asha's stop) in the first free slot.
  void run_each_to_the_end(int slots) {
    std::optional<Asha> asha;
    if (o_.scheduler == "asha") {
      asha.emplace(Asha::Options{.grace_period = o_.grace_period,
                                 .reduction_factor = o_.reduction_factor,
                                 .max_iterations = o_.max_iterations,
                                 .maximize = o_.mode == "max"});
      for (const auto& t : state_["trials"]) {  // a resumed search's decisions stand
        for (const auto& e : t["history"]) {
          asha->record(t["id"].get<int>(), e["iteration"].get<int>(), e.value(o_.metric, NAN));
        }
      }
    }
    Pool pool(slots);
    for (size_t i = 0; i < state_["trials"].size(); ++i) {
      if (ended(state_["trials"][i])) continue;
      pool.submit([this, i, &asha] {
        int next = 0;
        {
          std::lock_guard<std::mutex> lock(m_);
          next = static_cast<int>(state_["trials"][i]["history"].size()) + 1;
        }
        while (step(i, next, asha ? &*asha : nullptr)) ++next;
        trainers_[i].reset();  // its workers go as it ends
      });
    }
    pool.wait_all();
  }

  // pbt: every trial at once, in rounds of one iteration; exploit and explore between rounds.
  void run_pbt(int slots) {
    Pool pool(slots);
    const auto& trials = state_["trials"];
    while (true) {
      int round = o_.max_iterations + 1;
      for (const auto& t : trials) {
        if (!ended(t)) round = std::min(round, static_cast<int>(t["history"].size()) + 1);
      }
      if (round > o_.max_iterations) break;
      std::vector<size_t> behind;  // those a resumed round has not run yet
      for (size_t i = 0; i < trials.size(); ++i) {
        if (!ended(trials[i]) && static_cast<int>(trials[i]["history"].size()) < round) behind.push_back(i);
      }
      for (size_t i : behind) pool.submit([this, i, round] { step(i, round, nullptr); });
      pool.wait_all();
      if (round % o_.perturbation_interval != 0 || round >= o_.max_iterations) continue;
      std::vector<double> scores;
      for (const auto& t : trials) {
        scores.push_back(t["state"] != "error" && t["last"].is_number() ? t["last"].get<double>() : NAN);
      }
      for (const auto& [loser, winner] : tune::pbt_exploits(scores, o_.mode == "max", o_.quantile, gen_)) {
        exploit(loser, winner, round);
      }
      save();
    }
    for (auto& t : trainers_) t.reset();  // before the pool's threads, which started their workers, end
  }

  // Trial `loser` takes `winner`'s checkpoint and perturbed values; its Trainer is made again.
  void exploit(size_t loser, size_t winner, int round) {
    auto& trials = state_["trials"];
    const json params = space_.perturb(trials[winner]["params"], o_.resample_probability, gen_);
    trainers_[loser].reset();
    std::error_code ec;
    fs::remove_all(checkpoint_of(loser), ec);
    fs::create_directories(checkpoint_of(loser).parent_path(), ec);
    fs::copy(checkpoint_of(winner), checkpoint_of(loser), fs::copy_options::recursive, ec);
    if (ec) throw DataError(checkpoint_of(loser).string(), "cannot copy trial " + std::to_string(winner) +
                                                               "'s checkpoint: " + ec.message());
    auto& t = trials[loser];
    t["exploited"].push_back({{"iteration", round}, {"from", winner}, {"params", params}});
    t["params"] = params;
    dsgd::log().info("tune: pbt: trial {} ({}) takes trial {}'s state ({}) with {}", loser, t["last"].dump(), winner,
                     trials[winner]["last"].dump(), params.dump());
  }

  std::string op_;
  TrainerConfig base_;
  SearchSpace space_;
  TuneOptions o_;
  fs::path dir_;
  std::mt19937_64 gen_;
  std::mutex m_;
  json state_;
  std::vector<std::unique_ptr<Trainer>> trainers_;  // per trial, while it runs
};

}  // namespace

Tuner::Tuner(std::string op, TrainerConfig base, SearchSpace space, TuneOptions options)
    : op_(std::move(op)), base_(std::move(base)), space_(std::move(space)), options_(std::move(options)) {
  const auto& o = options_;
  require(!o.dir.empty(), "tune: a dir is required (the search's state and checkpoints live there)");
  require(o.scheduler == "fifo" || o.scheduler == "asha" || o.scheduler == "pbt",
          "tune: unknown scheduler '" + o.scheduler + "'; use fifo, asha or pbt");
  require(o.mode == "max" || o.mode == "min", "tune: mode must be max or min, got '" + o.mode + "'");
  require(o.num_trials >= 1 && o.num_trials <= 10000,
          "tune: trials must be in 1..10000, got " + std::to_string(o.num_trials));
  require(o.max_iterations >= 1, "tune: max_iterations must be >= 1, got " + std::to_string(o.max_iterations));
  require(o.steps_per_iteration >= 0, "tune: steps_per_iteration must be >= 0 (0: an epoch)");
  const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  require(o.cores >= 0 && o.cores <= machine, "tune: cores must be in 0.." + std::to_string(machine) +
                                                  " (this machine's; 0 = all), got " + std::to_string(o.cores));
  if (o.scheduler == "asha") {
    require(o.grace_period >= 1 && o.grace_period < o.max_iterations,
            "tune: asha's grace_period must be in 1..max_iterations-1, got " + std::to_string(o.grace_period));
    require(o.reduction_factor >= 2, "tune: asha's reduction_factor must be >= 2");
  }
  if (o.scheduler == "pbt") {
    require(o.perturbation_interval >= 1 && o.perturbation_interval < o.max_iterations,
            "tune: pbt's perturbation_interval must be in 1..max_iterations-1, got " +
                std::to_string(o.perturbation_interval));
    require(o.quantile > 0 && o.quantile <= 0.5, "tune: pbt's quantile must be in (0, 0.5]");
    require(o.resample_probability >= 0 && o.resample_probability <= 1, "tune: resample_probability must be in [0, 1]");
  }
  // Every trial's values, checked now: nothing runs on a search that would fail half-way.
  std::mt19937_64 gen(o.seed);
  const size_t n = static_cast<size_t>(o.num_trials) * space_.grid_points();
  const int cores = o.cores > 0 ? o.cores : machine;
  for (size_t i = 0; i < n; ++i) {
    json params = space_.sample(i, gen);
    TrainerConfig c = apply_values(base_, params);
    if (c.threads_per_worker == 0) c.threads_per_worker = 1;
    try {
      validate_config(op_, c);
    } catch (const ConfigError& e) {
      throw ConfigError("tune: trial " + std::to_string(i) + " " + params.dump() + ": " + e.what() +
                        " (a key is a TrainerConfig field: " + [] {
                          std::string f;
                          for (const auto& k : trainer_fields()) f += (f.empty() ? "" : ", ") + k;
                          return f;
                        }() + "; or a key of the operator's config)");
    }
    require(cores_of(c) <= cores, "tune: trial " + std::to_string(i) + " needs " + std::to_string(cores_of(c)) +
                                      " cores (workers x threads), more than the " + std::to_string(cores) + " given");
    initial_.push_back(std::move(params));
  }
}

TuneResult Tuner::run() { return Search(op_, base_, space_, options_, initial_).run(); }

nlohmann::json TuneResult::to_json(const TuneOptions& o) const {
  json out = {{"metric", o.metric},
              {"mode", o.mode},
              {"scheduler", o.scheduler},
              {"trials", trials},
              {"trials_stopped_early", stopped_early},
              {"iterations", iterations},
              {"iterations_if_all_ran", static_cast<int64_t>(trials.size()) * o.max_iterations},
              {"wall_s", wall_s}};
  if (best >= 0) {
    const auto& t = trials[static_cast<size_t>(best)];
    json b = {{"trial", best}, {"params", t["params"]}, {"checkpoint", t["checkpoint"]}, {o.metric, t["last"]}};
    if (!t["history"].empty()) {
      for (const auto& [k, v] : t["history"].back().items()) {
        if (!b.contains(k)) b[k] = v;
      }
    }
    out["best"] = b;
  }
  return out;
}

}  // namespace dsgd
