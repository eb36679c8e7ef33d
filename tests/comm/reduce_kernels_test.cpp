// Element-wise kernels, above all the 16-bit conversions and their float32 accumulation.
#include "comm/reduce_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "dsgd/common/error.h"

namespace dsgd::comm {
namespace {

TEST(ReduceKernels, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.0f)), 1.0f);
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.0f + 0x1p-8f)), 1.0f);               // tie -> even
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);  // tie -> even
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(NAN))));
  EXPECT_TRUE(std::isinf(bfloat16_to_float(float_to_bfloat16(INFINITY))));
}

TEST(ReduceKernels, HalfRoundTripsAndSaturatesToInfinity) {
  EXPECT_EQ(half_to_float(float_to_half(0.5f)), 0.5f);
  EXPECT_EQ(half_to_float(float_to_half(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(half_to_float(float_to_half(1e6f))));
  EXPECT_NEAR(half_to_float(float_to_half(1.0f / 3)), 1.0f / 3, 1e-3);
}

TEST(ReduceKernels, ReduceManyAccumulatesSixteenBitInFloat32) {
  // 256 + 1 + 1 in bfloat16 (spacing 2 at 256): pairwise rounding loses both ones (256), one
  // float32 accumulation keeps them (258).
  for (auto type : {DataType::kBFloat16}) {
    std::vector<uint16_t> dst = {float_to_bfloat16(256.0f)};
    const std::vector<uint16_t> one = {float_to_bfloat16(1.0f)};
    const void* srcs[] = {one.data(), one.data()};
    reduce_many(dst.data(), srcs, 2, 1, type, ReduceOp::kSum, 1);
    EXPECT_EQ(bfloat16_to_float(dst[0]), 258.0f);
    std::vector<uint16_t> pairwise = {float_to_bfloat16(256.0f)};
    reduce_into(pairwise.data(), one.data(), 1, type, ReduceOp::kSum);
    reduce_into(pairwise.data(), one.data(), 1, type, ReduceOp::kSum);
    EXPECT_EQ(bfloat16_to_float(pairwise[0]), 256.0f);
  }
}

TEST(ReduceKernels, WideTypesSumMaxAndDivide) {
  std::vector<float> a = {1, 5, -3}, b = {2, 2, 2};
  reduce_into(a.data(), b.data(), 3, DataType::kFloat32, ReduceOp::kMax);
  EXPECT_EQ(a, (std::vector<float>{2, 5, 2}));
  std::vector<int64_t> i = {7, 9}, j = {1, 1};
  const void* srcs[] = {j.data()};
  reduce_many(i.data(), srcs, 1, 2, DataType::kInt64, ReduceOp::kSum, 3);
  EXPECT_EQ(i, (std::vector<int64_t>{2, 3}));  // (7+1)/3, (9+1)/3: integer division
}

// Every length through the vector body and its tail, a bad value at every kind of position.
TEST(ReduceKernels, AllFiniteFindsAnyNanOrInfinity) {
  const float bad[] = {std::nanf(""), -std::nanf(""), INFINITY, -INFINITY};
  for (size_t n : {1u, 7u, 8u, 9u, 37u, 1000u}) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) - 3.5f;
    v[0] = 3.4e38f;  // the largest floats are finite
    v[n - 1] = -3.4e38f;
    ASSERT_TRUE(all_finite(v.data(), n)) << n;
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      for (float b : bad) {
        auto w = v;
        w[at] = b;
        EXPECT_FALSE(all_finite(w.data(), n)) << n << " " << b << " at " << at;
      }
    }
  }
  EXPECT_TRUE(all_finite(nullptr, 0));
}

TEST(ReduceKernels, CopyScaledBelowCopiesAndComparesEveryMagnitude) {
  for (size_t n : {1u, 9u, 37u, 1000u}) {
    std::vector<float> src(n), dst(n);
    for (size_t i = 0; i < n; ++i) src[i] = (i % 2 ? -1.0f : 1.0f) * static_cast<float>(i) / 8;
    ASSERT_TRUE(copy_scaled_below(dst.data(), src.data(), n, 3.0f, 1e6f)) << n;
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(dst[i], src[i] * 3.0f) << n << " at " << i;
    for (float bad : {std::nanf(""), INFINITY, -INFINITY, 1e6f, -2e6f}) {
      auto s = src;
      s[n - 1] = bad;
      EXPECT_FALSE(copy_scaled_below(dst.data(), s.data(), n, 1.0f, 1e6f)) << n << " " << bad;
      EXPECT_FALSE(copy_scaled_below(s.data(), s.data(), n, 1.0f, 1e6f)) << "in place, " << n << " " << bad;
    }
    auto s = src;
    s[0] = 4e5f;  // below the limit, not once scaled
    EXPECT_TRUE(copy_scaled_below(dst.data(), s.data(), n, 1.0f, 1e6f));
    EXPECT_FALSE(copy_scaled_below(dst.data(), s.data(), n, 3.0f, 1e6f));
  }
}

TEST(ReduceKernels, AddIntoFiniteAddsAndChecksTheSums) {
  for (size_t n : {1u, 9u, 37u, 1000u}) {
    std::vector<float> dst(n), src(n);
    for (size_t i = 0; i < n; ++i) {
      dst[i] = 0.1f * static_cast<float>(i);
      src[i] = 1.0f / static_cast<float>(i + 3);
    }
    auto expected = dst;
    for (size_t i = 0; i < n; ++i) expected[i] += src[i];
    ASSERT_TRUE(add_into_finite(dst.data(), src.data(), n)) << n;
    EXPECT_EQ(dst, expected) << n;
    for (float bad : {std::nanf(""), INFINITY}) {
      auto d = dst, s = src;
      s[n - 1] = bad;  // a bad value in either input, or made by the sum, is found
      EXPECT_FALSE(add_into_finite(d.data(), s.data(), n)) << n << " " << bad;
      d = dst;
      d[n / 2] = bad;
      EXPECT_FALSE(add_into_finite(d.data(), src.data(), n)) << n << " " << bad;
    }
  }
  std::vector<float> big = {3e38f}, more = {3e38f};
  EXPECT_FALSE(add_into_finite(big.data(), more.data(), 1));  // overflows to infinity
}

// Error feedback, for both wires and across the vectorised body and its scalar tail: what was
// sent plus the new residual is exactly what there was to send (the gradient plus the old
// residual, in float32), element by element; a value beyond float16's range saturates, its
// excess kept; a NaN or infinity is sent as it is and leaves the residual alone.
TEST(ReduceKernels, EncodeSixteenBitSentPlusNewResidualIsGradientPlusOldResidual) {
  for (DataType wire : {DataType::kFloat16, DataType::kBFloat16}) {
    const size_t n = 1003;  // not a multiple of 8: the tail too
    std::vector<float> grad(n), residual(n), old(n);
    for (size_t i = 0; i < n; ++i) {
      grad[i] = std::sin(static_cast<float>(i)) * std::pow(10.0f, static_cast<float>(i % 7) - 4.0f);
      residual[i] = std::cos(static_cast<float>(i)) * 1e-4f;
    }
    grad[5] = 1e6f;  // beyond float16
    grad[17] = NAN;
    grad[18] = INFINITY;
    old = residual;
    std::vector<uint16_t> out(n);
    encode_16(grad.data(), residual.data(), out.data(), n, wire);
    std::vector<float> sent(n);
    decode_16(out.data(), sent.data(), n, wire, /*accumulate=*/false);
    for (size_t i = 0; i < n; ++i) {
      if (i == 17 || i == 18) continue;
      ASSERT_EQ(sent[i] + residual[i], grad[i] + old[i]) << to_string(wire) << " element " << i;
      // Rounded to a neighbour: the new residual is within the gap to the next 16-bit value.
      auto value = [&](uint16_t c) { return wire == DataType::kFloat16 ? half_to_float(c) : bfloat16_to_float(c); };
      const uint16_t c = out[i];
      float gap = std::fabs(value(static_cast<uint16_t>(c + 1)) - sent[i]);
      if ((c & 0x7fff) != 0) gap = std::max(gap, std::fabs(sent[i] - value(static_cast<uint16_t>(c - 1))));
      if (i != 5) {
        ASSERT_LE(std::fabs(residual[i]), gap) << to_string(wire) << " element " << i;
      }
    }
    if (wire == DataType::kFloat16) {
      EXPECT_EQ(sent[5], 65504.0f);
    }
    EXPECT_TRUE(std::isnan(sent[17]));
    EXPECT_TRUE(std::isinf(sent[18]));
    EXPECT_EQ(residual[17], old[17]);
    EXPECT_EQ(residual[18], old[18]);
    // Without a residual: plain rounding, as the one-value conversions round.
    encode_16(grad.data(), nullptr, out.data(), n, wire);
    for (size_t i = 0; i < n; ++i) {
      if (i == 5 || i == 17) continue;
      ASSERT_EQ(out[i], wire == DataType::kFloat16 ? float_to_half(grad[i]) : float_to_bfloat16(grad[i])) << i;
    }
    // decode_16 accumulates in float32.
    std::vector<float> acc(n, 1.0f), plain(n);
    decode_16(out.data(), acc.data(), n, wire, /*accumulate=*/true);
    decode_16(out.data(), plain.data(), n, wire, /*accumulate=*/false);
    for (size_t i = 0; i < n; ++i) {
      if (i != 17) {
        ASSERT_EQ(acc[i], 1.0f + plain[i]) << i;
      }
    }
  }
  std::vector<uint16_t> out(1);
  float x = 1;
  EXPECT_THROW(encode_16(&x, nullptr, out.data(), 1, DataType::kFloat32), Error);
}

}  // namespace
}  // namespace dsgd::comm
