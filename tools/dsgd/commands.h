// The `dsgd` command line: one add_*_command per subcommand, each in its own file.
// A subcommand's handler returns the process exit code: 0 success, 1 the job failed
// (e.g. bad data), 2 bad usage (a flag's value is invalid).
#pragma once

#include <CLI/CLI.hpp>

namespace dsgd::cli {

inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

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

// `dsgd settings`: every setting of a job, its default, flag and help (dsgd/runtime/settings.h).
void add_settings_command(CLI::App& app, int* exit_code);

// `dsgd bench allreduce`: communication benchmarks.
void add_bench_command(CLI::App& app, int* exit_code);

}  // namespace dsgd::cli
