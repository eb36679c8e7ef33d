// dsgd/apps/language_model.h — the built-in language-model operator: a GPT (dsgd/models/gpt.h) trained on
// token files (dsgd/data/text.h) that stream from disk, with AdamW and a warmup-cosine schedule.
//
//   dsgd::register_builtin_operators();
//   dsgd::TrainerConfig c{.num_workers = 2, .batch_size = 32,
//                         .config = {{"model", "gpt-tiny"}, {"train_tokens", "kjv/train.tok"}}};
//   c.step.scheduler_step_freq = "batch";     // the schedule counts steps
//   dsgd::Trainer trainer(dsgd::kLanguageModel, c);
//
// A sample is `context` tokens and their next tokens (TokenDataset); the model's loss is the mean
// next-token cross entropy ("loss" in the metrics; perplexity is exp(loss)). AdamW's weight decay
// applies to tensors of two or more dimensions (matrices and embeddings), not to biases and
// LayerNorms, as nanoGPT trains GPT-2.
// Learning rate at step t: lr * (t + 1) / warmup_steps during the warmup, then a cosine from lr
// down to min_lr over decay_steps (0: lr stays). Torch-free header.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace dsgd {

inline constexpr const char* kLanguageModel = "dsgd.LanguageModel";

// The FLOPs of a training step a parameter a token, the usual estimate of a transformer's work
// (2 for the forward's multiply-adds, 4 for the backward's): `dsgd train` reports model_flops_per_s
// as this times the parameters times tokens/s. What LibTorch's profiler counts in a step of
// gpt-tiny at its full context is 1.09x it (Gpt.SixFlopsAParameterATokenIsWhatATrainingStepComputes).
inline constexpr double kTrainingFlopsPerParameterToken = 6;

struct LanguageModelOptions {
  std::string model = "gpt-tiny";  // gpt-tiny | gpt-small | gpt-base (dsgd/models/gpt.h), or a TorchScript
                                   // file (dsgd/models/registry.h: load_scripted_language_model; needs context)
  std::string train_tokens;        // a token file (dsgd prepare-text)
  std::string val_tokens;          // "" = no validation
  int64_t val_sequences = 0;       // validate on the first this many sequences of it; 0 = all
  int64_t context = 0;             // tokens a sample; 0 = the gpt's context
  double dropout = 0;
  double lr = 6e-4;
  double min_lr = 6e-5;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;
};

// The options of `config` (keys as the fields above) over the defaults, validated: ConfigError
// naming the key for an unknown key, a wrong type or a value out of range. The token files are
// opened by the workers (DataError there, naming the file).
LanguageModelOptions language_model_options(const nlohmann::json& config);

// Tokens in a sample: options.context, or the model's context where that is 0.
int64_t language_model_context(const LanguageModelOptions& options);

// The schedule's factor at step t (the learning rate is lr times it).
double language_model_lr_factor(const LanguageModelOptions& options, int64_t t);

// Registers the operator and its config check (idempotent); register_builtin_operators
// (dsgd/apps/image_classifier.h) calls it.
void register_language_model();

}  // namespace dsgd
