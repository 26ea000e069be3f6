#pragma once
// The optimizer cases of tests/golden/optimizers.safetensors (gen_optimizers.py), read for
// the tests that compare against them.
#include <nlohmann/json.hpp>
#include <string>

#include "golden/fixture.hpp"
#include "mnist_mt/optimizer.hpp"

namespace mnist_mt::testing {

inline const Fixture& optimizer_fixture() {
  static const Fixture f(golden_dir() / "optimizers.safetensors");
  return f;
}

// torch.optim's keyword arguments for optimizer `kind` as OptimizerOptions, with
// PyTorch's defaults for the rest.
inline OptimizerOptions options_of(const std::string& kind, const nlohmann::json& kwargs) {
  OptimizerOptions o;
  o.kind = *parse_optimizer(kind);
  o.lr = kwargs.at("lr").get<double>();
  o.momentum = kwargs.value("momentum", 0.0);
  o.nesterov = kwargs.value("nesterov", false);
  o.weight_decay = kwargs.value("weight_decay", kind == "adamw" ? 1e-2 : 0.0);
  if (kwargs.contains("betas")) {
    o.beta1 = kwargs["betas"][0].get<double>();
    o.beta2 = kwargs["betas"][1].get<double>();
  }
  o.eps = kwargs.value("eps", kind == "adadelta" ? 1e-6 : 1e-8);
  o.rho = kwargs.value("rho", 0.9);
  return o;
}

// Case `name` of the fixture's "cases" metadata: [optimizer, kwargs].
inline OptimizerOptions fixture_case(const std::string& name) {
  const auto cases = nlohmann::json::parse(optimizer_fixture().meta("cases"));
  const auto& spec = cases.at(name);
  return options_of(spec[0].get<std::string>(), spec[1]);
}

}  // namespace mnist_mt::testing
