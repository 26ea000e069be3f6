// PyTorch's default initialisation of Conv2d and Linear, drawn from Philox so that every
// backend and world size starts from the same weights for a given seed.
#include <cmath>
#include <string>

#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/philox.hpp"

namespace mnist_mt {
namespace {

// fan_in of a weight of PyTorch shape [out, in, kh, kw] or [out, in].
std::int64_t fan_in(const ParamInfo& weight) {
  std::int64_t fan = 1;
  for (int d = 1; d < weight.dims; ++d) fan *= weight.shape[d];
  return fan;
}

}  // namespace

void init_parameters(std::uint64_t seed, std::span<float> params) {
  if (params.size() != kParamCount)
    throw RuntimeFailure("init_parameters: buffer of " + std::to_string(params.size()) + " floats, expected " +
                         std::to_string(kParamCount));
  const auto k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (std::uint32_t index = 0; index < kParams.size(); ++index) {
    const ParamInfo& param = kParams[index];
    // kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the bias of a
    // layer uses its weight's fan_in.
    const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in(kParams[index & ~1u]))));
    float* out = params.data() + param.offset;
    Philox4 r{};
    for (std::uint32_t i = 0; i < param.count; ++i) {
      if ((i & 3u) == 0)
        r = philox4x32_10(Philox4{{i >> 2, index, static_cast<std::uint32_t>(RandomStream::kInit), 0}}, k0, k1);
      // 2u-1 is exact in fp32, so one rounding of the product keeps the value in [-bound, bound).
      out[i] = (2.0f * uniform01(r.v[i & 3u]) - 1.0f) * bound;
    }
  }
}

std::vector<float> initial_parameters(std::uint64_t seed) {
  std::vector<float> params(kParamCount);
  init_parameters(seed, params);
  return params;
}

}  // namespace mnist_mt
