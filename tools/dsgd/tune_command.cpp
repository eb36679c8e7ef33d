// `dsgd tune`: hyper-parameter search over the built-in image classifier's jobs (dsgd/tune/tuner.h):
// a table of the trials on stdout, every trial's history in JSON, a plot of the metric per trial.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "dsgd/common/error.h"
#include "dsgd/apps/image_classifier.h"
#include "dsgd/tune/tuner.h"

namespace dsgd::cli {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

struct TuneFlags {
  std::string space_file, dir, json_out, plot, config_json;
  std::string model = "cnn";
  int workers = 1, threads = 1;
  int64_t batch_size = 64;
  TuneOptions tune;
  // Which flags were given (they override the space file's settings).
  bool trials_given = false, iterations_given = false, steps_given = false;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("--space " + path + ": cannot read it");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The space file: a space ({"lr": {"loguniform": [...]}, ...}), or {"space": {...}} with
// optional "trials", "max_iterations", "steps_per_iteration", "metric", "mode" and "base" (fixed
// values: trainer fields or config keys, as in the space).
json load_space_file(TuneFlags& f) {
  json j;
  try {
    j = json::parse(read_file(f.space_file));
  } catch (const json::exception& e) {
    throw ConfigError("--space " + f.space_file + " is not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("space")) return j;
  static const std::vector<std::string> known = {"space", "trials", "max_iterations", "steps_per_iteration",
                                                 "metric", "mode", "base"};
  for (const auto& [k, v] : j.items()) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      throw ConfigError("--space " + f.space_file + ": unknown setting '" + k +
                        "'; a space file holds space, base, trials, max_iterations, steps_per_iteration, metric, mode");
    }
  }
  try {
    if (!f.trials_given && j.contains("trials")) f.tune.num_trials = j["trials"].get<int>();
    if (!f.iterations_given && j.contains("max_iterations")) f.tune.max_iterations = j["max_iterations"].get<int>();
    if (!f.steps_given && j.contains("steps_per_iteration"))
      f.tune.steps_per_iteration = j["steps_per_iteration"].get<int64_t>();
    if (j.contains("metric")) f.tune.metric = j["metric"].get<std::string>();
    if (j.contains("mode")) f.tune.mode = j["mode"].get<std::string>();
  } catch (const json::exception& e) {
    throw ConfigError("--space " + f.space_file + ": a setting has the wrong type: " + e.what());
  }
  return j;
}

std::string params_text(const json& p) {
  std::string out;
  for (const auto& [k, v] : p.items()) {
    std::string value = v.dump();
    if (v.is_number_float()) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.4g", v.get<double>());
      value = buf;
    }
    out += (out.empty() ? "" : " ") + k + "=" + value;
  }
  return out;
}

std::string metric_text(const json& v) {
  if (!v.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v.get<double>());
  return buf;
}

void print_table(const TuneResult& r, const TuneOptions& o) {
  std::printf("| trial | config | iterations | last %s | best | state |\n|---|---|---|---|---|---|\n",
              o.metric.c_str());
  for (size_t i = 0; i < r.trials.size(); ++i) {
    const auto& t = r.trials[i];
    std::string state = t["state"].get<std::string>();
    if (!t["exploited"].empty()) state += " (pbt: " + std::to_string(t["exploited"].size()) + " exploit(s))";
    std::printf("| %zu%s | %s | %zu | %s | %s | %s |\n", i, static_cast<int>(i) == r.best ? " (best)" : "",
                params_text(t["params"]).c_str(), t["history"].size(), metric_text(t["last"]).c_str(),
                metric_text(t["best"]).c_str(), state.c_str());
  }
  std::printf("\n%lld of %lld iterations run (%.0f%%), %d trial(s) stopped early, %.0f s\n",
              static_cast<long long>(r.iterations), static_cast<long long>(r.trials.size()) * o.max_iterations,
              100.0 * static_cast<double>(r.iterations) /
                  std::max<double>(1, static_cast<double>(r.trials.size()) * o.max_iterations),
              r.stopped_early, r.wall_s);
}

// The metric against iterations, a line per trial, through gnuplot; a warning where it fails.
void plot(const TuneResult& r, const TuneOptions& o, const std::string& png) {
  const fs::path dat = png + ".dat";
  {
    std::ofstream out(dat);
    for (size_t i = 0; i < r.trials.size(); ++i) {
      out << "# trial " << i << "\n";
      for (const auto& e : r.trials[i]["history"]) {
        if (e.contains(o.metric) && e[o.metric].is_number()) out << e["iteration"] << " " << e[o.metric] << "\n";
      }
      out << "\n\n";
    }
  }
  const std::string script = "set terminal pngcairo noenhanced size 720,440 font 'sans,9'; set output '" + png +
                             "'; set xlabel 'iteration'; set ylabel '" + o.metric + "'; set title 'dsgd tune (" +
                             o.scheduler + "): " + o.metric + " per trial'; set key outside right; plot for [i=0:" +
                             std::to_string(std::max<size_t>(1, r.trials.size()) - 1) + "] '" + dat.string() +
                             "' index i with linespoints title sprintf('trial %d', i)";
  const std::string command = "gnuplot -e \"" + script + "\" 2>&1";
  FILE* p = ::popen(command.c_str(), "r");
  std::string said;
  if (p != nullptr) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p) != nullptr) said += buf;
  }
  const int rc = p != nullptr ? ::pclose(p) : -1;
  std::error_code ec;
  fs::remove(dat, ec);
  if (rc != 0) {
    std::cerr << "dsgd tune: no plot (" << png << "): gnuplot failed or is missing (scripts/install-deps.sh installs "
              << "gnuplot-nox)" << (said.empty() ? "" : ": " + said) << "\n";
  }
}

int run(TuneFlags& f) {
  const json file = load_space_file(f);
  const json space_json = file.is_object() && file.contains("space") ? file["space"] : file;
  const SearchSpace space = SearchSpace::from_json(space_json, "--space " + f.space_file);
  TrainerConfig base;
  base.num_workers = f.workers;
  base.threads_per_worker = f.threads;
  base.batch_size = f.batch_size;
  base.config = json::object();
  if (!f.config_json.empty()) {
    try {
      base.config = json::parse(f.config_json);
    } catch (const json::exception& e) {
      throw ConfigError(std::string("--config is not valid JSON: ") + e.what());
    }
    if (!base.config.is_object()) throw ConfigError("--config must be a JSON object, e.g. '{\"lr_decay\": 0.7}'");
  }
  if (!base.config.contains("model")) base.config["model"] = f.model;
  if (file.is_object() && file.contains("base")) base = apply_values(base, file["base"]);
  if (f.dir.empty()) f.dir = "tune-" + fs::path(f.space_file).stem().string();
  f.tune.dir = f.dir;
  Tuner tuner(kImageClassifier, base, space, f.tune);
  const TuneResult r = tuner.run();
  print_table(r, f.tune);
  const json out = r.to_json(f.tune);
  for (const std::string& path : {(fs::path(f.dir) / "results.json").string(), f.json_out}) {
    if (path.empty()) continue;
    std::ofstream o(path);
    o << out.dump(1) << "\n";
    if (!o) throw DataError(path, "cannot write the results (the table above has them)");
  }
  plot(r, f.tune, f.plot.empty() ? (fs::path(f.dir) / "tune.png").string() : f.plot);
  return r.best >= 0 ? 0 : kExitFailure;
}

}  // namespace

void add_tune_command(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<TuneFlags>();
  CLI::App* cmd = app.add_subcommand("tune", "Search hyper-parameters: many training jobs, bad ones stopped early");
  cmd->footer(
      "\nExample:\n"
      "  dsgd tune --space examples/tune/cnn.json --scheduler asha --json-out best.json\n"
      "The space file maps keys to distributions: {\"lr\": {\"loguniform\": [0.005, 0.2]}, \"batch_size\":\n"
      "{\"choice\": [32, 64]}, \"momentum\": {\"uniform\": [0.5, 0.95]}} (also grid, randint, or a constant);\n"
      "a key is a TrainerConfig field (batch_size, num_workers, strategy, ...) or an image classifier config\n"
      "key (lr, momentum, lr_decay, model, ...). It may instead be {\"space\": {...}, \"base\": {...},\n"
      "\"trials\": N, \"max_iterations\": K, \"steps_per_iteration\": S, \"metric\": M, \"mode\": max|min}.\n"
      "Killed and started again with the same --dir, it resumes: finished trials are not run again.");
  cmd->add_option("--space", f->space_file, "The search space (JSON)")->required();
  cmd->add_option("--dir", f->dir,
                  "Where the search's state, checkpoints and results live (default: tune-<space name>)");
  cmd->add_option_function<int>("--trials", [f](int n) { f->tune.num_trials = n, f->trials_given = true; },
                                "Trials (each crossed with every grid point; default 8, or the space file's)");
  cmd->add_option("--scheduler", f->tune.scheduler, "fifo (every trial to the end), asha or pbt")
      ->capture_default_str();
  cmd->add_option("--cores", f->tune.cores, "Cores for the trials at once (0: this machine's)")->capture_default_str();
  cmd->add_option_function<int>(
      "--max-iterations", [f](int n) { f->tune.max_iterations = n, f->iterations_given = true; },
      "Iterations (train + validate) per trial (default 4, or the space file's)");
  cmd->add_option_function<int64_t>("--steps-per-iteration",
                                    [f](int64_t n) { f->tune.steps_per_iteration = n, f->steps_given = true; },
                                    "Training steps per iteration (0: an epoch)");
  cmd->add_option("--metric", f->tune.metric, "What to optimise: test_<m> (validation) or train_<m>")
      ->capture_default_str();
  cmd->add_option("--mode", f->tune.mode, "max or min")->capture_default_str();
  cmd->add_option("--grace-period", f->tune.grace_period, "asha: iterations before the first cut")
      ->capture_default_str();
  cmd->add_option("--reduction-factor", f->tune.reduction_factor, "asha: keep the best 1/this at each rung")
      ->capture_default_str();
  cmd->add_option("--perturbation-interval", f->tune.perturbation_interval, "pbt: iterations between exploits")
      ->capture_default_str();
  cmd->add_option("--quantile", f->tune.quantile, "pbt: the worst / best fraction")->capture_default_str();
  cmd->add_option("--seed", f->tune.seed, "Of the samples and of PBT's choices")->capture_default_str();
  cmd->add_option("--model", f->model, "The image classifier's model (unless the space or --config sets it)")
      ->capture_default_str();
  cmd->add_option("--workers", f->workers, "Workers per trial")->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--threads", f->threads, "Threads per worker")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--batch-size", f->batch_size, "Global batch per trial (unless the space sets it)")
      ->capture_default_str();
  cmd->add_option("--config", f->config_json, "The image classifier's config for every trial (JSON object)");
  cmd->add_option("--json-out", f->json_out, "Write the results here too: best (its metrics, params, checkpoint), "
                                             "trials (each one's history), trials_stopped_early");
  cmd->add_option("--plot", f->plot, "PNG of the metric per trial (default: DIR/tune.png; needs gnuplot)");
  cmd->callback([f, exit_code] {
    try {
      *exit_code = run(*f);
    } catch (const ConfigError& e) {
      std::cerr << "dsgd tune: error: " << e.what() << "\n";
      *exit_code = kExitUsage;
    } catch (const std::exception& e) {
      std::cerr << "dsgd tune: error: " << e.what() << "\n";
      *exit_code = kExitFailure;
    }
  });
}

}  // namespace dsgd::cli
