// A model's parameters by name, copied, and the largest difference between two such copies: what
// the equivalence tests compare.
#pragma once

#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace dsgd::testing {

using Params = std::vector<std::pair<std::string, torch::Tensor>>;

inline Params params_of(const torch::nn::Module& m) {
  Params out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
  return out;
}

// Fails the test where the two lists differ in length or names.
inline double max_difference(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    worst = std::max(worst, (a[i].second - b[i].second).abs().max().item<double>());
  }
  return worst;
}

}  // namespace dsgd::testing
