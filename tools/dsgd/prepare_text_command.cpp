// `dsgd prepare-text`: a text file (dict-gcide's dictionary by default) into the token files a
// language model trains on (dsgd/data/text.h), with a held-out validation part.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "dsgd/common/error.h"
#include "dsgd/data/text.h"

namespace dsgd::cli {

void add_prepare_text_command(CLI::App& app, int* exit_code) {
  struct Args {
    std::string input = data::kGcideDict;
    std::string out;
    double val_fraction = 0.01;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("prepare-text", "Tokenise a text file for a language model (bytes as tokens)");
  cmd->footer(
      "\nExample:\n"
      "  dsgd prepare-text --out gcide          # gcide/train.tok, gcide/val.tok\n"
      "  dsgd train --model gpt-small --dataset text:gcide --workers 2\n"
      "Each byte is a token (a vocabulary of 256): any text encodes, and nothing is learned first.");
  cmd->add_option("--input", args->input, "A text file, plain or gzip/dictzip-compressed")->capture_default_str();
  cmd->add_option("--out", args->out, "The directory to write train.tok and val.tok to")->required();
  cmd->add_option("--val-fraction", args->val_fraction, "The share of the text (its end) held out for validation")
      ->check(CLI::Range(0.0001, 0.5))
      ->capture_default_str();
  cmd->callback([args, exit_code] {
    try {
      const auto p = data::prepare_text(args->input, args->out, args->val_fraction);
      std::cout << nlohmann::json{{"train", p.train_path},
                                  {"val", p.val_path},
                                  {"train_tokens", p.train_tokens},
                                  {"val_tokens", p.val_tokens}}
                       .dump(2)
                << std::endl;
      *exit_code = 0;
    } catch (const ConfigError& e) {
      std::cerr << "dsgd prepare-text: error: " << e.what() << "\n";
      *exit_code = kExitUsage;
    } catch (const std::exception& e) {
      std::cerr << "dsgd prepare-text: error: " << e.what() << "\n";
      *exit_code = kExitFailure;
    }
  });
}

}  // namespace dsgd::cli
