// The `dsgd` command line: one add_*_command per subcommand, each in its own file.
// A subcommand's handler returns the process exit code: 0 success, 1 the job failed
// (e.g. bad data), 2 bad usage (a flag's value is invalid).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "dsgd/runtime/cluster.h"

namespace dsgd::cli {

inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// The job token from the environment: $DSGD_TOKEN, else the contents of the file $DSGD_TOKEN_FILE
// names (a secret mounted as a file; a trailing newline dropped); "" without either.
std::string token_from_environment();

// The same `dsgd train` in every process of a job an engine started: this process joins the job
// at spec.chief as its task (a worker or a ps shard; dsgd/runtime/cluster.h). Returns the exit code.
int join_as_task(const ClusterSpec& spec, const std::string& token);

// `dsgd train`: trains a model and prints a JSON summary. *exit_code receives its status.
void add_train_command(CLI::App& app, int* exit_code);

// `dsgd worker`: join a remote driver.
void add_worker_command(CLI::App& app, int* exit_code);

// `dsgd ps-server`: join a remote driver as a parameter-server shard process.
void add_ps_server_command(CLI::App& app, int* exit_code);

// `dsgd dashboard --metrics-dir DIR`: a job's dashboard from its files.
void add_dashboard_command(CLI::App& app, int* exit_code);

// `dsgd tls-keys DIR`: a job's TLS keys for a driver and workers started apart.
void add_tls_keys_command(CLI::App& app, int* exit_code);

// `dsgd evaluate`: the evaluator role, evaluating a job's checkpoints as they appear.
void add_evaluate_command(CLI::App& app, int* exit_code);

// `dsgd tune`: hyper-parameter search (dsgd/tune/tuner.h).
void add_tune_command(CLI::App& app, int* exit_code);

// `dsgd prepare-text`: a text file into a language model's token files (dsgd/data/text.h).
void add_prepare_text_command(CLI::App& app, int* exit_code);

// `dsgd generate`: text from a language model's checkpoint.
void add_generate_command(CLI::App& app, int* exit_code);

// `dsgd export --checkpoint DIR --out model.pt`: a checkpoint's models for Python, without a job.
void add_export_command(CLI::App& app, int* exit_code);

// `dsgd settings`: every setting of a job, its default, flag and help (dsgd/runtime/settings.h).
void add_settings_command(CLI::App& app, int* exit_code);

// `dsgd bench allreduce`: communication benchmarks.
void add_bench_command(CLI::App& app, int* exit_code);

}  // namespace dsgd::cli
