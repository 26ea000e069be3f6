// Philox4x32-10, the dropout keep decisions and the parameter initialisation drawn from it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "golden/fixture.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/philox.hpp"

namespace mnist_mt {
namespace {

using testing::Fixture;
using testing::golden;

void expect_philox(const std::array<std::uint32_t, 4>& ctr, const std::array<std::uint32_t, 2>& key,
                   const std::array<std::uint32_t, 4>& want) {
  const Philox4 r = philox4x32_10(Philox4{{ctr[0], ctr[1], ctr[2], ctr[3]}}, key[0], key[1]);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], want[i]) << "word " << i << " of counter " << std::hex << ctr[0];
}

// Random123's kat_vectors, "philox4x32 10" lines.
TEST(Philox, Random123KnownAnswers) {
  expect_philox({0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  expect_philox({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
                {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  expect_philox({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
                {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

// Further vectors from gen_golden.py's implementation, written independently of philox.hpp.
TEST(Philox, MatchesIndependentImplementation) {
  const auto ctr = golden().get<std::uint32_t>("philox.counter");
  const auto key = golden().get<std::uint32_t>("philox.key");
  const auto out = golden().get<std::uint32_t>("philox.output");
  ASSERT_EQ(ctr.size(), out.size());
  ASSERT_EQ(key.size() * 2, ctr.size());
  for (std::size_t i = 0; i < ctr.size() / 4; ++i)
    expect_philox({ctr[4 * i], ctr[4 * i + 1], ctr[4 * i + 2], ctr[4 * i + 3]}, {key[2 * i], key[2 * i + 1]},
                  {out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]});
}

TEST(Philox, Uniform01IsInUnitInterval) {
  EXPECT_EQ(uniform01(0), 0.0f);
  EXPECT_EQ(uniform01(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
  EXPECT_LT(uniform01(0xffffffffu), 1.0f);
}

TEST(Dropout, MatchesIndependentImplementation) {
  const Fixture& g = golden();
  const auto seed = g.get<std::uint64_t>("dropout.seed");
  const auto epoch = g.get<std::uint32_t>("dropout.epoch");
  const auto sample = g.get<std::uint32_t>("dropout.sample");
  const auto stream = g.get<std::uint32_t>("dropout.stream");
  const auto element = g.get<std::uint32_t>("dropout.element");
  const auto p = g.get<float>("dropout.p");
  const auto keep = g.get<std::uint8_t>("dropout.keep");
  ASSERT_EQ(keep.size(), 256u);
  for (std::size_t i = 0; i < keep.size(); ++i)
    EXPECT_EQ(dropout_keep(seed[i], epoch[i], sample[i], static_cast<RandomStream>(stream[i]), element[i], p[i]),
              keep[i] != 0)
        << "case " << i;
}

// Keep fraction of `samples` x 9216 decisions.
double keep_rate(std::uint64_t seed, std::uint32_t epoch, RandomStream stream, float p, std::uint32_t samples) {
  std::size_t kept = 0;
  for (std::uint32_t s = 0; s < samples; ++s)
    for (std::uint32_t e = 0; e < 9216; ++e) kept += dropout_keep(seed, epoch, s, stream, e, p);
  return static_cast<double>(kept) / (static_cast<double>(samples) * 9216);
}

TEST(Dropout, KeepRateWithinThreeSigma) {
  constexpr std::uint32_t kSamples = 64;
  for (float p : {kDropout1, kDropout2, 0.1f, 0.9f}) {
    const double n = kSamples * 9216.0, sigma = std::sqrt(p * (1.0 - p) / n);
    for (RandomStream stream : {RandomStream::kDropout0, RandomStream::kDropout1}) {
      EXPECT_NEAR(keep_rate(42, 3, stream, p, kSamples), 1.0 - p, 3 * sigma) << "p " << p;
    }
  }
  EXPECT_EQ(keep_rate(1, 0, RandomStream::kDropout0, 0.0f, 2), 1.0);
}

std::vector<bool> mask(std::uint64_t seed, std::uint32_t epoch, std::uint32_t sample, RandomStream stream) {
  std::vector<bool> m(9216);
  for (std::uint32_t e = 0; e < m.size(); ++e) m[e] = dropout_keep(seed, epoch, sample, stream, e, 0.5f);
  return m;
}

double disagreement(const std::vector<bool>& a, const std::vector<bool>& b) {
  std::size_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  return static_cast<double>(diff) / static_cast<double>(a.size());
}

// Changing any part of the key gives an unrelated mask: two independent p=0.5 masks
// disagree on half the elements (sigma 0.0052 over 9216).
TEST(Dropout, MasksDependOnEveryPartOfTheKey) {
  const auto base = mask(7, 2, 1234, RandomStream::kDropout0);
  EXPECT_EQ(base, mask(7, 2, 1234, RandomStream::kDropout0));
  const std::vector<std::vector<bool>> others{
      mask(8, 2, 1234, RandomStream::kDropout0), mask(7ull | (1ull << 40), 2, 1234, RandomStream::kDropout0),
      mask(7, 3, 1234, RandomStream::kDropout0), mask(7, 2, 1235, RandomStream::kDropout0),
      mask(7, 2, 1234, RandomStream::kDropout1)};
  for (std::size_t i = 0; i < others.size(); ++i) EXPECT_NEAR(disagreement(base, others[i]), 0.5, 0.03) << "key " << i;
}

TEST(Init, MatchesIndependentImplementation) {
  const auto params = initial_parameters(std::stoull(golden().meta("init_seed")));
  const std::size_t stride = std::stoul(golden().meta("sample_stride"));
  for (const ParamInfo& p : kParams) {
    const auto want = golden().get<float>("init." + std::string(p.name));
    ASSERT_EQ(want.size(), (p.count + stride - 1) / stride) << p.name;
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(params[p.offset + i * stride], want[i]) << p.name << " " << i;
  }
}

// PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases alike.
TEST(Init, FollowsPyTorchDefaultDistribution) {
  const auto params = initial_parameters(99);
  const std::array<double, 4> fan_in{9, 288, 9216, 128};
  for (std::size_t i = 0; i < kParams.size(); ++i) {
    const ParamInfo& p = kParams[i];
    const auto bound = static_cast<float>(1.0 / std::sqrt(fan_in[i / 2]));
    double sum = 0, sum_sq = 0;
    float lo = bound, hi = -bound;
    for (std::size_t j = p.offset; j < p.offset + p.count; ++j) {
      lo = std::min(lo, params[j]);
      hi = std::max(hi, params[j]);
      sum += params[j];
      sum_sq += double{params[j]} * params[j];
    }
    EXPECT_GE(lo, -bound) << p.name;
    EXPECT_LT(hi, bound) << p.name;
    // Mean 0 and E[x^2] = bound^2/3 within 4 sigma of their sampling error
    // (Var x = b^2/3, Var x^2 = 4 b^4/45).
    const double n = static_cast<double>(p.count), b2 = double{bound} * bound;
    EXPECT_NEAR(sum / n, 0.0, 4 * std::sqrt(b2 / 3 / n)) << p.name;
    EXPECT_NEAR(sum_sq / n, b2 / 3, 4 * std::sqrt(4.0 / 45.0 / n) * b2) << p.name;
    if (p.count > 1000) {  // the range is filled
      EXPECT_LT(lo, -0.99f * bound) << p.name;
      EXPECT_GT(hi, 0.99f * bound) << p.name;
    }
  }
}

TEST(Init, SeedDeterminesParameters) {
  EXPECT_EQ(initial_parameters(5), initial_parameters(5));
  const auto a = initial_parameters(5), b = initial_parameters(6);
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  EXPECT_LT(same, a.size() / 1000);
}

TEST(Init, RejectsWrongBufferSize) {
  std::vector<float> small(kParamCount - 1);
  EXPECT_ANY_THROW(init_parameters(1, small));
}

}  // namespace
}  // namespace mnist_mt
