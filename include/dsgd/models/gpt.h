// dsgd/models/gpt.h — a GPT-style decoder-only language model (GPT-2's layout), on LibTorch's modules.
//
//   auto gpt = dsgd::models::make_gpt(dsgd::models::gpt_options("gpt-small", /*vocab_size=*/4096));
//   torch::Tensor logits = gpt->forward(tokens);          // int64 [N, T] -> float [N, T, vocab_size]
//   torch::Tensor loss = dsgd::models::next_token_loss(logits, tokens_shifted_by_one);
//
// Token and learned position embeddings; `layers` pre-LayerNorm blocks, each causal
// self-attention (one fused QKV matmul, all heads in one batched matmul, no loop over heads) and
// a GELU MLP of 4 x width, each added to the residual stream; a final LayerNorm; the output
// projection is the token embedding itself (tied weights). Initialised as GPT-2: normal(0, 0.02),
// the two projections into the residual stream scaled by 1/sqrt(2 x layers), biases zero.
//
//   name       layers  width  heads  context   parameters
//   gpt-tiny   4       128    4      128       0.8M + 128 x vocab   (tests)
//   gpt-small  6       384    6      256       10.7M + 384 x vocab
//   gpt-base   12      768    12     1024      85.8M + 768 x vocab  (GPT-2 small: 124,439,808 at vocab 50257)
//   gpt-medium 24      1024   16     1024      303.4M + 1024 x vocab (GPT-2 medium: 354,823,168)
//   gpt-large  36      1280   20     1024      709.7M + 1280 x vocab (GPT-2 large: 774,030,080)
//   gpt-xl     48      1600   25     1024      1477.2M + 1600 x vocab (GPT-2 XL: 1,557,611,200)
//
// At 16 bytes a parameter with AdamW (weights, gradient, two moments) one replica of gpt-large
// holds 12.4 GB before activations; step.zero_stage shares the gradient and state.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>

namespace dsgd::models {

struct GptOptions {
  int64_t vocab_size = 256;  // tokens 0..vocab_size-1 (256: bytes)
  int64_t context = 128;     // the longest sequence (position embeddings)
  int64_t layers = 4;
  int64_t width = 128;  // the residual stream's size; a multiple of heads
  int64_t heads = 4;
  double dropout = 0;  // after embeddings, attention weights, and each block's two branches
};

// The named shape `name` (table above) for a vocabulary of vocab_size. ConfigError for an unknown
// name (listing the known ones).
GptOptions gpt_options(const std::string& name, int64_t vocab_size);

// The parameters of the shape (trainable elements, the output projection tied to the token
// embedding), without building it: what a memory estimate needs.
int64_t gpt_parameters(const GptOptions& options);

class Gpt : public torch::nn::Module {
 public:
  // ConfigError for a shape that does not hold together (width not a multiple of heads, a size < 1).
  explicit Gpt(const GptOptions& options);

  // tokens: int64 [N, T] with T <= context -> logits [N, T, vocab_size]; position t sees tokens
  // 0..t only.
  torch::Tensor forward(const torch::Tensor& tokens);

  const GptOptions& options() const { return options_; }

 private:
  struct Impl;
  GptOptions options_;
  std::shared_ptr<Impl> impl_;
};

std::shared_ptr<Gpt> make_gpt(const GptOptions& options);

// Mean cross entropy of logits [N, T, V] against targets [N, T] (the next token of each position).
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace dsgd::models
