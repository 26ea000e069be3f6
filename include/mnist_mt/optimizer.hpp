#pragma once
// The optimizers, with torch.optim's semantics (PyTorch 2.x, single-tensor updates): SGD
// (momentum, dampening 0, Nesterov on request), Adam, AdamW and Adadelta. Each update's
// scalars are computed in double and rounded to float once, as PyTorch computes them in
// Python floats and hands them to its tensor ops; each element's update is one function
// that both backends build (MNIST_MT_HD), in PyTorch's order of operations.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "mnist_mt/host_device.hpp"

namespace mnist_mt {

enum class OptimizerKind : std::uint8_t { kSgd, kAdam, kAdamW, kAdadelta };

// "sgd", "adam", "adamw", "adadelta": the CLI's and the checkpoint's names.
inline std::string_view optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kAdadelta: return "adadelta";
  }
  return "";
}
inline std::optional<OptimizerKind> parse_optimizer(std::string_view name) {
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kAdadelta})
    if (optimizer_name(k) == name) return k;
  return std::nullopt;
}

// The first three members keep the order of the old SgdOptions{lr, momentum, decay}.
struct OptimizerOptions {
  double lr = 0.01;
  double momentum = 0.0;      // SGD
  double weight_decay = 0.0;  // added to the gradient; AdamW: decoupled, p *= 1 - lr*wd
  bool nesterov = false;      // SGD, with momentum > 0
  OptimizerKind kind = OptimizerKind::kSgd;
  double beta1 = 0.9;         // Adam, AdamW
  double beta2 = 0.999;       // Adam, AdamW
  double eps = 1e-8;          // Adam, AdamW, Adadelta
  double rho = 0.9;           // Adadelta
};

// What a schedule sets for one update (torch.optim.lr_scheduler): the learning rate, and
// the momentum that OneCycleLR cycles (SGD's momentum, Adam's beta1; unused by Adadelta).
struct UpdateValues {
  double lr = 0;
  double momentum = 0;
};
MNIST_MT_HD UpdateValues base_values(const OptimizerOptions& o) {
  switch (o.kind) {
    case OptimizerKind::kSgd: return {o.lr, o.momentum};
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: return {o.lr, o.beta1};
    case OptimizerKind::kAdadelta: break;
  }
  return {o.lr, 0.0};
}
// The options with a schedule's values for one update.
inline OptimizerOptions with_values(OptimizerOptions o, UpdateValues v) {
  o.lr = v.lr;
  if (o.kind == OptimizerKind::kSgd) o.momentum = v.momentum;
  if (o.kind == OptimizerKind::kAdam || o.kind == OptimizerKind::kAdamW) o.beta1 = v.momentum;
  return o;
}

// The state buffers of each optimizer (kParamCount floats each), under PyTorch's names
// (optimizer.state_dict()["state"][i]).
inline int state_buffers(OptimizerKind kind) { return kind == OptimizerKind::kSgd ? 1 : 2; }
inline const char* state_name(OptimizerKind kind, int buffer) {
  switch (kind) {
    case OptimizerKind::kSgd: return "momentum_buffer";
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: return buffer == 0 ? "exp_avg" : "exp_avg_sq";
    case OptimizerKind::kAdadelta: return buffer == 0 ? "square_avg" : "acc_delta";
  }
  return "";
}

// A host copy of an optimizer's state: its buffers, state_buffers(kind) of them, and
// the updates applied so far (Adam's "step"; SGD's buffer starts at the first).
struct OptimizerState {
  std::vector<float> first, second;  // kParamCount floats each, or empty
  std::uint64_t applied = 0;
};

// One update's scalars, from the options, the schedule's values and the updates applied
// before it.
struct UpdateScalars {
  float lr = 0;            // SGD, Adadelta: the learning rate; Adam: lr / (1 - beta1^t)
  float momentum = 0;      // SGD: the buffer's factor
  float weight_decay = 0;  // added to the gradient (not AdamW's)
  float decay = 1;         // AdamW: 1 - lr*wd
  float average = 0;       // Adam: the first moment's lerp weight 1 - beta1
  float keep = 0;          // Adam: beta2; Adadelta: rho
  float add = 0;           // Adam: 1 - beta2; Adadelta: 1 - rho
  float bias2_sqrt = 1;    // Adam: sqrt(1 - beta2^t)
  float eps = 0;
  OptimizerKind kind = OptimizerKind::kSgd;
  bool first = false;      // SGD: no update applied yet; the buffer starts as d
  bool nesterov = false;
};

MNIST_MT_HD UpdateScalars update_scalars(const OptimizerOptions& o, UpdateValues v, std::uint64_t applied) {
  UpdateScalars s;
  s.kind = o.kind;
  s.weight_decay = o.kind == OptimizerKind::kAdamW ? 0.0f : static_cast<float>(o.weight_decay);
  s.eps = static_cast<float>(o.eps);
  switch (o.kind) {
    case OptimizerKind::kSgd:
      s.lr = static_cast<float>(v.lr);
      s.momentum = static_cast<float>(v.momentum);
      s.first = applied == 0;
      s.nesterov = o.nesterov;
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      const double t = static_cast<double>(applied + 1);
      s.lr = static_cast<float>(v.lr / (1.0 - ::pow(v.momentum, t)));
      if (o.kind == OptimizerKind::kAdamW) s.decay = static_cast<float>(1.0 - v.lr * o.weight_decay);
      s.average = static_cast<float>(1.0 - v.momentum);
      s.keep = static_cast<float>(o.beta2);
      s.add = static_cast<float>(1.0 - o.beta2);
      s.bias2_sqrt = static_cast<float>(::sqrt(1.0 - ::pow(o.beta2, t)));
      break;
    }
    case OptimizerKind::kAdadelta:
      s.lr = static_cast<float>(v.lr);
      s.keep = static_cast<float>(o.rho);
      s.add = static_cast<float>(1.0 - o.rho);
      break;
  }
  return s;
}

// The gradient with L2 weight decay, as PyTorch adds it: g + wd*p.
MNIST_MT_HD float decayed_grad(float g, float p, const UpdateScalars& s) {
  return s.weight_decay != 0.0f ? add_rn(g, mul_rn(s.weight_decay, p)) : g;
}

// SGD: buf = first ? d : momentum*buf + d; Nesterov: d += momentum*buf, else d = buf;
// p += -lr*d. With momentum 0 PyTorch keeps no buffer: it is neither read nor written.
MNIST_MT_HD void sgd_at(float* p, const float* g, float* buf, std::size_t i, const UpdateScalars& s) {
  float d = decayed_grad(g[i], p[i], s);
  if (s.momentum != 0.0f) {
    const float b = s.first ? d : add_rn(mul_rn(s.momentum, buf[i]), d);
    buf[i] = b;
    d = s.nesterov ? add_rn(d, mul_rn(s.momentum, b)) : b;
  }
  p[i] = add_rn(p[i], mul_rn(-s.lr, d));
}

// Adam and AdamW: m.lerp_(d, 1 - beta1) (ATen's lerp: self + w*(end - self) for |w| < 0.5,
// else end - (end - self)*(1 - w)); v = v*beta2 + ((1 - beta2)*d)*d;
// p += (-lr/(1 - beta1^t))*m / (sqrt(v)/sqrt(1 - beta2^t) + eps). AdamW first p *= 1 - lr*wd.
MNIST_MT_HD void adam_at(float* p, const float* g, float* m, float* v, std::size_t i, const UpdateScalars& s) {
  float param = p[i];
  const float d = decayed_grad(g[i], param, s);
  if (s.kind == OptimizerKind::kAdamW) param = mul_rn(param, s.decay);
  const float diff = add_rn(d, -m[i]);
  const float mean = s.average < 0.5f ? add_rn(m[i], mul_rn(s.average, diff))
                                      : add_rn(d, -mul_rn(diff, add_rn(1.0f, -s.average)));
  m[i] = mean;
  const float square = add_rn(mul_rn(v[i], s.keep), mul_rn(mul_rn(s.add, d), d));
  v[i] = square;
  const float denom = add_rn(div_rn(sqrt_rn(square), s.bias2_sqrt), s.eps);
  p[i] = add_rn(param, div_rn(mul_rn(-s.lr, mean), denom));
}

// Adadelta: sq = sq*rho + ((1 - rho)*d)*d; delta = sqrt(acc + eps)/sqrt(sq + eps)*d;
// acc = acc*rho + ((1 - rho)*delta)*delta; p += -lr*delta.
MNIST_MT_HD void adadelta_at(float* p, const float* g, float* sq, float* acc, std::size_t i, const UpdateScalars& s) {
  const float d = decayed_grad(g[i], p[i], s);
  const float square = add_rn(mul_rn(sq[i], s.keep), mul_rn(mul_rn(s.add, d), d));
  sq[i] = square;
  const float delta = mul_rn(div_rn(sqrt_rn(add_rn(acc[i], s.eps)), sqrt_rn(add_rn(square, s.eps))), d);
  acc[i] = add_rn(mul_rn(acc[i], s.keep), mul_rn(mul_rn(s.add, delta), delta));
  p[i] = add_rn(p[i], mul_rn(-s.lr, delta));
}

}  // namespace mnist_mt
