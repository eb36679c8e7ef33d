#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "commands.h"
#include "dsgd/runtime/cluster.h"
#include "dsgd/common/error.h"
#include "dsgd/runtime/fit.h"
#include "dsgd/apps/image_classifier.h"
#include "dsgd/apps/language_model.h"
#include "dsgd/apps/local_job.h"
#include "dsgd/runtime/settings.h"
#include "dsgd/runtime/trainer.h"
#include "progress.h"
#include "train_flags.h"

namespace dsgd::cli {
namespace {

// --model gpt-*: the language model (dsgd/apps/language_model.h) on --dataset text:DIR.
bool is_language_model(const TrainFlags& f) {
  return f.job.model.rfind("gpt-", 0) == 0 || f.job.dataset.rfind("text:", 0) == 0;
}
const char* operator_of_job(const TrainFlags& f) { return is_language_model(f) ? kLanguageModel : kImageClassifier; }

TrainerConfig trainer_config_of(const TrainFlags& f);

// A language model's figures: tokens/s and validation perplexity (exp of the mean loss per token).
void add_language_model_figures(const TrainFlags& f, nlohmann::json* j) {
  const LanguageModelOptions o = language_model_options(trainer_config_of(f).config);
  const auto tokens = static_cast<double>(language_model_context(o));
  (*j)["lr"] = o.lr;
  (*j)["tokens_per_s"] = (*j)["samples_per_s"].get<double>() * tokens;
  (*j)["tokens"] = (*j)["samples"].get<double>() * tokens;
  (*j)["model_flops_per_s"] =
      kTrainingFlopsPerParameterToken * (*j)["parameters"].get<double>() * (*j)["tokens_per_s"].get<double>();
  const double val_loss = (*j)["test_loss"].get<double>();
  if (val_loss >= 0) (*j)["perplexity"] = std::exp(val_loss);
  j->erase("test_accuracy");
  for (const char* k : {"momentum", "lr_decay"}) j->erase(k);
  (*j)["optimizer"] = "adamw";
}

nlohmann::json to_json(const TrainFlags& f, const dsgd::FitResult& r) {
  nlohmann::json j = dsgd::to_json(r);
  j.update({{"workers", f.in_process ? 0 : f.trainer.num_workers},
            {"devices_per_worker", f.trainer.devices_per_worker},
            {"strategy", f.in_process ? "in-process" : f.trainer.strategy.name()},
            {"model", f.job.model},
            {"dataset", f.job.dataset},
            {"batch_size", f.job.batch_size},
            {"optimizer", f.job.optimizer},
            {"lr", f.job.lr},
            {"momentum", f.job.momentum},
            {"lr_decay", f.job.lr_decay},
            {"seed", f.job.seed},
            {"threads", f.job.threads}});
  if (f.trainer.checkpoints.dir.empty()) j.erase("checkpoint_failures");
  if (is_language_model(f)) add_language_model_figures(f, &j);
  if (!f.in_process) {
    j["compression"] = find_setting("comm.compression")->get(f.trainer);
    j["settings"] = changed_settings(trainer_config_of(f));  // what this run set, by path
  }
  return j;
}

// Checks the output file can be written now, so a long run does not fail at its very end.
void check_writable(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw ConfigError(flag + " " + path + ": directory " + dir.string() + " does not exist; create it first");
  }
  if (fs::is_directory(p, ec)) throw ConfigError(flag + " " + path + ": is a directory; name a file");
  if (::access(dir.c_str(), W_OK) != 0) {
    throw ConfigError(flag + " " + path + ": directory " + dir.string() + " is not writable");
  }
}

// Flags that give the job its shape themselves: an engine's environment (ClusterSpec::from_engine)
// is then set aside.
bool shapes_the_job(const TrainFlags& f) {
  for (const char* flag : {"--workers", "--listen", "--launcher", "--in-process"}) {
    if (f.command->count(flag) > 0) return true;
  }
  return false;
}

// A cluster spec whose task is the chief: the driver binds its address and waits for its
// workers (and ps shard processes), which a cluster manager starts.
void apply_cluster(TrainFlags& f) {
  const auto spec = ClusterSpec::load(f.cluster);
  if (!spec) return;
  if (spec->from_engine && shapes_the_job(f)) {
    if (!f.quiet) {
      std::cerr << "dsgd train: " << spec->source << " set aside: --workers, --listen, --launcher or --in-process "
                << "shape this job\n";
    }
    return;
  }
  if (spec->task_type != "chief") {
    throw ConfigError("this process's task in the cluster spec is " + spec->task_name() + ": run `dsgd " +
                      (spec->task_type == "ps"       ? "ps-server"
                       : spec->task_type == "worker" ? "worker"
                                                     : "evaluate") +
                      " --cluster` for it; `dsgd train` is the chief");
  }
  const int workers = static_cast<int>(spec->workers.size());
  if (f.trainer.num_workers != TrainerConfig{}.num_workers && f.trainer.num_workers != workers) {
    throw ConfigError("--workers " + std::to_string(f.trainer.num_workers) + " but the cluster spec names " +
                      std::to_string(workers) + " worker(s); leave --workers out");
  }
  const bool launched = !(f.trainer.launch.launcher == Launcher::kAuto || f.trainer.launch.launcher == Launcher::kNone);
  if (f.in_process || launched || !f.trainer.launch.listen.empty()) {
    throw ConfigError(
        "with a cluster spec the driver listens on its chief entry and a cluster manager starts the "
        "workers: it takes none of --in-process, --launcher, --listen");
  }
  if (!spec->ps.empty() && f.trainer.strategy != Strategy::kPs) {
    throw ConfigError("the cluster spec names ps tasks: train with --strategy ps (their shards), or leave them out");
  }
  if (!spec->evaluators.empty() && f.trainer.checkpoints.dir.empty()) {
    throw ConfigError(
        "the cluster spec names an evaluator, which evaluates the job's checkpoints: give "
        "--checkpoint-dir (a directory the evaluator's host sees too)");
  }
  if (f.trainer.launch.token.empty()) {
    throw ConfigError("the job's workers start apart (" + spec->source + "): give every process the same token, "
                      "$DSGD_TOKEN or $DSGD_TOKEN_FILE (or --token here and in the workers)");
  }
  f.trainer.num_workers = workers;
  f.trainer.launch.listen = spec->chief;
  f.trainer.launch.launcher = Launcher::kNone;
  if (!spec->ps.empty()) {
    f.trainer.ps.placement = PsPlacement::kProcesses;
    f.trainer.ps.shards = static_cast<int>(spec->ps.size());
  }
}

// What only the command line has: --in-process (no Trainer), --config's text, the output
// files. Everything a TrainerConfig holds is the Trainer's validation's (trainer_config_of).
void check_in_process(const TrainFlags& f) {
  const TrainerConfig d;
  const auto& t = f.trainer;
  if (t.num_workers != d.num_workers || t.devices_per_worker != d.devices_per_worker || !f.save.empty() ||
      !f.load.empty() || !t.launch.listen.empty() || !t.checkpoints.dir.empty() || f.profile || !f.trace.empty()) {
    throw ConfigError(
        "--in-process trains in this one process: it takes none of --workers, "
        "--devices-per-worker, --save, --load, --listen, --checkpoint-dir, --profile, --trace");
  }
  if (t.recovery.standby_workers > 0) throw ConfigError("--standby applies to worker jobs, not --in-process");
  if (t.launch.launcher != Launcher::kAuto || !f.hosts_file.empty()) {
    throw ConfigError("--in-process trains in this one process: it takes neither --launcher nor --hosts");
  }
  if (!f.config.empty()) throw ConfigError("--config applies to worker jobs, not --in-process");
  if (t.device == Device::kCuda || t.step.precision != Precision::kFp32 || t.comm.compression != Compression::kNone ||
      t.step.loss_scale > 0) {
    throw ConfigError(
        "--device cuda, --precision, --compression and --loss-scale apply to worker jobs; --in-process "
        "trains float32 on the CPU");
  }
}

// The Trainer's config: the flags bound to it, plus what the operator's config and the job
// options say.
TrainerConfig trainer_config_of(const TrainFlags& f) {
  const auto& j = f.job;
  TrainerConfig c = f.trainer;
  if (!f.hosts_file.empty()) c.launch.hosts = read_hosts_file(f.hosts_file);
  c.batch_size = j.batch_size;
  c.seed = j.seed;
  c.threads_per_worker = j.threads;
  if (is_language_model(f)) {  // the token files of `dsgd prepare-text --out DIR`
    const std::filesystem::path dir = j.dataset.substr(std::string("text:").size());
    c.config = {{"model", j.model}, {"train_tokens", (dir / "train.tok").string()}};
    if (std::filesystem::exists(dir / "val.tok")) c.config["val_tokens"] = (dir / "val.tok").string();
    if (f.lr_option != nullptr && f.lr_option->count() > 0) c.config["lr"] = j.lr;
    c.step.scheduler_step_freq = SchedulerStepFreq::kBatch;  // warmup and cosine count steps
    c.config.update(f.config_json);
    return c;
  }
  c.config = {{"model", j.model},
              {"loss", j.loss},
              {"dataset", j.dataset},
              {"data_dir", j.data_dir},
              {"optimizer", j.optimizer},
              {"lr", j.lr},
              {"momentum", j.momentum},
              {"lr_decay", j.lr_decay},
              {"dropout", j.dropout},
              {"synthetic_samples", j.synthetic_samples},
              {"synthetic_image_size", j.synthetic_image_size},
              {"synthetic_channels", j.synthetic_channels}};
  if (j.weight_decay) c.config["weight_decay"] = *j.weight_decay;
  if (j.sync_batchnorm) c.config["sync_batchnorm"] = true;
  c.config.update(f.config_json);
  return c;
}

// What the image classifier's job validation would say of a language model's flags.
void check_language_model(const TrainFlags& f) {
  const auto& j = f.job;
  if (f.in_process) {
    throw ConfigError("--in-process runs the image classifier; a language model's one-process run is --workers 1");
  }
  if (j.dataset.rfind("text:", 0) != 0 || j.dataset.size() == 5) {
    throw ConfigError("--model " + j.model + " trains on text: --dataset text:DIR, DIR holding train.tok (and "
                      "val.tok) from `dsgd prepare-text --out DIR`");
  }
  if (j.epochs < 1) throw ConfigError("--epochs must be >= 1, got " + std::to_string(j.epochs));
  if (j.max_steps < 0) throw ConfigError("--max-steps must be >= 0, got " + std::to_string(j.max_steps));
}

void validate_flags(TrainFlags& f) {
  if (f.trainer.launch.token.empty()) f.trainer.launch.token = token_from_environment();
  apply_cluster(f);
  if (f.in_process) check_in_process(f);
  if (!f.config.empty()) {
    f.config_json = dsgd::parse_config_text(f.config, "--config");
    if (!f.config_json.is_object()) throw ConfigError("--config must be a JSON object, e.g. '{\"lr\": 0.1}'");
  }
  if (f.job.threads == 0) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const unsigned workers = static_cast<unsigned>(std::max(1, f.trainer.num_workers));
    f.job.threads = static_cast<int>(std::max(1u, cores / workers));
  }
  if (is_language_model(f)) {
    check_language_model(f);
  } else {
    dsgd::validate(f.job);
  }
  if (!f.in_process) validate_config(operator_of_job(f), trainer_config_of(f));
  if (!f.json_out.empty()) check_writable("--json-out", f.json_out);
  if (!f.trace.empty()) check_writable("--trace", f.trace);
}

// A ConfigError of the Trainer's names a TrainerConfig field: say which flag set it.
std::string describe(const ConfigError& e, const TrainFlags& f) {
  const auto it = f.flag_of.find(e.field());
  return it == f.flag_of.end() ? e.what() : it->second + ": " + e.what();
}

// Ctrl-C or SIGTERM: the job stops at the driver's next progress tick (its workers shut down,
// the dashboard's history says it ended), `dsgd train` prints the summary of what was done
// ("interrupted": true) and exits 130; a second one ends it at once.
std::atomic<bool> g_interrupted{false};

void on_interrupt(int sig) {
  if (!g_interrupted.exchange(true)) return;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

// The job through the Trainer: worker processes, the chosen strategy, dsgd::fit's epoch loop.
dsgd::FitResult run_with_trainer(const TrainFlags& f, ProgressPrinter* progress) {
  const auto wall_start = std::chrono::steady_clock::now();
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  Trainer trainer(operator_of_job(f), trainer_config_of(f));
  if (g_interrupted) throw Interrupted();
  // A driver that took a lost one's job up (--driver-state) goes on from the job's checkpoint.
  if (!f.load.empty() && !trainer.restarted_at()) trainer.load(f.load);
  auto result = dsgd::fit(trainer,
                          {.epochs = f.job.epochs,
                           .max_steps = f.job.max_steps,
                           .evaluate = f.job.evaluate,
                           .profile = f.profile,
                           .trace_path = f.trace,
                           .stop = [] { return g_interrupted.load(); }},
                          progress);
  if (!f.save.empty() && !result.interrupted) trainer.save(f.save);
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

// The same `dsgd train` in every process (a cluster spec from the environment, not --cluster): a
// task other than the chief joins the job as that task. nullopt: this process is the chief, or no
// spec says otherwise.
std::optional<int> join_from_environment(const TrainFlags& f) {
  if (!f.cluster.empty()) return std::nullopt;
  const auto spec = ClusterSpec::load("");
  if (!spec || spec->task_type == "chief" || spec->task_type == "evaluator") return std::nullopt;
  if (spec->from_engine && shapes_the_job(f)) return std::nullopt;
  std::string token = f.trainer.launch.token.empty() ? token_from_environment() : f.trainer.launch.token;
  if (token.empty()) {
    throw ConfigError("this process is " + spec->task_name() + " of a job (" + spec->source + "): it needs the job "
                      "token the driver has: $DSGD_TOKEN or $DSGD_TOKEN_FILE in every process (or --token)");
  }
  if (!f.quiet) {
    std::cerr << "dsgd train: " << spec->task_name() << " (" << spec->source << "), driver " << spec->chief << "\n";
  }
  return join_as_task(*spec, token);
}

int run_train(TrainFlags& f) {
  try {
    if (const auto code = join_from_environment(f)) return *code;
    validate_flags(f);
  } catch (const ConfigError& e) {
    std::cerr << "dsgd train: error: " << describe(e, f) << "\n";
    return kExitUsage;
  }
  try {
    std::unique_ptr<ProgressPrinter> progress;
    if (!f.quiet) progress = std::make_unique<ProgressPrinter>(stderr, ::isatty(STDERR_FILENO) != 0);
    if (progress && is_language_model(f))
      progress->count_tokens(language_model_context(language_model_options(trainer_config_of(f).config)));
    if (!f.quiet)
      std::cerr << "dsgd train: model " << f.job.model << ", dataset " << f.job.dataset << ", " << f.job.epochs
                << " epoch(s), batch " << f.job.batch_size << ", " << f.job.threads << " thread(s), "
                << (f.in_process ? std::string("in-process")
                                 : std::to_string(f.trainer.num_workers) + " worker(s), " + f.trainer.strategy.name())
                << "\n";
    const auto result = f.in_process ? dsgd::run_local_job(f.job, progress.get()) : run_with_trainer(f, progress.get());
    if (f.profile && !f.quiet && result.history.size() > 1) {
      std::cerr << "dsgd train: " << describe_profile(result.profile_ms) << "\n";
    }
    const auto json = to_json(f, result);
    std::cout << json.dump(2) << std::endl;
    if (!f.json_out.empty()) {
      std::ofstream out(f.json_out);
      out << json.dump(2) << "\n";
      if (!out) {
        std::cerr << "dsgd train: error: could not write " << f.json_out << "\n";
        return kExitFailure;
      }
    }
    if (result.interrupted) {
      std::cerr << "dsgd train: interrupted after " << result.steps << " step(s): the workers are stopped"
                << (f.save.empty() ? "" : ", nothing saved to " + f.save) << "\n";
      return 128 + SIGINT;
    }
    return 0;
  } catch (const ConfigError& e) {
    std::cerr << "dsgd train: error: " << describe(e, f) << "\n";
    return kExitUsage;
  } catch (const Interrupted&) {
    std::cerr << "dsgd train: interrupted: the workers are stopped\n";
    return 128 + SIGINT;
  } catch (const std::exception& e) {
    std::cerr << "dsgd train: error: " << e.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace

void add_train_command(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model and print a JSON summary of the run");
  cmd->get_formatter()->column_width(36);  // the longest flag with its type and default, and a gap
  cmd->footer(
      "\nExamples:\n"
      "  dsgd train                                   # the CNN on Fashion-MNIST, 1 epoch\n"
      "  dsgd train --epochs 5 --threads 2 --json-out run.json\n"
      "  dsgd train --model mlp --dataset synthetic --max-steps 200\n"
      "  dsgd train --workers 2 --strategy simple --save ckpt\n"
      "\nProgress goes to stderr (a live bar on a terminal, a line every 10 s otherwise); the\n"
      "JSON summary goes to stdout. Exit status: 0 done, 1 the job failed, 2 bad flags.");
  add_train_flags(cmd, *flags);
  cmd->callback([flags, exit_code] { *exit_code = run_train(*flags); });
}

}  // namespace dsgd::cli
