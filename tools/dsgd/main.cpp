// dsgd — distributed data-parallel training of LibTorch models. See `dsgd --help`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "commands.h"
#include "dsgd/runtime/trainer.h"
#include "dsgd/apps/image_classifier.h"

int main(int argc, char** argv) {
  // Spawned by a driver (`dsgd train --workers N`): serve as its worker and exit.
  dsgd::register_builtin_operators();
  dsgd::init(argc, argv);
  CLI::App app{
      "dsgd: distributed synchronous SGD for LibTorch models.\n"
      "Trains the reference models (cnn, mlp, resnet18, resnet50) on Fashion-MNIST or synthetic data,\n"
      "and GPT language models (gpt-tiny to gpt-xl: GPT-2's shapes) on text."};
  app.set_version_flag("--version", std::string("dsgd ") + DSGD_VERSION);
  app.require_subcommand(1);
  app.footer("\nRun `dsgd SUBCOMMAND --help` for a subcommand's flags.");
  int exit_code = 0;
  dsgd::cli::add_train_command(app, &exit_code);
  dsgd::cli::add_worker_command(app, &exit_code);
  dsgd::cli::add_ps_server_command(app, &exit_code);
  dsgd::cli::add_tls_keys_command(app, &exit_code);
  dsgd::cli::add_dashboard_command(app, &exit_code);
  dsgd::cli::add_evaluate_command(app, &exit_code);
  dsgd::cli::add_tune_command(app, &exit_code);
  dsgd::cli::add_prepare_text_command(app, &exit_code);
  dsgd::cli::add_generate_command(app, &exit_code);
  dsgd::cli::add_export_command(app, &exit_code);
  dsgd::cli::add_settings_command(app, &exit_code);
  dsgd::cli::add_bench_command(app, &exit_code);
  // CLI11 would only say "a subcommand is required" for a misspelt one: name it.
  std::string known;
  bool found = false;
  for (const auto* sub : app.get_subcommands({})) {
    known += (known.empty() ? "" : ", ") + sub->get_name();
    found = found || (argc > 1 && sub->get_name() == argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !found) {
    std::fprintf(stderr, "dsgd: unknown command '%s'; commands: %s (see dsgd --help)\n", argv[1], known.c_str());
    return dsgd::cli::kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : dsgd::cli::kExitUsage;
  }
  return exit_code;
}
