#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "dsgd/cluster.h"
#include "dsgd/error.h"
#include "dsgd/fit.h"
#include "dsgd/image_classifier.h"
#include "dsgd/language_model.h"
#include "dsgd/local_job.h"
#include "dsgd/trainer.h"
#include "progress.h"
#include "train_summary.h"

namespace dsgd::cli {
namespace {

// The flags. Those of the Trainer are bound straight to a TrainerConfig's fields (--help shows
// its defaults); the Trainer's validation checks them (dsgd::validate_config) and its errors name
// the field, which `flag_of` turns back into the flag that set it.
struct TrainFlags {
  dsgd::LocalJobOptions job;                   // the model, data and optimizer; also --in-process's job
  TrainerConfig trainer;                       // the rest of the Trainer's settings
  std::map<std::string, std::string> flag_of;  // TrainerConfig field -> the flag bound to it
  std::string hosts_file;                      // launcher ssh: one "host[:slots]" a line
  std::string cluster;                         // a cluster spec file (dsgd/cluster.h); "" = $DSGD_CLUSTER, if set
  std::string save;
  std::string load;
  std::string config;  // JSON merged into the operator's config
  nlohmann::json config_json = nlohmann::json::object();
  bool in_process = false;
  std::string json_out;
  bool quiet = false;
  bool profile = false;
  std::string trace;  // Chrome trace of the training, per epoch (trace_path_of)
  CLI::Option* lr_option = nullptr;  // --lr: given, or the image classifier's default
};

// --model gpt-*: the language model (dsgd/language_model.h) on --dataset text:DIR.
bool is_language_model(const TrainFlags& f) { return f.job.model.rfind("gpt-", 0) == 0; }
const char* operator_of_job(const TrainFlags& f) { return is_language_model(f) ? kLanguageModel : kImageClassifier; }

TrainerConfig trainer_config_of(const TrainFlags& f);

// A language model's figures: tokens/s and validation perplexity (exp of the mean loss per token).
void add_language_model_figures(const TrainFlags& f, nlohmann::json* j) {
  const LanguageModelOptions o = language_model_options(trainer_config_of(f).config);
  const auto tokens = static_cast<double>(language_model_context(o));
  (*j)["lr"] = o.lr;
  (*j)["tokens_per_s"] = (*j)["samples_per_s"].get<double>() * tokens;
  (*j)["tokens"] = (*j)["samples"].get<double>() * tokens;
  // The usual estimate of a transformer's training work: 6 FLOPs per parameter per token.
  (*j)["model_flops_per_s"] = 6.0 * (*j)["parameters"].get<double>() * (*j)["tokens_per_s"].get<double>();
  const double val_loss = (*j)["test_loss"].get<double>();
  if (val_loss >= 0) (*j)["perplexity"] = std::exp(val_loss);
  j->erase("test_accuracy");
  for (const char* k : {"momentum", "lr_decay"}) j->erase(k);
}

nlohmann::json to_json(const TrainFlags& f, const dsgd::FitResult& r) {
  nlohmann::json recoveries = nlohmann::json::array();
  for (const auto& e : r.recoveries) recoveries.push_back(recovery_json(e));
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
  nlohmann::json j = {{"test_accuracy", r.test_accuracy},
                      {"test_loss", r.test_loss},
                      {"train_loss", r.train_loss},
                      {"epochs", r.epochs},
                      {"steps", r.steps},
                      {"samples", r.samples},
                      {"workers", f.in_process ? 0 : f.trainer.num_workers},
                      {"devices_per_worker", f.trainer.devices_per_worker},
                      {"strategy", f.in_process ? "in-process" : f.trainer.strategy.name()},
                      {"samples_per_s", r.samples_per_s},
                      {"train_s", r.train_s},
                      {"wall_s", r.wall_s},
                      {"model", f.job.model},
                      {"parameters", r.parameters},
                      {"dataset", f.job.dataset},
                      {"batch_size", f.job.batch_size},
                      {"lr", f.job.lr},
                      {"momentum", f.job.momentum},
                      {"lr_decay", f.job.lr_decay},
                      {"seed", f.job.seed},
                      {"threads", f.job.threads},
                      {"history", history},
                      {"recoveries", recoveries}};
  if (f.profile) j["profile_ms"] = r.profile_ms;
  if (r.comm_bytes_per_step >= 0) j["comm_bytes_per_step"] = r.comm_bytes_per_step;
  if (r.worker_peak_rss_mib > 0) j["worker_peak_rss_mib"] = r.worker_peak_rss_mib;
  if (is_language_model(f)) add_language_model_figures(f, &j);
  if (!f.in_process) {
    j["compression"] = f.trainer.comm.compression == Compression::kPowerSgd
                           ? "powersgd:" + std::to_string(f.trainer.comm.powersgd_rank)
                           : f.trainer.comm.compression.name();
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

// A cluster spec whose task is the chief: the driver binds its address and waits for its
// workers (and ps shard processes), which a cluster manager starts.
void apply_cluster(TrainFlags& f) {
  const auto spec = ClusterSpec::load(f.cluster);
  if (!spec) return;
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
              {"dataset", j.dataset},
              {"data_dir", j.data_dir},
              {"lr", j.lr},
              {"momentum", j.momentum},
              {"lr_decay", j.lr_decay},
              {"dropout", j.dropout},
              {"synthetic_samples", j.synthetic_samples},
              {"synthetic_image_size", j.synthetic_image_size},
              {"synthetic_channels", j.synthetic_channels}};
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
  if (f.trainer.launch.token.empty()) {
    if (const char* t = std::getenv("DSGD_TOKEN")) f.trainer.launch.token = t;
  }
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

// The job through the Trainer: worker processes, the chosen strategy, dsgd::fit's epoch loop.
dsgd::FitResult run_with_trainer(const TrainFlags& f, ProgressPrinter* progress) {
  const auto wall_start = std::chrono::steady_clock::now();
  Trainer trainer(operator_of_job(f), trainer_config_of(f));
  if (!f.load.empty()) trainer.load(f.load);
  auto result = dsgd::fit(trainer,
                          {.epochs = f.job.epochs,
                           .max_steps = f.job.max_steps,
                           .evaluate = f.job.evaluate,
                           .profile = f.profile,
                           .trace_path = f.trace},
                          progress);
  if (!f.save.empty()) trainer.save(f.save);
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

int run_train(TrainFlags& f) {
  try {
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
    return 0;
  } catch (const ConfigError& e) {
    std::cerr << "dsgd train: error: " << describe(e, f) << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "dsgd train: error: " << e.what() << "\n";
    return kExitFailure;
  }
}

// Binds `flag` to the TrainerConfig field `field` (named for the Trainer's errors).
template <typename T>
CLI::Option* bind_option(CLI::App* cmd, TrainFlags& f, const std::string& flag, const char* field, T& value,
                         const std::string& help) {
  f.flag_of[field] = flag;
  return cmd->add_option(flag, value, help);
}

CLI::Option* bind_flag(CLI::App* cmd, TrainFlags& f, const std::string& flag, const char* field, bool& value,
                       const std::string& help) {
  f.flag_of[field] = flag[0] == '!' ? flag.substr(1) : flag;
  return cmd->add_flag(flag, value, help);
}

// A flag whose text `set` turns into the field's value.
CLI::Option* bind_with(CLI::App* cmd, TrainFlags& f, const std::string& flag, const char* field,
                       std::function<void(const std::string&)> set, const std::string& help) {
  f.flag_of[field] = flag;
  return cmd->add_option_function<std::string>(flag, std::move(set), help);
}

// A fixed-set field: the spelling as given (an unknown one is kept for the Trainer's validation
// to name, with the spellings it takes).
template <typename E>
CLI::Option* bind_choice(CLI::App* cmd, TrainFlags& f, const std::string& flag, Choice<E>& value,
                         const std::string& help) {
  return bind_with(
             cmd, f, flag, ChoiceTraits<E>::field.data(), [&value](const std::string& v) { value = v; }, help)
      ->type_name("TEXT")
      ->default_str(value.name());
}

// --compression: a Compression, or "powersgd:R" (powersgd at rank R, powersgd_rank).
void set_compression(TrainerConfig& t, const std::string& v) {
  const auto colon = v.find(':');
  if (colon == std::string::npos) {
    t.comm.compression = v;
    return;
  }
  const std::string name = v.substr(0, colon), rank = v.substr(colon + 1);
  size_t used = 0;
  int r = 0;
  try {
    r = std::stoi(rank, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (name != "powersgd" || rank.empty() || used != rank.size()) {
    throw CLI::ValidationError("--compression",
                               "'" + v + "': only powersgd takes a rank, a whole number (e.g. powersgd:4)");
  }
  t.comm.compression = Compression::kPowerSgd;
  t.comm.powersgd_rank = r;
}

// The model, data and optimizer (the image classifier's config, and --in-process's job).
void add_job_flags(CLI::App* cmd, TrainFlags& f) {
  auto& j = f.job;
  cmd->add_option("--model", j.model,
                  "Model: cnn, mlp, resnet18, resnet50, simulated (sleeps instead of computing: see --config); "
                  "gpt-tiny, gpt-small, gpt-base (language models, on --dataset text:DIR)")
      ->capture_default_str();
  cmd->add_option("--dataset", j.dataset,
                  "Data: fashion-mnist, synthetic (random images, for benchmarks) or text:DIR (token files from "
                  "`dsgd prepare-text --out DIR`)")
      ->capture_default_str();
  cmd->add_option("--data-dir", j.data_dir, "Directory with Fashion-MNIST's IDX files (.gz or plain)")
      ->capture_default_str();
  cmd->add_option("--epochs", j.epochs, "Passes over the training set")->capture_default_str();
  cmd->add_option("--batch-size", j.batch_size, "Global batch size (samples per step)")->capture_default_str();
  f.flag_of["batch_size"] = "--batch-size";
  f.lr_option = cmd->add_option("--lr", j.lr, "Learning rate (SGD's; a language model's AdamW: default 6e-4)")
                    ->capture_default_str();
  cmd->add_option("--momentum", j.momentum, "SGD momentum, in [0, 1)")->capture_default_str();
  cmd->add_option("--lr-decay", j.lr_decay, "Multiply the learning rate by this after every epoch, in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--seed", j.seed, "Seed for initial weights and shuffling")->capture_default_str();
  j.threads = 0;
  cmd->add_option("--threads", j.threads, "LibTorch threads per worker; 0 = cores / workers")->capture_default_str();
  f.flag_of["threads_per_worker"] = "--threads";
  cmd->add_option("--max-steps", j.max_steps, "Stop after this many steps in all; 0 = run every epoch")
      ->capture_default_str();
  cmd->add_option("--synthetic-samples", j.synthetic_samples, "Training samples of --dataset synthetic")
      ->capture_default_str();
  cmd->add_option("--image-size", j.synthetic_image_size, "Image side in pixels of --dataset synthetic")
      ->capture_default_str();
  cmd->add_option("--channels", j.synthetic_channels, "Image channels of --dataset synthetic (3: ImageNet-shaped)")
      ->capture_default_str();
  cmd->add_flag("!--no-eval", j.evaluate, "Skip evaluating on the test split after each epoch");
  cmd->add_flag("!--no-dropout", j.dropout, "Turn dropout layers off");
}

// Workers, replicas and how they synchronise.
void add_strategy_flags(CLI::App* cmd, TrainFlags& f) {
  bind_option(cmd, f, "--workers", "num_workers", f.trainer.num_workers, "Worker processes")->capture_default_str();
  bind_option(cmd, f, "--devices-per-worker", "devices_per_worker", f.trainer.devices_per_worker,
              "Model replicas per worker process")
      ->capture_default_str();
  bind_choice(cmd, f, "--strategy", f.trainer.strategy, "Gradient synchronisation: simple, allreduce, ps or ps_async");
  bind_option(cmd, f, "--ps-shards", "ps.shards", f.trainer.ps.shards,
              "ps: parameter-server shards (0 = one per host)")
      ->capture_default_str();
  bind_flag(cmd, f, "--ps-update-on-shards", "ps.update_on_shards", f.trainer.ps.update_on_shards,
            "ps: the shards apply SGD and hold its momentum (optimizer state sharded); needs SGD");
  bind_choice(cmd, f, "--ps-placement", f.trainer.ps.placement,
              "ps: the shards live in the workers, or in processes of their own (--ps-shards of them; "
              "remote mode: start each with dsgd ps-server --shard S)");
  bind_option(cmd, f, "--max-staleness", "ps.max_staleness", f.trainer.ps.max_staleness,
              "ps_async: a worker this many updates ahead of the slowest waits (-1 = never)")
      ->capture_default_str();
  bind_option(cmd, f, "--local-hosts", "launch.local_hosts", f.trainer.launch.local_hosts,
              "Spread local workers over this many pseudo-hosts (shared memory only within each)")
      ->capture_default_str();
  bind_choice(cmd, f, "--allreduce-algo", f.trainer.comm.allreduce_algo, "auto (shared memory + Gloo), ring or hd");
  bind_option(cmd, f, "--grad-shard-bytes", "comm.grad_shard_bytes", f.trainer.comm.grad_shard_bytes,
              "Gradient bucket size in bytes")
      ->capture_default_str();
  bind_flag(cmd, f, "!--no-overlap", "comm.overlap", f.trainer.comm.overlap,
            "Communicate gradients after backward instead of during it");
  bind_with(
      cmd, f, "--forward-overlap-buckets", "comm.forward_overlap_buckets",
      [&t = f.trainer](const std::string& v) { t.comm.forward_overlap_buckets = v == "auto" ? -1 : std::stoi(v); },
      "Also overlap the next forward: this many buckets (spread over the layers) go after "
      "backward, first layer first, and each is applied as forward reaches it (0 = off; auto: tried on the "
      "first steps)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()) | CLI::IsMember({"auto"}))
      ->default_str(std::to_string(f.trainer.comm.forward_overlap_buckets));
}

// Checkpoints, snapshots and what happens when a worker is lost.
void add_recovery_flags(CLI::App* cmd, TrainFlags& f) {
  cmd->add_option("--save", f.save, "Write a checkpoint directory at the end");
  cmd->add_option("--load", f.load,
                  "Start from this checkpoint directory, or from the newest intact one in a --checkpoint-dir");
  bind_option(cmd, f, "--checkpoint-dir", "checkpoints.dir", f.trainer.checkpoints.dir,
              "Also write every --checkpoint-every snapshot here (step-N), keeping --keep-checkpoints");
  bind_option(cmd, f, "--checkpoint-every", "checkpoints.every_steps", f.trainer.checkpoints.every_steps,
              "Steps between snapshots, at least; a lost worker costs at most one interval (0 = once per epoch)")
      ->capture_default_str();
  bind_option(cmd, f, "--checkpoint-overhead", "checkpoints.max_overhead", f.trainer.checkpoints.max_overhead,
              "Longer intervals where snapshots would take more than this share of training time "
              "(0 = exactly every --checkpoint-every steps)")
      ->capture_default_str();
  bind_option(cmd, f, "--keep-checkpoints", "checkpoints.keep", f.trainer.checkpoints.keep,
              "Checkpoints kept in --checkpoint-dir")
      ->capture_default_str();
  bind_option(cmd, f, "--standby", "recovery.standby_workers", f.trainer.recovery.standby_workers,
              "Standby workers: set up outside the group, each takes a lost worker's place in well under a second")
      ->capture_default_str();
  bind_flag(cmd, f, "--wait-for-replacements", "recovery.wait_for_replacements",
            f.trainer.recovery.wait_for_replacements,
            "After a loss without a standby, wait for new workers instead of going on with the survivors");
  bind_option(cmd, f, "--max-failures", "recovery.max_failures", f.trainer.recovery.max_failures,
              "Lost workers survived before the job fails")
      ->capture_default_str();
  bind_with(
      cmd, f, "--heartbeat-timeout-ms", "recovery.heartbeat_timeout",
      [&t = f.trainer](const std::string& v) {
        t.recovery.heartbeat_timeout = std::chrono::milliseconds(std::stoll(v));
      },
      "A worker silent this long (hung, or its network cut) is evicted")
      ->check(CLI::Number)
      ->default_str(std::to_string(f.trainer.recovery.heartbeat_timeout.count()));
}

// Where and in what arithmetic replicas compute, and what crosses hosts.
void add_precision_flags(CLI::App* cmd, TrainFlags& f) {
  bind_choice(cmd, f, "--device", f.trainer.device,
              "Where replicas compute: auto (CUDA when the workers' LibTorch sees a GPU), cpu or cuda");
  bind_choice(cmd, f, "--precision", f.trainer.step.precision,
              "fp32; bf16: forward and loss under bfloat16 autocast (float32 weights and optimizer); fp16: "
              "the same in float16 with dynamic loss scaling (CUDA only)");
  bind_option(cmd, f, "--loss-scale", "step.loss_scale", f.trainer.step.loss_scale,
              "Dynamic loss scaling from this scale (a power of two); 0: 65536 under fp16, else off; -1: off")
      ->capture_default_str();
  bind_option(cmd, f, "--loss-scale-growth-interval", "step.loss_scale_growth_interval",
              f.trainer.step.loss_scale_growth_interval, "Finite steps in a row before the loss scale doubles")
      ->capture_default_str();
  bind_with(
      cmd, f, "--compression", "comm.compression", [&t = f.trainer](const std::string& v) { set_compression(t, v); },
      "What crosses hosts (allreduce): none; fp16 / bf16: 16 bits a value on the wire, summed in "
      "float32; powersgd:R: PowerSGD's rank-R factors of each matrix (R default 4); the lossy ones with "
      "error feedback")
      ->default_str(f.trainer.comm.compression.name());
  f.flag_of["comm.powersgd_rank"] = "--compression";
  bind_option(cmd, f, "--powersgd-start-steps", "comm.powersgd_start_steps", f.trainer.comm.powersgd_start_steps,
              "--compression powersgd: plain float32 steps first")
      ->capture_default_str();
  bind_choice(cmd, f, "--nonfinite", f.trainer.step.nonfinite_policy,
              "A NaN/infinite gradient: skip (the step, everywhere, and warn) or error (stop)");
  bind_option(cmd, f, "--max-grad-norm", "step.max_grad_norm", f.trainer.step.max_grad_norm,
              "Clip the averaged gradients to this global L2 norm before each step (0: off)")
      ->capture_default_str();
  bind_option(cmd, f, "--accumulate-steps", "step.accumulate_steps", f.trainer.step.accumulate_steps,
              "Micro-batches per step: gradients summed locally, averaged once per step (1: off)")
      ->capture_default_str();
}

// Who starts the workers, and how they find the driver.
void add_launch_flags(CLI::App* cmd, TrainFlags& f) {
  bind_option(cmd, f, "--listen", "launch.listen", f.trainer.launch.listen,
              "HOST:PORT: wait for --workers workers started elsewhere (`dsgd worker`) instead of spawning");
  bind_option(cmd, f, "--token", "launch.token", f.trainer.launch.token,
              "Job token for --listen (default: $DSGD_TOKEN, else random, printed)");
  cmd->add_option("--cluster", f.cluster,
                  "A cluster spec (TF_CONFIG's shape; default: $DSGD_CLUSTER) whose task is the chief: listen on its "
                  "address for its workers and ps shards");
  bind_choice(
      cmd, f, "--launcher", f.trainer.launch.launcher,
      "Who starts the workers: local (this host), ssh (--hosts, over the system's ssh client; needs "
      "--listen HOST:PORT the hosts reach), mpirun (all at once; --hosts optional; a lost worker is not "
      "replaced), slurm (a job step per worker inside sbatch/salloc; needs --listen HOST:PORT the nodes reach), "
      "none (you do: `dsgd worker --driver`); auto: local, or none with --listen");
  f.flag_of["launch.hosts"] = "--hosts";
  cmd->add_option("--hosts", f.hosts_file,
                  "--launcher ssh or mpirun: a file of hosts, one \"host\" or \"host:slots\" a line (# comments)");
  bind_option(cmd, f, "--ssh-command", "launch.ssh_command", f.trainer.launch.ssh_command,
              "--launcher ssh: the ssh client and its options (e.g. \"ssh -p 2222 -i KEY\")")
      ->capture_default_str();
  bind_option(cmd, f, "--mpirun-command", "launch.mpirun_command", f.trainer.launch.mpirun_command,
              "--launcher mpirun: mpirun and its options (e.g. \"mpirun --allow-run-as-root\")")
      ->capture_default_str();
  bind_option(cmd, f, "--srun-command", "launch.srun_command", f.trainer.launch.srun_command,
              "--launcher slurm: srun and its options for every worker's step (e.g. \"srun --cpus-per-task=4\")")
      ->capture_default_str();
}

// The operator's config and this run's outputs.
void add_run_flags(CLI::App* cmd, TrainFlags& f) {
  cmd->add_option("--config", f.config,
                  "JSON object merged into the operator's config (keys: model, dataset, data_dir, lr, momentum, "
                  "lr_decay, dropout, channels_last, cudnn_benchmark, synthetic_samples, synthetic_image_size, "
                  "synthetic_channels; for --model simulated: sim_parameters, "
                  "sim_layers, sim_step_ms; for --model gpt-*: context, dropout, lr, min_lr, weight_decay, beta1, "
                  "beta2, warmup_steps, decay_steps)");
  cmd->add_flag("--in-process", f.in_process, "Train in this process without workers (the single-process baseline)");
  cmd->add_option("--json-out", f.json_out, "Also write the JSON summary to this file");
  cmd->add_flag("-q,--quiet", f.quiet, "No progress output");
  cmd->add_option("--trace", f.trace,
                  "Write a timeline of the training to this file, a Chrome trace (open it in ui.perfetto.dev "
                  "or chrome://tracing): each worker's forward, backward, optimizer and waits for buckets, "
                  "and every allreduce on its communication thread. With several epochs, one file each: "
                  "trace.json becomes trace-epoch1.json, ...")
      ->type_name("FILE");
  cmd->add_flag("--profile", f.profile,
                "Time each step's phases (forward, backward, optimizer, waiting for communication, and the "
                "driver's snapshots; ms per step, mean over workers): on stderr after each epoch and at the "
                "end, and in the JSON summary");
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
  add_job_flags(cmd, *flags);
  add_strategy_flags(cmd, *flags);
  add_recovery_flags(cmd, *flags);
  add_precision_flags(cmd, *flags);
  add_launch_flags(cmd, *flags);
  add_run_flags(cmd, *flags);
  cmd->callback([flags, exit_code] { *exit_code = run_train(*flags); });
}

}  // namespace dsgd::cli
