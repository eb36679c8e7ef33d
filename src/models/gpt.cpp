#include "dsgd/models/gpt.h"

#include <torch/autograd.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/version.h>

#include "dsgd/torch/activation_checkpoint.h"
#include "dsgd/torch/parameter_gate.h"
#if TORCH_VERSION_MAJOR >= 2
#include <ATen/ops/scaled_dot_product_attention.h>  // LibTorch 2's fused attention (Debian's 1.13 has none)
#define DSGD_FUSED_ATTENTION 1
#endif

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "dsgd/common/error.h"

namespace dsgd::models {
namespace {

#ifndef DSGD_FUSED_ATTENTION
// The scores of queries [q0, q1) for keys [0, q1): mask + q k^T x scale in one pass (baddbmm).
torch::Tensor block_scores(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& mask, double scale,
                           int64_t q0, int64_t q1) {
  return torch::baddbmm(mask.slice(0, q0, q1).slice(1, 0, q1), q.slice(1, q0, q1), k.slice(1, 0, q1).transpose(1, 2),
                        /*beta=*/1.0, /*alpha=*/scale);
}

// Causal attention a block of queries at a time, with a backward of its own: q, k, v [B, T, d]
// (B = N H) -> [B, T, d]. Queries [q0, q1) see keys [0, q1) only, so the blocks above the
// diagonal (where the mask holds -inf) are neither computed nor stored. The backward adds each
// block's key and value gradients into one tensor in place: autograd's own, through the slices,
// made a zeroed full-size gradient a block and summed them (2% of a gpt-small step).
struct BlockedCausalAttention : torch::autograd::Function<BlockedCausalAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& mask, double scale, int64_t blocks) {
    const int64_t t = q.size(1);
    torch::autograd::variable_list saved{q, k, v};
    std::vector<torch::Tensor> ys;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t q0 = b * t / blocks, q1 = (b + 1) * t / blocks;
      saved.push_back(torch::softmax(block_scores(q, k, mask, scale, q0, q1), -1));
      ys.push_back(torch::bmm(saved.back(), v.slice(1, 0, q1)));
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["blocks"] = blocks;
    return blocks == 1 ? ys[0] : torch::cat(ys, 1);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2];
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t blocks = ctx->saved_data["blocks"].toInt(), t = q.size(1);
    const auto& dy = grads[0];
    auto dq = torch::empty_like(q), dk = torch::zeros_like(k), dv = torch::zeros_like(v);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t q0 = b * t / blocks, q1 = (b + 1) * t / blocks;
      const auto& p = saved[static_cast<size_t>(3 + b)];
      const auto dyb = dy.slice(1, q0, q1);
      dv.slice(1, 0, q1).add_(torch::bmm(p.transpose(1, 2), dyb));
      const auto dp = torch::bmm(dyb, v.slice(1, 0, q1).transpose(1, 2));
      const auto ds = torch::_softmax_backward_data(dp, p, -1, p.scalar_type());  // through the softmax
      dq.slice(1, q0, q1).copy_(torch::bmm(ds, k.slice(1, 0, q1)).mul_(scale));
      dk.slice(1, 0, q1).add_(torch::bmm(ds.transpose(1, 2), q.slice(1, q0, q1)), scale);
    }
    return {dq, dk, dv, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
#endif

// Causal self-attention: one fused QKV projection, every head in one batched matmul.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const GptOptions& o)
      : heads_(o.heads),
        qkv_(register_module("qkv", torch::nn::Linear(o.width, 3 * o.width))),
        proj_(register_module("proj", torch::nn::Linear(o.width, o.width))),
        attn_drop_(register_module("attn_drop", torch::nn::Dropout(o.dropout))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t n = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads_;
    // [N, T, 3D] -> [3, N, H, T, D/H]
    const auto qkv = qkv_(x).view({n, t, 3, heads_, hd}).permute({2, 0, 3, 1, 4});
#ifdef DSGD_FUSED_ATTENTION
    const auto q = qkv[0], k = qkv[1], v = qkv[2];
    // The same function in one kernel where LibTorch has one (flash or memory-efficient attention on
    // a GPU): no [T, T] scores in memory.
    const double p = is_training() ? attn_drop_->options.p() : 0.0;
    const auto fused = at::scaled_dot_product_attention(q, k, v, {}, p, /*is_causal=*/true);
    return proj_(fused.transpose(1, 2).reshape({n, t, d}));
#else
    // Heads as one batch: [N H, T, D/H].
    const auto q = qkv[0].reshape({n * heads_, t, hd}), k = qkv[1].reshape({n * heads_, t, hd});
    const auto v = qkv[2].reshape({n * heads_, t, hd});
    // Scores in blocks of at least 64 queries, at most 8 (4 at gpt-small's 256 tokens: 3/8 of the
    // scores never computed). Against matmul, a multiply and masked_fill on every score, with
    // autograd's backward: a gpt-small step 11-16% faster on one core.
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    const auto& mask = causal(t, x);
    const int64_t blocks = std::clamp<int64_t>(t / 64, 1, 8);
    torch::Tensor y;
    if (!is_training() || attn_drop_->options.p() == 0) {
      y = BlockedCausalAttention::apply(q, k, v, mask, scale, blocks);
    } else {  // dropout on the attention weights: the same blocks through autograd
      std::vector<torch::Tensor> ys;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t q0 = b * t / blocks, q1 = (b + 1) * t / blocks;
        const auto att = attn_drop_(torch::softmax(block_scores(q, k, mask, scale, q0, q1), -1));
        ys.push_back(torch::bmm(att, v.slice(1, 0, q1)));
      }
      y = torch::cat(ys, 1);
    }
    y = y.view({n, heads_, t, hd}).transpose(1, 2).reshape({n, t, d});
    return proj_(y);  // heads side by side again
#endif
  }

  torch::nn::Linear& proj() { return proj_; }

 private:
  // 0 on and below the diagonal, -inf above it (the positions a query must not see), added to the
  // scores. Made once per length, device and type (not a buffer: nothing to synchronise or
  // checkpoint).
  const torch::Tensor& causal(int64_t t, const torch::Tensor& like) {
    auto& m = masks_[{t, like.device().str() + "/" + c10::toString(like.scalar_type())}];
    if (!m.defined()) {
      const auto future = torch::ones({t, t}, torch::TensorOptions(torch::kBool).device(like.device())).triu(1);
      m = torch::zeros({t, t}, like.options()).masked_fill(future, -std::numeric_limits<double>::infinity());
    }
    return m;
  }

  int64_t heads_;
  torch::nn::Linear qkv_, proj_;
  torch::nn::Dropout attn_drop_;
  std::map<std::pair<int64_t, std::string>, torch::Tensor> masks_;
};
TORCH_MODULE(Attention);

// Pre-LayerNorm block: x + attention(ln(x)), then x + mlp(ln(x)).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptOptions& o)
      : ln1_(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.width})))),
        attn_(register_module("attn", Attention(o))),
        ln2_(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.width})))),
        fc_(register_module("fc", torch::nn::Linear(o.width, 4 * o.width))),
        fc_proj_(register_module("fc_proj", torch::nn::Linear(4 * o.width, o.width))),
        drop_(register_module("drop", torch::nn::Dropout(o.dropout))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = x + drop_(attn_(ln1_(x)));
    return x + drop_(fc_proj_(torch::gelu(fc_(ln2_(x)), "tanh")));
  }

  // The two projections into the residual stream (GPT-2 scales their initial weights).
  std::vector<torch::Tensor> residual_projections() { return {attn_->proj()->weight, fc_proj_->weight}; }

 private:
  torch::nn::LayerNorm ln1_;
  Attention attn_;
  torch::nn::LayerNorm ln2_;
  torch::nn::Linear fc_, fc_proj_;
  torch::nn::Dropout drop_;
};
TORCH_MODULE(Block);

void check(const GptOptions& o) {
  if (o.vocab_size < 1 || o.context < 1 || o.layers < 1 || o.width < 1 || o.heads < 1 || o.width % o.heads != 0 ||
      !(o.dropout >= 0 && o.dropout < 1)) {
    throw ConfigError(
        "gpt: needs vocab_size, context, layers, width, heads >= 1, width a multiple of heads and "
        "dropout in [0, 1); got vocab_size " +
        std::to_string(o.vocab_size) + ", context " + std::to_string(o.context) + ", layers " +
        std::to_string(o.layers) + ", width " + std::to_string(o.width) + ", heads " + std::to_string(o.heads) +
        ", dropout " + std::to_string(o.dropout));
  }
}

}  // namespace

struct Gpt::Impl {
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};

GptOptions gpt_options(const std::string& name, int64_t vocab_size) {
  GptOptions o;
  o.vocab_size = vocab_size;
  if (name == "gpt-tiny") {
    o.layers = 4, o.width = 128, o.heads = 4, o.context = 128;
  } else if (name == "gpt-small") {
    o.layers = 6, o.width = 384, o.heads = 6, o.context = 256;
  } else if (name == "gpt-base") {
    o.layers = 12, o.width = 768, o.heads = 12, o.context = 1024;
  } else if (name == "gpt-medium") {
    o.layers = 24, o.width = 1024, o.heads = 16, o.context = 1024;
  } else if (name == "gpt-large") {
    o.layers = 36, o.width = 1280, o.heads = 20, o.context = 1024;
  } else if (name == "gpt-xl") {
    o.layers = 48, o.width = 1600, o.heads = 25, o.context = 1024;
  } else {
    throw ConfigError("unknown GPT size '" + name + "'; use gpt-tiny, gpt-small, gpt-base, gpt-medium, gpt-large " +
                      "or gpt-xl");
  }
  return o;
}

int64_t gpt_parameters(const GptOptions& o) {
  const int64_t w = o.width;
  // Each block: two LayerNorms (2w each), the fused QKV (3w^2 + 3w), the attention's projection
  // (w^2 + w), the MLP's two layers (4w^2 + 4w, 4w^2 + w).
  const int64_t block = 12 * w * w + 13 * w;
  return o.vocab_size * w + o.context * w + o.layers * block + 2 * w;  // embeddings (tied), blocks, ln_f
}

Gpt::Gpt(const GptOptions& options) : options_(options), impl_(std::make_shared<Impl>()) {
  check(options_);
  auto& m = *impl_;
  m.wte = register_module("wte", torch::nn::Embedding(options_.vocab_size, options_.width));
  m.wpe = register_module("wpe", torch::nn::Embedding(options_.context, options_.width));
  m.drop = register_module("drop", torch::nn::Dropout(options_.dropout));
  m.blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t l = 0; l < options_.layers; ++l) m.blocks->push_back(Block(options_));
  m.ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({options_.width})));

  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    if (p.key().find("ln") != std::string::npos) continue;  // LayerNorms keep weight 1, bias 0
    if (p.value().dim() == 1) {
      p.value().zero_();  // biases
    } else {
      p.value().normal_(0.0, 0.02);
    }
  }
  const double scaled = 0.02 / std::sqrt(2.0 * static_cast<double>(options_.layers));
  for (const auto& b : *m.blocks) {
    for (auto& w : b->as<BlockImpl>()->residual_projections()) w.normal_(0.0, scaled);
  }
}

torch::Tensor Gpt::forward(const torch::Tensor& tokens) {
  if (tokens.dim() != 2 || tokens.scalar_type() != torch::kInt64 || tokens.size(1) > options_.context) {
    throw ConfigError("gpt: tokens must be int64 [N, T] with T <= context (" + std::to_string(options_.context) +
                      "), got " + std::string(c10::toString(tokens.scalar_type())) + " of " +
                      std::to_string(tokens.dim()) + " dimensions" +
                      (tokens.dim() == 2 ? ", T = " + std::to_string(tokens.size(1)) : std::string()));
  }
  auto& m = *impl_;
  const auto positions = torch::arange(tokens.size(1), torch::TensorOptions(torch::kInt64).device(tokens.device()));
  // Each unit named before it runs (dsgd/torch/parameter_gate.h: the forward overlap's waits,
  // ZeRO stage 3's gathers): the embeddings, each block, the last norm with the output layer.
  wait_for_parameters(*m.wte);
  auto x = m.wte(tokens);
  wait_for_parameters(*m.wpe);
  x = m.drop(x + m.wpe(positions));
  for (const auto& b : *m.blocks) {
    wait_for_parameters(*b);
    auto* block = b->as<BlockImpl>();  // checkpointed: step.activation_checkpointing
    x = run_checkpointed(*b, x, [block](const torch::Tensor& in) { return block->forward(in); });
  }
  wait_for_parameters(*m.ln_f);
  wait_for_parameters(m.wte->weight);
  return torch::nn::functional::linear(m.ln_f(x), m.wte->weight);  // the output layer is the embedding
}

std::shared_ptr<Gpt> make_gpt(const GptOptions& options) { return std::make_shared<Gpt>(options); }

torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

}  // namespace dsgd::models
