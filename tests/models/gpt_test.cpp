// The GPT decoder: GPT-2's parameter count, a forward equal to a plain per-head re-implementation
// from its own weights, causality, tied embeddings, and that it learns.
#include <gtest/gtest.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/normalization.h>
#include <torch/optim/adam.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/types.h>

#include <cmath>
#include <map>

#include "dsgd/common/error.h"
#include "dsgd/models/gpt.h"
#include "dsgd/apps/language_model.h"
#include "dsgd/models/registry.h"

namespace dsgd::models {
namespace {

TEST(Gpt, NamedSizesHaveGpt2sParameterCounts) {
  // GPT-2 small (the 124M model) at its vocabulary of 50257 tokens and context of 1024.
  EXPECT_EQ(parameter_count(*make_gpt(gpt_options("gpt-base", 50257))), 124439808);
  // 12 d^2 + 13 d a block, a final LayerNorm, position and (tied) token embeddings.
  EXPECT_EQ(parameter_count(*make_gpt(gpt_options("gpt-small", 4096))), 10745856 + 384 * 4096);
  EXPECT_EQ(parameter_count(*make_gpt(gpt_options("gpt-tiny", 256))), 809728 + 128 * 256);
  EXPECT_THROW(gpt_options("gpt-huge", 256), ConfigError);
  EXPECT_THROW(Gpt(GptOptions{.width = 130, .heads = 4}), ConfigError);
}

// The count without building the model: the built models' counts, and GPT-2's published ones
// for the shapes too large to build in a test (medium, large and XL: 1.4 to 6.2 GB of weights).
TEST(Gpt, TheParameterCountOfAShapeIsTheBuiltModelsAndGpt2s) {
  for (const auto& [name, vocab] : {std::pair{"gpt-tiny", 256}, {"gpt-small", 4096}, {"gpt-base", 256}}) {
    const auto o = gpt_options(name, vocab);
    EXPECT_EQ(gpt_parameters(o), parameter_count(*make_gpt(o))) << name;
  }
  EXPECT_EQ(gpt_parameters(gpt_options("gpt-base", 50257)), 124439808);
  EXPECT_EQ(gpt_parameters(gpt_options("gpt-medium", 50257)), 354823168);
  EXPECT_EQ(gpt_parameters(gpt_options("gpt-large", 50257)), 774030080);
  EXPECT_EQ(gpt_parameters(gpt_options("gpt-xl", 50257)), 1557611200);
  EXPECT_EQ(gpt_options("gpt-xl", 256).width % gpt_options("gpt-xl", 256).heads, 0);
}

// The model's forward, written out head by head from its own parameters: catches a wrong
// reshape of the fused QKV, a mask on the wrong side, a missing scale or residual.
torch::Tensor reference_forward(Gpt& gpt, const torch::Tensor& tokens) {
  std::map<std::string, torch::Tensor> p;
  for (const auto& kv : gpt.named_parameters()) p[kv.key()] = kv.value();
  const auto& o = gpt.options();
  const int64_t t = tokens.size(1), d = o.width, hd = d / o.heads;
  auto ln = [&](const torch::Tensor& x, const std::string& name) {
    return torch::layer_norm(x, {d}, p[name + ".weight"], p[name + ".bias"]);
  };
  auto x =
      p["wte.weight"].index_select(0, tokens.flatten()).view({tokens.size(0), t, d}) + p["wpe.weight"].slice(0, 0, t);
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    const auto h = ln(x, b + "ln1");
    const auto qkv = torch::addmm(p[b + "attn.qkv.bias"], h.reshape({-1, d}), p[b + "attn.qkv.weight"].t());
    const auto q = qkv.slice(1, 0, d), k = qkv.slice(1, d, 2 * d), v = qkv.slice(1, 2 * d, 3 * d);
    std::vector<torch::Tensor> heads;
    for (int64_t n = 0; n < tokens.size(0); ++n) {
      std::vector<torch::Tensor> per_head;
      for (int64_t i = 0; i < o.heads; ++i) {
        auto part = [&](const torch::Tensor& m) {
          return m.slice(0, n * t, (n + 1) * t).slice(1, i * hd, (i + 1) * hd);
        };
        auto s = part(q).matmul(part(k).t()) / std::sqrt(static_cast<double>(hd));
        for (int64_t r = 0; r < t; ++r) s[r].slice(0, r + 1, t).fill_(-INFINITY);  // row r sees 0..r
        per_head.push_back(torch::softmax(s, 1).matmul(part(v)));
      }
      heads.push_back(torch::cat(per_head, 1));
    }
    const auto att = torch::cat(heads, 0);
    x = x + torch::addmm(p[b + "attn.proj.bias"], att, p[b + "attn.proj.weight"].t()).view_as(x);
    const auto h2 = ln(x, b + "ln2").reshape({-1, d});
    const auto f = torch::gelu(torch::addmm(p[b + "fc.bias"], h2, p[b + "fc.weight"].t()), "tanh");
    x = x + torch::addmm(p[b + "fc_proj.bias"], f, p[b + "fc_proj.weight"].t()).view_as(x);
  }
  return ln(x, "ln_f").matmul(p["wte.weight"].t());
}

TEST(Gpt, ForwardEqualsAHeadByHeadReference) {
  torch::manual_seed(3);
  Gpt gpt(GptOptions{.vocab_size = 50, .context = 16, .layers = 2, .width = 32, .heads = 4});
  torch::NoGradGuard no_grad;
  for (auto& p : gpt.parameters()) p.add_(torch::randn_like(p) * 0.05);  // LayerNorms and biases too
  const auto tokens = torch::randint(0, 50, {3, 11}, torch::kInt64);
  const auto logits = gpt.forward(tokens);
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{3, 11, 50}));
  const double diff = (logits - reference_forward(gpt, tokens)).abs().max().item<double>();
  EXPECT_LT(diff, 1e-4) << "the forward differs from the per-head reference";
}

// Past 128 tokens the attention goes a block of queries at a time (4 blocks of 64-65 here, the
// last ones uneven): the logits and every gradient still equal the per-head reference's.
TEST(Gpt, BlocksOfQueriesGiveTheReferencesLogitsAndGradients) {
  torch::manual_seed(4);
  Gpt gpt(GptOptions{.vocab_size = 30, .context = 300, .layers = 1, .width = 16, .heads = 2});
  {
    torch::NoGradGuard no_grad;
    for (auto& p : gpt.parameters()) p.add_(torch::randn_like(p) * 0.05);
  }
  const auto tokens = torch::randint(0, 30, {2, 259}, torch::kInt64);
  const auto weights = torch::randn({2, 259, 30});
  auto grads = [&](const torch::Tensor& logits) {
    for (auto& p : gpt.parameters()) p.mutable_grad() = torch::Tensor();
    (logits * weights).sum().backward();
    std::vector<torch::Tensor> out;
    for (const auto& p : gpt.parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto logits = gpt.forward(tokens);
  const auto reference = reference_forward(gpt, tokens);
  EXPECT_LT((logits - reference).abs().max().item<double>(), 1e-4);
  const auto ours = grads(logits), theirs = grads(reference);
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_LT((ours[i] - theirs[i]).abs().max().item<double>(), 1e-4) << "parameter " << i;
  }
}

TEST(Gpt, APositionSeesOnlyTheTokensBeforeIt) {
  torch::manual_seed(5);
  Gpt gpt(GptOptions{.vocab_size = 40, .context = 12, .layers = 2, .width = 16, .heads = 2});
  torch::NoGradGuard no_grad;
  const auto a = torch::randint(0, 40, {2, 12}, torch::kInt64);
  auto b = a.clone();
  b.select(1, 7).copy_((a.select(1, 7) + 1).remainder(40));  // another token at position 7
  const auto la = gpt.forward(a), lb = gpt.forward(b);
  EXPECT_EQ((la.slice(1, 0, 7) - lb.slice(1, 0, 7)).abs().max().item<double>(), 0.0) << "the past saw the future";
  EXPECT_GT((la.slice(1, 7) - lb.slice(1, 7)).abs().max().item<double>(), 1e-4) << "position 7 on did not see it";
  EXPECT_THROW(gpt.forward(torch::zeros({1, 13}, torch::kInt64)), ConfigError);  // past the context
  EXPECT_THROW(gpt.forward(torch::zeros({1, 4})), ConfigError);                  // not token ids
}

TEST(Gpt, TheOutputLayerIsTheTokenEmbedding) {
  Gpt gpt(gpt_options("gpt-tiny", 64));
  const auto names = gpt.named_parameters().keys();
  EXPECT_EQ(std::count_if(names.begin(), names.end(), [](const std::string& n) { return n.find("head") != n.npos; }),
            0);
  const auto tokens = torch::randint(0, 64, {2, 8}, torch::kInt64);
  next_token_loss(gpt.forward(tokens), tokens).backward();
  // Rows of tokens never in the input still get a gradient: through the output layer.
  const auto grad = gpt.named_parameters()["wte.weight"].grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_EQ(grad.abs().sum(1).gt(0).sum().item<int64_t>(), 64);
}

TEST(Gpt, LearnsARepeatingSequence) {
  torch::manual_seed(9);
  Gpt gpt(GptOptions{.vocab_size = 16, .context = 32, .layers = 2, .width = 32, .heads = 4});
  torch::optim::Adam opt(gpt.parameters(), torch::optim::AdamOptions(3e-3));
  const auto seq = torch::arange(0, 33, torch::kInt64).remainder(7).unsqueeze(0).repeat({4, 1});  // 0..6, 0..6, ...
  const auto in = seq.slice(1, 0, 32), target = seq.slice(1, 1, 33);
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    opt.zero_grad();
    auto loss = next_token_loss(gpt.forward(in), target);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_GT(first, 2.0);  // about ln 16 at the start
  EXPECT_LT(last, 0.1) << "from " << first;
}

// `dsgd train` reports a language model's FLOPs as 6 N a token (kTrainingFlopsPerParameterToken;
// N its parameters: 2 N for the forward's multiply-adds, 4 N for the backward's), the usual
// estimate. Here LibTorch's profiler counts instead what one training step of gpt-tiny at its
// full context computes (the FLOPs of every matrix product, forward and backward, and of
// element-wise adds and multiplies): it must be within 25% of the estimate. Attention's products
// (which 6 N leaves out, growing with the context) and the embeddings' rows (parameters that cost
// no product but the tied output layer's) are what separate the two.
TEST(Gpt, SixFlopsAParameterATokenIsWhatATrainingStepComputes) {
  torch::manual_seed(3);
  auto gpt = make_gpt(gpt_options("gpt-tiny", 256));
  const int64_t batch = 2, context = gpt->options().context;
  const auto tokens = torch::randint(256, {batch, context + 1}, torch::kInt64);
  double parameters = 0;
  for (const auto& p : gpt->parameters()) parameters += static_cast<double>(p.numel());
  namespace prof = torch::autograd::profiler;
  double counted = 0;
  {
    prof::TLSLegacyProfilerGuard guard(
        torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU, /*report_input_shapes=*/true,
                                              /*profile_memory=*/false, /*with_stack=*/false, /*with_flops=*/true),
        [&](const prof::thread_event_lists& lists) {
          for (const auto& events : lists) {
            for (auto e : events) counted += static_cast<double>(e.flops());  // flops() is not const
          }
        });
    next_token_loss(gpt->forward(tokens.slice(1, 0, context)), tokens.slice(1, 1, context + 1)).backward();
  }
  const double estimate = kTrainingFlopsPerParameterToken * parameters * static_cast<double>(batch * context);
  std::printf("gpt-tiny, %lld tokens: the profiler counted %.4g FLOPs, the estimate %.4g (%.3fx)\n",
              static_cast<long long>(batch * context), counted, estimate, counted / estimate);
  EXPECT_GT(counted, 0.75 * estimate);
  EXPECT_LT(counted, 1.25 * estimate);
}

}  // namespace
}  // namespace dsgd::models
