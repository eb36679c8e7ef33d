#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <thread>

#include "commands.h"
#include "dsgd/cluster.h"
#include "dsgd/error.h"
#include "dsgd/trainer.h"
#include "progress.h"
#include "train_summary.h"
#include "dsgd/image_classifier.h"
#include "dsgd/local_job.h"

namespace dsgd::cli {
namespace {

// The flags. Those of the Trainer are bound to a default TrainerConfig, so --help shows its
// defaults; the fixed-set ones go through strings spelled as TrainerConfig's Choice fields.
struct TrainFlags {
  dsgd::LocalJobOptions job;           // the model, data and optimizer; also --in-process's job
  TrainerConfig trainer;                  // the rest of the Trainer's settings
  std::string strategy = trainer.strategy.name();
  std::string allreduce_algo = trainer.allreduce_algo.name();
  std::string ps_placement = trainer.ps_placement.name();
  std::string nonfinite = trainer.nonfinite_policy.name();
  std::string device = trainer.device.name();
  std::string precision = trainer.precision.name();
  std::string compression = trainer.compression.name();
  std::string launcher = trainer.launcher.name();
  std::string hosts_file;  // launcher ssh: one "host[:slots]" a line
  std::string cluster;     // a cluster spec file (dsgd/cluster.h); "" = $DSGD_CLUSTER, if set
  std::string forward_overlap_buckets = std::to_string(trainer.forward_overlap_buckets);  // a count, or "auto" (-1)
  int64_t heartbeat_timeout_ms = trainer.heartbeat_timeout.count();
  std::string save;
  std::string load;
  std::string config;   // JSON merged into the operator's config
  nlohmann::json config_json = nlohmann::json::object();
  bool in_process = false;
  std::string json_out;
  bool quiet = false;
  bool profile = false;
  std::string trace;    // Chrome trace of the training, per epoch (trace_path_of)
};

// --trace's file for one epoch: the path itself for a single epoch, else "-epoch<N>" before its
// extension (or at its end).
std::string trace_path_of(const std::string& path, int64_t epoch, int64_t epochs) {
  if (path.empty() || epochs <= 1) return path;
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  const std::string suffix = "-epoch" + std::to_string(epoch);
  return has_ext ? path.substr(0, dot) + suffix + path.substr(dot) : path + suffix;
}

nlohmann::json to_json(const TrainFlags& f, const dsgd::LocalJobResult& r, const nlohmann::json& recoveries) {
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
                      {"strategy", f.in_process ? "in-process" : f.strategy},
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
  if (!f.in_process) {
    j["compression"] =
        f.compression == "powersgd" ? "powersgd:" + std::to_string(f.trainer.powersgd_rank) : f.compression;
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
                      (spec->task_type == "ps" ? "ps-server" : spec->task_type == "worker" ? "worker" : "evaluate") +
                      " --cluster` for it; `dsgd train` is the chief");
  }
  const int workers = static_cast<int>(spec->workers.size());
  if (f.trainer.num_workers != TrainerConfig{}.num_workers && f.trainer.num_workers != workers) {
    throw ConfigError("--workers " + std::to_string(f.trainer.num_workers) + " but the cluster spec names " +
                      std::to_string(workers) + " worker(s); leave --workers out");
  }
  if (f.in_process || (f.launcher != "auto" && f.launcher != "none") || !f.trainer.listen.empty()) {
    throw ConfigError("with a cluster spec the driver listens on its chief entry and a cluster manager starts the "
                      "workers: it takes none of --in-process, --launcher, --listen");
  }
  if (!spec->ps.empty() && f.strategy != "ps") {
    throw ConfigError("the cluster spec names ps tasks: train with --strategy ps (their shards), or leave them out");
  }
  if (!spec->evaluators.empty() && f.trainer.checkpoint_dir.empty()) {
    throw ConfigError("the cluster spec names an evaluator, which evaluates the job's checkpoints: give "
                      "--checkpoint-dir (a directory the evaluator's host sees too)");
  }
  f.trainer.num_workers = workers;
  f.trainer.listen = spec->chief;
  f.launcher = "none";
  if (!spec->ps.empty()) {
    f.ps_placement = "processes";
    f.trainer.num_ps_shards = static_cast<int>(spec->ps.size());
  }
}

void validate_flags(TrainFlags& f) {
  if (f.trainer.token.empty()) {
    if (const char* t = std::getenv("DSGD_TOKEN")) f.trainer.token = t;
  }
  apply_cluster(f);
  if (f.trainer.num_workers < 1) throw ConfigError("--workers must be >= 1, got " + std::to_string(f.trainer.num_workers));
  if (!Choice<Strategy>(f.strategy).known()) {
    throw ConfigError("unknown --strategy '" + f.strategy + "'; known strategies: " + choice_names<Strategy>(", "));
  }
  if (!Choice<AllreduceAlgo>(f.allreduce_algo).known()) {
    throw ConfigError("unknown --allreduce-algo '" + f.allreduce_algo + "'; use " + choice_names<AllreduceAlgo>());
  }
  if (f.trainer.num_ps_shards < 0 || f.trainer.num_ps_shards > 64) {
    throw ConfigError("--ps-shards must be in 0..64 (0 = one per host), got " + std::to_string(f.trainer.num_ps_shards));
  }
  if (f.trainer.local_hosts < 1) throw ConfigError("--local-hosts must be >= 1, got " + std::to_string(f.trainer.local_hosts));
  if (f.in_process && (f.trainer.num_workers != 1 || f.trainer.devices_per_worker != 1 || !f.save.empty() || !f.load.empty() ||
                      !f.trainer.listen.empty() || !f.trainer.checkpoint_dir.empty() || f.profile || !f.trace.empty())) {
    throw ConfigError("--in-process trains in this one process: it takes none of --workers, "
                      "--devices-per-worker, --save, --load, --listen, --checkpoint-dir, --profile, --trace");
  }
  if (f.trainer.checkpoint_every_steps < 0) {
    throw ConfigError("--checkpoint-every must be >= 0 (0 = once per epoch), got " + std::to_string(f.trainer.checkpoint_every_steps));
  }
  if (!(f.trainer.checkpoint_max_overhead >= 0 && f.trainer.checkpoint_max_overhead < 1)) {
    throw ConfigError("--checkpoint-overhead must be in [0, 1) (0 = exactly every --checkpoint-every steps), got " +
                      std::to_string(f.trainer.checkpoint_max_overhead));
  }
  if (f.trainer.checkpoint_keep < 1) throw ConfigError("--keep-checkpoints must be >= 1, got " + std::to_string(f.trainer.checkpoint_keep));
  if (f.heartbeat_timeout_ms < 100) {
    throw ConfigError("--heartbeat-timeout-ms must be >= 100, got " + std::to_string(f.heartbeat_timeout_ms));
  }
  if (f.trainer.max_failures < 0) throw ConfigError("--max-failures must be >= 0, got " + std::to_string(f.trainer.max_failures));
  if (f.trainer.standby_workers < 0 || f.trainer.standby_workers > 64) {
    throw ConfigError("--standby must be in 0..64, got " + std::to_string(f.trainer.standby_workers));
  }
  if (f.in_process && f.trainer.standby_workers > 0) throw ConfigError("--standby applies to worker jobs, not --in-process");
  if (!Choice<NonfinitePolicy>(f.nonfinite).known()) {
    throw ConfigError("unknown --nonfinite '" + f.nonfinite + "'; use " + choice_names<NonfinitePolicy>());
  }
  if (!Choice<Device>(f.device).known()) {
    throw ConfigError("unknown --device '" + f.device + "'; use " + choice_names<Device>());
  }
  if (!Choice<Precision>(f.precision).known()) {
    throw ConfigError("unknown --precision '" + f.precision + "'; use " + choice_names<Precision>());
  }
  // "powersgd:R" is powersgd at rank R.
  if (const auto colon = f.compression.find(':'); colon != std::string::npos) {
    const std::string name = f.compression.substr(0, colon), rank = f.compression.substr(colon + 1);
    size_t used = 0;
    int r = 0;
    try {
      r = std::stoi(rank, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (name != "powersgd" || rank.empty() || used != rank.size() || r < 1 || r > 1024) {
      throw ConfigError("--compression '" + f.compression + "': only powersgd takes a rank, a whole number in 1..1024 "
                        "(e.g. powersgd:4)");
    }
    f.compression = name;
    f.trainer.powersgd_rank = r;
  }
  if (!Choice<Compression>(f.compression).known()) {
    throw ConfigError("unknown --compression '" + f.compression + "'; use " + choice_names<Compression>() +
                      " (powersgd:R for rank R)");
  }
  if (!Choice<Launcher>(f.launcher).known()) {
    throw ConfigError("unknown --launcher '" + f.launcher + "'; use " + choice_names<Launcher>());
  }
  if (f.in_process && (f.launcher != "auto" || !f.hosts_file.empty())) {
    throw ConfigError("--in-process trains in this one process: it takes neither --launcher nor --hosts");
  }
  if (f.trainer.devices_per_worker < 1) {
    throw ConfigError("--devices-per-worker must be >= 1, got " + std::to_string(f.trainer.devices_per_worker));
  }
  if (f.trainer.grad_shard_bytes <= 0) {
    throw ConfigError("--grad-shard-bytes must be > 0, got " + std::to_string(f.trainer.grad_shard_bytes));
  }
  if (!f.config.empty()) {
    f.config_json = dsgd::parse_config_text(f.config, "--config");
    if (!f.config_json.is_object()) throw ConfigError("--config must be a JSON object, e.g. '{\"lr\": 0.1}'");
    if (f.in_process) throw ConfigError("--config applies to worker jobs, not --in-process");
  }
  if (f.in_process && (f.device == "cuda" || f.precision != "fp32" || f.compression != "none" ||
                       f.trainer.loss_scale > 0)) {
    throw ConfigError("--device cuda, --precision, --compression and --loss-scale apply to worker jobs; --in-process "
                      "trains float32 on the CPU");
  }
  if (f.job.threads == 0) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    f.job.threads = static_cast<int>(std::max(1u, cores / static_cast<unsigned>(f.trainer.num_workers)));
  }
  dsgd::validate(f.job);
  if (!f.json_out.empty()) check_writable("--json-out", f.json_out);
  if (!f.trace.empty()) check_writable("--trace", f.trace);
}

// The same job through the Trainer: worker processes, the chosen strategy.
// `recoveries` receives recovery_json of every recovery and scale-up.
dsgd::LocalJobResult run_with_trainer(const TrainFlags& f, ProgressPrinter* progress, nlohmann::json* recoveries) {
  const auto wall_start = std::chrono::steady_clock::now();
  const auto& j = f.job;
  TrainerConfig c = f.trainer;  // validated flags: the strings name known values
  c.strategy = f.strategy;
  c.allreduce_algo = f.allreduce_algo;
  c.ps_placement = f.ps_placement;
  c.nonfinite_policy = f.nonfinite;
  c.device = f.device;
  c.precision = f.precision;
  c.compression = f.compression;
  c.launcher = f.launcher;
  if (!f.hosts_file.empty()) c.hosts = read_hosts_file(f.hosts_file);
  c.forward_overlap_buckets = f.forward_overlap_buckets == "auto" ? -1 : std::stoi(f.forward_overlap_buckets);
  c.heartbeat_timeout = std::chrono::milliseconds(f.heartbeat_timeout_ms);
  c.batch_size = j.batch_size;
  c.seed = j.seed;
  c.threads_per_worker = j.threads;
  c.config = {{"model", j.model}, {"dataset", j.dataset}, {"data_dir", j.data_dir}, {"lr", j.lr},
              {"momentum", j.momentum}, {"lr_decay", j.lr_decay}, {"dropout", j.dropout},
              {"synthetic_samples", j.synthetic_samples}, {"synthetic_image_size", j.synthetic_image_size},
              {"synthetic_channels", j.synthetic_channels}};
  c.config.update(f.config_json);
  dsgd::LocalJobResult result;
  std::vector<int64_t> epoch_steps;  // each epoch's steps, to weigh its profile
  int64_t epoch = 1, batches_per_epoch = 0, steps_before = 0;
  double train_before = 0;
  auto train_start = std::chrono::steady_clock::now();
  c.on_progress = [&](const TrainProgress& p) {
    if (progress == nullptr || batches_per_epoch == 0) return;
    const int64_t total = j.max_steps > 0 ? std::min(j.max_steps, batches_per_epoch * j.epochs)
                                          : batches_per_epoch * j.epochs;
    const double elapsed = train_before + p.elapsed_s;
    progress->on_batch({.epoch = epoch, .epochs = j.epochs, .batch = p.batches, .batches_per_epoch = batches_per_epoch,
                        .step = steps_before + p.batches, .total_steps = total, .loss = p.loss,
                        .samples_per_s = elapsed > 0 ? static_cast<double>((steps_before + p.batches) * j.batch_size) / elapsed : 0,
                        .elapsed_s = elapsed});
  };
  c.on_recovery = [&](const RecoveryEvent& e) {
    if (progress == nullptr) return;
    if (e.kind == "scale_up") {
      progress->on_note(fmt::format("dsgd train: back to {} worker(s) in {:.2f} s", e.workers_after, e.recovery_s));
    } else if (e.resumed_at == std::chrono::steady_clock::time_point{}) {
      progress->on_note("dsgd train: recovering: " + e.failure);
    } else {
      progress->on_note(fmt::format("dsgd train: resumed {:.2f} s after the failure, with {} worker(s){}; {} step(s) to redo",
                                    e.recovery_s, e.workers_after, e.standbys_used > 0 ? " (a standby took over)" : "",
                                    e.rolled_back_steps));
    }
  };
  Trainer trainer(dsgd::kImageClassifier, c);
  if (!f.load.empty()) trainer.load(f.load);
  (void)train_start;
  double comm_bytes = 0;  // sent to other hosts, summed over the calls that counted them
  int64_t comm_steps = 0;
  while (epoch <= j.epochs) {
    const int64_t left = j.max_steps > 0 ? j.max_steps - result.steps : 0;
    if (j.max_steps > 0 && left <= 0) break;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = trainer.train({.num_steps = left, .profile = f.profile, .trace_path = trace_path_of(f.trace, epoch, j.epochs)});
    const double epoch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    batches_per_epoch = r.batches_per_epoch;
    const int64_t batches = static_cast<int64_t>(r.metrics.at("batches"));
    const int64_t samples = static_cast<int64_t>(r.metrics.at("num_samples"));
    result.steps += batches;
    result.samples += samples;
    if (const auto it = r.metrics.find("comm_bytes_per_step"); it != r.metrics.end()) {
      comm_bytes += it->second * static_cast<double>(batches);
      comm_steps += batches;
    }
    result.train_s += epoch_s;
    train_before = result.train_s;
    steps_before = result.steps;
    dsgd::EpochSummary e;
    e.epoch = epoch;
    e.train_loss = r.metrics.count("loss") ? r.metrics.at("loss") : 0;
    e.epoch_s = epoch_s;
    e.samples_per_s = epoch_s > 0 ? static_cast<double>(samples) / epoch_s : 0;
    for (const auto& ev : r.recoveries) {
      recoveries->push_back(recovery_json(ev));
      if (ev.kind == "recovery") ++e.recoveries;
    }
    if (f.profile && batches > 0) {
      double phases = 0;
      for (const auto& p : kPhases) {
        if (!r.metrics.count(p.metric)) continue;
        e.profile_ms[p.key] = 1000 * r.metrics.at(p.metric);
        phases += e.profile_ms[p.key];
      }
      if (r.metrics.count("snapshot_s")) {  // the call's total, between chunks
        e.profile_ms["snapshot"] = 1000 * r.metrics.at("snapshot_s") / static_cast<double>(batches);
        phases += e.profile_ms["snapshot"];
      }
      e.profile_ms["step"] = 1000 * epoch_s / static_cast<double>(batches);
      e.profile_ms["other"] = std::max(0.0, e.profile_ms["step"] - phases);
      epoch_steps.push_back(batches);
    } else {
      epoch_steps.push_back(0);
    }
    if (j.evaluate) {
      auto v = trainer.validate();
      for (const auto& ev : v.recoveries) {
        recoveries->push_back(recovery_json(ev));
        if (ev.kind == "recovery") ++e.recoveries;
      }
      e.test_loss = v.metrics.at("loss");
      e.test_accuracy = v.metrics.at("accuracy");
    }
    result.history.push_back(e);
    result.epochs = epoch;
    result.train_loss = e.train_loss;
    result.test_loss = e.test_loss;
    result.test_accuracy = e.test_accuracy;
    if (progress != nullptr) progress->on_epoch(e);
    if (r.batch != 0) break;  // stopped inside the epoch: max-steps reached
    ++epoch;
  }
  if (!f.save.empty()) trainer.save(f.save);
  if (f.profile) result.profile_ms = mean_profile(result.history, epoch_steps);
  result.parameters = trainer.parameter_count();
  if (comm_steps > 0) result.comm_bytes_per_step = comm_bytes / static_cast<double>(comm_steps);
  result.samples_per_s = result.train_s > 0 ? static_cast<double>(result.samples) / result.train_s : 0;
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

int run_train(TrainFlags& f) {
  try {
    validate_flags(f);
  } catch (const ConfigError& e) {
    std::cerr << "dsgd train: error: " << e.what() << "\n";
    return kExitUsage;
  }
  try {
    std::unique_ptr<ProgressPrinter> progress;
    if (!f.quiet) progress = std::make_unique<ProgressPrinter>(stderr, ::isatty(STDERR_FILENO) != 0);
    if (!f.quiet) std::cerr << "dsgd train: model " << f.job.model << ", dataset " << f.job.dataset << ", " << f.job.epochs
              << " epoch(s), batch " << f.job.batch_size << ", " << f.job.threads << " thread(s), "
              << (f.in_process ? std::string("in-process") : std::to_string(f.trainer.num_workers) + " worker(s), " + f.strategy)
              << "\n";
    nlohmann::json recoveries = nlohmann::json::array();
    auto result = f.in_process ? dsgd::run_local_job(f.job, progress.get())
                               : run_with_trainer(f, progress.get(), &recoveries);
    if (f.profile && !f.quiet && result.history.size() > 1) {
      std::cerr << "dsgd train: " << describe_profile(result.profile_ms) << "\n";
    }
    const auto json = to_json(f, result, recoveries);
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
    std::cerr << "dsgd train: error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "dsgd train: error: " << e.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace

void add_train_command(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<TrainFlags>();
  auto& j = flags->job;
  CLI::App* cmd = app.add_subcommand("train", "Train a model and print a JSON summary of the run");
  cmd->footer(
      "\nExamples:\n"
      "  dsgd train                                   # the CNN on Fashion-MNIST, 1 epoch\n"
      "  dsgd train --epochs 5 --threads 2 --json-out run.json\n"
      "  dsgd train --model mlp --dataset synthetic --max-steps 200\n"
      "  dsgd train --workers 2 --strategy simple --save ckpt\n"
      "\nProgress goes to stderr (a live bar on a terminal, a line every 10 s otherwise); the\n"
      "JSON summary goes to stdout. Exit status: 0 done, 1 the job failed, 2 bad flags.");
  cmd->add_option("--model", j.model, "Model: cnn, mlp, resnet18, resnet50, simulated (sleeps instead of computing: see --config)")->capture_default_str();
  cmd->add_option("--dataset", j.dataset, "Data: fashion-mnist or synthetic (random images, for benchmarks)")
      ->capture_default_str();
  cmd->add_option("--data-dir", j.data_dir, "Directory with Fashion-MNIST's IDX files (.gz or plain)")
      ->capture_default_str();
  cmd->add_option("--epochs", j.epochs, "Passes over the training set")->capture_default_str();
  cmd->add_option("--batch-size", j.batch_size, "Global batch size (samples per step)")->capture_default_str();
  cmd->add_option("--lr", j.lr, "SGD learning rate")->capture_default_str();
  cmd->add_option("--momentum", j.momentum, "SGD momentum, in [0, 1)")->capture_default_str();
  cmd->add_option("--lr-decay", j.lr_decay, "Multiply the learning rate by this after every epoch, in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--seed", j.seed, "Seed for initial weights and shuffling")->capture_default_str();
  j.threads = 0;
  cmd->add_option("--threads", j.threads, "LibTorch threads per worker; 0 = cores / workers")
      ->capture_default_str();
  cmd->add_option("--workers", flags->trainer.num_workers, "Worker processes")->capture_default_str();
  cmd->add_option("--devices-per-worker", flags->trainer.devices_per_worker, "Model replicas per worker process")
      ->capture_default_str();
  cmd->add_option("--strategy", flags->strategy, "Gradient synchronisation: simple, allreduce, ps or ps_async")
      ->capture_default_str();
  cmd->add_option("--ps-shards", flags->trainer.num_ps_shards, "ps: parameter-server shards (0 = one per host)")
      ->capture_default_str();
  cmd->add_flag("--ps-update-on-shards", flags->trainer.ps_update_on_shards,
                "ps: the shards apply SGD and hold its momentum (optimizer state sharded); needs SGD");
  cmd->add_option("--ps-placement", flags->ps_placement,
                  "ps: the shards live in the workers, or in processes of their own (--ps-shards of them; "
                  "remote mode: start each with dsgd ps-server --shard S)")
      ->check(CLI::IsMember(std::vector<std::string>(ChoiceTraits<PsPlacement>::names.begin(),
                                                     ChoiceTraits<PsPlacement>::names.end())))
      ->capture_default_str();
  cmd->add_option("--max-staleness", flags->trainer.max_staleness,
                  "ps_async: a worker this many updates ahead of the slowest waits (-1 = never)")
      ->capture_default_str();
  cmd->add_option("--local-hosts", flags->trainer.local_hosts,
                  "Spread local workers over this many pseudo-hosts (shared memory only within each)")
      ->capture_default_str();
  cmd->add_option("--allreduce-algo", flags->allreduce_algo, "auto (shared memory + Gloo), ring or hd")
      ->capture_default_str();
  cmd->add_option("--grad-shard-bytes", flags->trainer.grad_shard_bytes, "Gradient bucket size in bytes")
      ->capture_default_str();
  cmd->add_flag("!--no-overlap", flags->trainer.overlap, "Communicate gradients after backward instead of during it");
  cmd->add_option("--forward-overlap-buckets", flags->forward_overlap_buckets,
                  "Also overlap the next forward: this many buckets (spread over the layers) go after "
                  "backward, first layer first, and each is applied as forward reaches it (0 = off; auto: tried on the "
                  "first steps)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()) | CLI::IsMember({"auto"}))
      ->capture_default_str();
  cmd->add_option("--save", flags->save, "Write a checkpoint directory at the end");
  cmd->add_option("--load", flags->load,
                  "Start from this checkpoint directory, or from the newest intact one in a --checkpoint-dir");
  cmd->add_option("--checkpoint-dir", flags->trainer.checkpoint_dir,
                  "Also write every --checkpoint-every snapshot here (step-N), keeping --keep-checkpoints");
  cmd->add_option("--checkpoint-every", flags->trainer.checkpoint_every_steps,
                  "Steps between snapshots, at least; a lost worker costs at most one interval (0 = once per epoch)")
      ->capture_default_str();
  cmd->add_option("--checkpoint-overhead", flags->trainer.checkpoint_max_overhead,
                  "Longer intervals where snapshots would take more than this share of training time "
                  "(0 = exactly every --checkpoint-every steps)")
      ->capture_default_str();
  cmd->add_option("--keep-checkpoints", flags->trainer.checkpoint_keep, "Checkpoints kept in --checkpoint-dir")
      ->capture_default_str();
  cmd->add_option("--standby", flags->trainer.standby_workers,
                  "Standby workers: set up outside the group, each takes a lost worker's place in well under a second")
      ->capture_default_str();
  cmd->add_flag("--wait-for-replacements", flags->trainer.wait_for_replacements,
                "After a loss without a standby, wait for new workers instead of going on with the survivors");
  cmd->add_option("--max-failures", flags->trainer.max_failures, "Lost workers survived before the job fails")
      ->capture_default_str();
  cmd->add_option("--heartbeat-timeout-ms", flags->heartbeat_timeout_ms,
                  "A worker silent this long (hung, or its network cut) is evicted")
      ->capture_default_str();
  cmd->add_option("--device", flags->device,
                  "Where replicas compute: auto (CUDA when the workers' LibTorch sees a GPU), cpu or cuda")
      ->capture_default_str();
  cmd->add_option("--precision", flags->precision,
                  "fp32; bf16: forward and loss under bfloat16 autocast (float32 weights and optimizer); fp16: "
                  "the same in float16 with dynamic loss scaling (CUDA only)")
      ->capture_default_str();
  cmd->add_option("--loss-scale", flags->trainer.loss_scale,
                  "Dynamic loss scaling from this scale (a power of two); 0: 65536 under fp16, else off; -1: off")
      ->capture_default_str();
  cmd->add_option("--loss-scale-growth-interval", flags->trainer.loss_scale_growth_interval,
                  "Finite steps in a row before the loss scale doubles")
      ->capture_default_str();
  cmd->add_option("--compression", flags->compression,
                  "What crosses hosts (allreduce): none; fp16 / bf16: 16 bits a value on the wire, summed in "
                  "float32; powersgd:R: PowerSGD's rank-R factors of each matrix (R default 4); the lossy ones with "
                  "error feedback")
      ->capture_default_str();
  cmd->add_option("--powersgd-start-steps", flags->trainer.powersgd_start_steps,
                  "--compression powersgd: plain float32 steps first")
      ->capture_default_str();
  cmd->add_option("--nonfinite", flags->nonfinite,
                  "A NaN/infinite gradient: skip (the step, everywhere, and warn) or error (stop)")
      ->capture_default_str();
  cmd->add_option("--listen", flags->trainer.listen,
                  "HOST:PORT: wait for --workers workers started elsewhere (`dsgd worker`) instead of spawning");
  cmd->add_option("--token", flags->trainer.token, "Job token for --listen (default: $DSGD_TOKEN, else random, printed)");
  cmd->add_option("--cluster", flags->cluster,
                  "A cluster spec (TF_CONFIG's shape; default: $DSGD_CLUSTER) whose task is the chief: listen on its "
                  "address for its workers and ps shards");
  cmd->add_option("--launcher", flags->launcher,
                  "Who starts the workers: local (this host), ssh (--hosts, over the system's ssh client; needs "
                  "--listen HOST:PORT the hosts reach), mpirun (all at once; --hosts optional; a lost worker is not "
                  "replaced), slurm (a job step per worker inside sbatch/salloc; needs --listen HOST:PORT the nodes reach), "
                  "none (you do: `dsgd worker --driver`); auto: local, or none with --listen")
      ->capture_default_str();
  cmd->add_option("--hosts", flags->hosts_file,
                  "--launcher ssh or mpirun: a file of hosts, one \"host\" or \"host:slots\" a line (# comments)");
  cmd->add_option("--ssh-command", flags->trainer.ssh_command,
                  "--launcher ssh: the ssh client and its options (e.g. \"ssh -p 2222 -i KEY\")")
      ->capture_default_str();
  cmd->add_option("--mpirun-command", flags->trainer.mpirun_command,
                  "--launcher mpirun: mpirun and its options (e.g. \"mpirun --allow-run-as-root\")")
      ->capture_default_str();
  cmd->add_option("--config", flags->config,
                  "JSON object merged into the operator's config (keys: model, dataset, data_dir, lr, momentum, "
                  "lr_decay, dropout, channels_last, cudnn_benchmark, synthetic_samples, synthetic_image_size, synthetic_channels; for --model simulated: sim_parameters, "
                  "sim_layers, sim_step_ms)");
  cmd->add_flag("--in-process", flags->in_process,
                "Train in this process without workers (the single-process baseline)");
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
  cmd->add_option("--json-out", flags->json_out, "Also write the JSON summary to this file");
  cmd->add_flag("-q,--quiet", flags->quiet, "No progress output");
  cmd->add_option("--srun-command", flags->trainer.srun_command,
                  "--launcher slurm: srun and its options for every worker's step (e.g. \"srun --cpus-per-task=4\")")
      ->capture_default_str();
  cmd->add_option("--trace", flags->trace,
                  "Write a timeline of the training to this file, a Chrome trace (open it in ui.perfetto.dev "
                  "or chrome://tracing): each worker's forward, backward, optimizer and waits for buckets, "
                  "and every allreduce on its communication thread. With several epochs, one file each: "
                  "trace.json becomes trace-epoch1.json, ...")
      ->type_name("FILE");
  cmd->add_flag("--profile", flags->profile,
                "Time each step's phases (forward, backward, optimizer, waiting for communication, and the "
                "driver's snapshots; ms per step, mean over workers): on stderr after each epoch and at the "
                "end, and in the JSON summary");
  cmd->callback([flags, exit_code] { *exit_code = run_train(*flags); });
}

}  // namespace dsgd::cli
