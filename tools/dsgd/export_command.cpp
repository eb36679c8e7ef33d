// `dsgd export`: a checkpoint's models as model.pt for Python (dsgd/runtime/loaded_operator.h's
// export_model), without starting a job.
#include <chrono>
#include <iostream>
#include <memory>

#include "commands.h"
#include "dsgd/common/error.h"
#include "dsgd/runtime/loaded_operator.h"

namespace dsgd::cli {
namespace {

struct ExportArgs {
  std::string checkpoint;
  std::string out;
  int threads = 1;
};

}  // namespace

void add_export_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand("export", "Write a checkpoint's models as model.pt for Python's torch.load");
  cmd->footer(
      "\nExample:\n"
      "  dsgd train --workers 2 --save ckpt\n"
      "  dsgd export --checkpoint ckpt --out model.pt\n"
      "  python3 -c \"import torch; print(torch.load('model.pt').keys())\"");
  cmd->add_option("--checkpoint", args->checkpoint, "A checkpoint directory (--save), or a --checkpoint-dir root")
      ->required();
  cmd->add_option("--out", args->out, "The file to write (a TorchScript model's: torch.jit.load reads it)")->required();
  cmd->add_option("--threads", args->threads, "LibTorch threads")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->callback([args, exit_code] {
    try {
      const auto t0 = std::chrono::steady_clock::now();
      export_model(args->checkpoint, args->out, args->threads);
      std::cout << "dsgd export: " << args->out << " written from " << args->checkpoint << " in "
                << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s\n";
      *exit_code = 0;
    } catch (const ConfigError& e) {
      std::cerr << "dsgd export: error: " << e.what() << "\n";
      *exit_code = kExitUsage;
    } catch (const std::exception& e) {
      std::cerr << "dsgd export: error: " << e.what() << "\n";
      *exit_code = kExitFailure;
    }
  });
}

}  // namespace dsgd::cli
