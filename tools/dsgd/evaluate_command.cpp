// `dsgd evaluate`: the evaluator role (dsgd/runtime/evaluator.h): evaluates each checkpoint a job writes
// to its --checkpoint-dir as it appears, on its own process (and host), until the job ends.
#include <iostream>
#include <memory>
#include <optional>

#include "commands.h"
#include "dsgd/runtime/cluster.h"
#include "dsgd/common/error.h"
#include "dsgd/runtime/evaluator.h"

namespace dsgd::cli {

void add_evaluate_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<dsgd::EvaluatorArgs>();
  auto cluster = std::make_shared<std::string>();
  auto idle_s = std::make_shared<int64_t>(std::chrono::duration_cast<std::chrono::seconds>(args->idle_timeout).count());
  CLI::App* cmd = app.add_subcommand("evaluate", "Evaluate a job's checkpoints as it writes them (the evaluator role)");
  cmd->footer(
      "\nExample:\n"
      "  dsgd train --workers 2 --epochs 10 --checkpoint-dir ckpts --checkpoint-every 200 &\n"
      "  dsgd evaluate --checkpoint-dir ckpts --metrics-out eval.jsonl     # eval.jsonl.csv for plots\n"
      "Each checkpoint names its operator and config: the evaluator builds the same model. It\n"
      "evaluates the newest checkpoint each time (skipping those it fell behind on) and exits 0\n"
      "once the job has ended and its last checkpoint is evaluated.");
  cmd->add_option("--checkpoint-dir", args->checkpoint_dir, "The job's --checkpoint-dir")->required();
  cmd->add_option("--metrics-out", args->metrics_out,
                  "Append one JSON line per checkpoint here (and a CSV row to FILE.csv)");
  cmd->add_option("--threads", args->threads, "LibTorch threads")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--idle-timeout-s", *idle_s,
                  "Exit (status 3) after this long without a new checkpoint or the job's end")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--cluster", *cluster, "A cluster spec whose task is the evaluator (default: $DSGD_CLUSTER)");
  cmd->callback([args, cluster, idle_s, exit_code] {
    try {
      const auto spec = ClusterSpec::load(*cluster);
      if (spec && spec->task_type != "evaluator") {
        throw ConfigError("this process's task in the cluster spec is " + spec->task_name() + ", not the evaluator");
      }
    } catch (const ConfigError& e) {
      std::cerr << "dsgd evaluate: error: " << e.what() << "\n";
      *exit_code = kExitUsage;
      return;
    }
    args->idle_timeout = std::chrono::seconds(*idle_s);
    *exit_code = dsgd::run_evaluator(*args);
  });
}

}  // namespace dsgd::cli
