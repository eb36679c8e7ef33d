// `dsgd generate`: text from a trained language model (dsgd/apps/language_model.h): the checkpoint's
// GPT continues a prompt, a byte at a time, sampled with a temperature from the top k.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "dsgd/common/error.h"
#include "dsgd/models/gpt.h"
#include "dsgd/runtime/loaded_operator.h"
#include "dsgd/torch/operator.h"
#include "dsgd/data/text.h"

namespace dsgd::cli {
namespace {

struct GenerateArgs {
  std::string checkpoint;
  std::string prompt = "\n";
  int64_t tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  uint64_t seed = 1;
  int threads = 1;
};

// Samples `n` tokens after `tokens` from the model's next-token distribution.
std::vector<int32_t> sample(models::Gpt& gpt, std::vector<int32_t> tokens, const GenerateArgs& a) {
  torch::NoGradGuard no_grad;
  gpt.eval();
  auto gen = at::detail::createCPUGenerator(a.seed);
  const int64_t context = gpt.options().context, vocab = gpt.options().vocab_size;
  for (int64_t i = 0; i < a.tokens; ++i) {
    const size_t from = tokens.size() > static_cast<size_t>(context) ? tokens.size() - context : 0;
    auto x = torch::tensor(std::vector<int64_t>(tokens.begin() + static_cast<std::ptrdiff_t>(from), tokens.end()),
                           torch::kInt64)
                 .unsqueeze(0);
    auto logits = gpt.forward(x).select(1, x.size(1) - 1).squeeze(0).to(torch::kFloat32) / a.temperature;
    if (a.top_k > 0 && a.top_k < vocab) {
      const auto kth = std::get<0>(logits.topk(a.top_k)).min();
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
    }
    const auto next = torch::multinomial(torch::softmax(logits, 0), 1, false, gen).item<int64_t>();
    tokens.push_back(static_cast<int32_t>(next));
  }
  return tokens;
}

int run_generate(const GenerateArgs& a) {
  if (a.prompt.empty()) throw ConfigError("--prompt is empty: give the text to continue (a newline starts afresh)");
  torch::set_num_threads(a.threads);
  auto loaded = load_operator(a.checkpoint, a.threads);
  auto gpt = std::dynamic_pointer_cast<models::Gpt>(loaded->op().models().at(0));
  if (gpt == nullptr) {
    throw ConfigError(a.checkpoint + ": its model is no GPT (operator " + loaded->operator_name() +
                      "): generate continues text with a language model's checkpoint (dsgd train --model gpt-*)");
  }
  const auto prompt = data::encode_bytes(a.prompt);
  const auto out = sample(*gpt, prompt, a);
  std::cout << data::decode_bytes(out) << std::endl;
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Continue a prompt with a trained language model's checkpoint");
  cmd->footer(
      "\nExample:\n"
      "  dsgd train --model gpt-small --dataset text:gcide --workers 2 --save lm\n"
      "  dsgd generate --checkpoint lm --prompt 'Lexicon, n.' --tokens 300");
  cmd->add_option("--checkpoint", args->checkpoint, "A checkpoint directory (--save), or a --checkpoint-dir root")
      ->required();
  cmd->add_option("--prompt", args->prompt, "The text to continue")->capture_default_str();
  cmd->add_option("--tokens", args->tokens, "Tokens (bytes) to generate")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}))
      ->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "Sharpness: below 1 likelier choices, above 1 more varied")
      ->check(CLI::Range(0.01, 10.0))
      ->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "Sample from the k likeliest tokens only (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the sampling")->capture_default_str();
  cmd->add_option("--threads", args->threads, "LibTorch threads")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->callback([args, exit_code] {
    try {
      *exit_code = run_generate(*args);
    } catch (const ConfigError& e) {
      std::cerr << "dsgd generate: error: " << e.what() << "\n";
      *exit_code = kExitUsage;
    } catch (const std::exception& e) {
      std::cerr << "dsgd generate: error: " << e.what() << "\n";
      *exit_code = kExitFailure;
    }
  });
}

}  // namespace dsgd::cli
