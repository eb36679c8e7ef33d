#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "dsgd/error.h"
#include "progress.h"
#include "runtime/local_job.h"

namespace dsgd::cli {
namespace {

struct TrainFlags {
  runtime::LocalJobOptions job;
  int workers = 1;
  std::string strategy = "allreduce";
  std::string json_out;
  bool quiet = false;
};

nlohmann::json to_json(const TrainFlags& f, const runtime::LocalJobResult& r) {
  nlohmann::json history = nlohmann::json::array();
  for (const auto& e : r.history) {
    history.push_back({{"epoch", e.epoch},
                       {"train_loss", e.train_loss},
                       {"test_loss", e.test_loss},
                       {"test_accuracy", e.test_accuracy},
                       {"samples_per_s", e.samples_per_s},
                       {"epoch_s", e.epoch_s}});
  }
  return {{"test_accuracy", r.test_accuracy},
          {"test_loss", r.test_loss},
          {"train_loss", r.train_loss},
          {"epochs", r.epochs},
          {"steps", r.steps},
          {"samples", r.samples},
          {"workers", f.workers},
          {"strategy", f.strategy},
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
          {"history", history}};
}

// Checks the output file can be written now, so a long run does not fail at its very end.
void check_writable(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw ConfigError("--json-out " + path + ": directory " + dir.string() + " does not exist; create it first");
  }
  if (fs::is_directory(p, ec)) throw ConfigError("--json-out " + path + ": is a directory; name a file");
  if (::access(dir.c_str(), W_OK) != 0) {
    throw ConfigError("--json-out " + path + ": directory " + dir.string() + " is not writable");
  }
}

void validate_flags(TrainFlags& f) {
  if (f.workers < 1) throw ConfigError("--workers must be >= 1, got " + std::to_string(f.workers));
  if (f.strategy != "simple" && f.strategy != "allreduce") {
    throw ConfigError("unknown --strategy '" + f.strategy + "'; known strategies: simple, allreduce");
  }
  if (f.workers > 1) {
    throw ConfigError("--workers " + std::to_string(f.workers) +
                      ": this build trains in one process only (the multi-process runtime is not "
                      "built yet); run with --workers 1 and --threads to use more cores");
  }
  if (f.job.threads == 0) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    f.job.threads = static_cast<int>(std::max(1u, cores / static_cast<unsigned>(f.workers)));
  }
  runtime::validate(f.job);
  if (!f.json_out.empty()) check_writable(f.json_out);
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
              << f.workers << " worker(s)\n";
    auto result = runtime::run_local_job(f.job, progress.get());
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
      "\nProgress goes to stderr (a live bar on a terminal, a line every 10 s otherwise); the\n"
      "JSON summary goes to stdout. Exit status: 0 done, 1 the job failed, 2 bad flags.");
  cmd->add_option("--model", j.model, "Model: cnn, mlp, resnet18, resnet50")->capture_default_str();
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
  cmd->add_option("--workers", flags->workers, "Worker processes (this build: 1)")->capture_default_str();
  cmd->add_option("--strategy", flags->strategy, "Gradient synchronisation: simple or allreduce")
      ->capture_default_str();
  cmd->add_option("--max-steps", j.max_steps, "Stop after this many steps in all; 0 = run every epoch")
      ->capture_default_str();
  cmd->add_option("--synthetic-samples", j.synthetic_samples, "Training samples of --dataset synthetic")
      ->capture_default_str();
  cmd->add_option("--image-size", j.synthetic_image_size, "Image side in pixels of --dataset synthetic")
      ->capture_default_str();
  cmd->add_flag("!--no-eval", j.evaluate, "Skip evaluating on the test split after each epoch");
  cmd->add_flag("!--no-dropout", j.dropout, "Turn dropout layers off");
  cmd->add_option("--json-out", flags->json_out, "Also write the JSON summary to this file");
  cmd->add_flag("-q,--quiet", flags->quiet, "No progress output");
  cmd->callback([flags, exit_code] { *exit_code = run_train(*flags); });
}

}  // namespace dsgd::cli
