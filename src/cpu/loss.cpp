// log_softmax and NLL of fc2's logits, with their gradient.
#include "kernels.hpp"

#include <cmath>

#include "mnist_mt/model.hpp"

namespace mnist_mt::cpu {
void log_softmax_nll(const float* logits, const std::uint8_t* labels, std::uint32_t batch, float denominator,
                     float* logp, float* dlogits, LossSums& sums) {
  for (std::uint32_t n = 0; n < batch; ++n) {
    const float* x = logits + n * kClasses;
    std::uint32_t best = 0;
    for (std::uint32_t k = 1; k < kClasses; ++k)
      if (x[k] > x[best]) best = k;
    double sum = 0;
    for (std::uint32_t k = 0; k < kClasses; ++k) sum += std::exp(double{x[k]} - double{x[best]});
    const double lse = double{x[best]} + std::log(sum);
    float* lp = logp + n * kClasses;
    float* d = dlogits + n * kClasses;
    for (std::uint32_t k = 0; k < kClasses; ++k) {
      lp[k] = static_cast<float>(double{x[k]} - lse);
      d[k] = (std::exp(lp[k]) - (k == labels[n] ? 1.0f : 0.0f)) / denominator;
    }
    sums.loss -= lp[labels[n]];
    sums.correct += best == labels[n] ? 1 : 0;
  }
}

}  // namespace mnist_mt::cpu
