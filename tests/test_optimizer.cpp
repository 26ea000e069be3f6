// The optimizers (optimizer.hpp, run by the CPU backend's kernels on every ISA this CPU
// has) and the schedules (schedule.cpp) against torch.optim's own answers
// (tests/golden/gen_optimizers.py).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cpu/isa.hpp"
#include "cpu/kernels.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/optimizer.hpp"
#include "mnist_mt/schedule.hpp"
#include "optimizer_cases.hpp"

namespace mnist_mt {
namespace {

using testing::fixture_case;
using testing::options_of;

// |ours - want| / |want|, both as vectors.
double normwise(const std::vector<float>& ours, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff += (double{ours[i]} - want[i]) * (double{ours[i]} - want[i]);
    norm += double{want[i]} * want[i];
  }
  return std::sqrt(diff / norm);
}

std::vector<cpu::Isa> isas() {
  std::vector<cpu::Isa> out{cpu::Isa::kPortable};
  if (cpu::kernel_isa() != cpu::Isa::kPortable) out.push_back(cpu::kernel_isa());
  return out;
}

// One update within 1e-6 and twenty within 1e-5 (relative, normwise) of torch.optim's, from
// the same parameters and gradients, for every optimizer and the variants that change its
// arithmetic (Nesterov, weight decay, Adam's lerp with a weight of 0.5 or more).
TEST(Optimizer, UpdatesAsTorchOptim) {
  const testing::Fixture& f = testing::optimizer_fixture();
  const auto cases = nlohmann::json::parse(f.meta("cases"));
  const std::size_t count = std::stoul(f.meta("count")), steps = std::stoul(f.meta("steps"));
  const std::vector<float> p0 = f.get<float>("rule.p0"), grads = f.get<float>("rule.grads");
  ASSERT_EQ(grads.size(), steps * count);
  for (const cpu::Isa isa : isas()) {
    for (const auto& [name, spec] : cases.items()) {
      SCOPED_TRACE(name + " on " + cpu::isa_name(isa));
      const OptimizerOptions o = fixture_case(name);
      std::vector<float> p = p0, first(count), second(count);
      for (std::size_t step = 0; step < steps; ++step) {
        const UpdateScalars s = update_scalars(o, base_values(o), step);
        cpu::element_kernels(isa).optimizer_update(p.data(), grads.data() + step * count, first.data(), second.data(),
                                                   count, s);
        if (step == 0) {
          EXPECT_LE(normwise(p, f.get<float>("rule." + name + ".step1")), 1e-6);
        }
      }
      EXPECT_LE(normwise(p, f.get<float>("rule." + name + ".step" + std::to_string(steps))), 1e-5);
      EXPECT_NE(p, p0);
      for (int b = 0; b < state_buffers(o.kind); ++b) {
        const std::string key = "rule." + name + "." + state_name(o.kind, b);
        if (o.kind == OptimizerKind::kSgd && o.momentum == 0) {
          EXPECT_EQ(first, std::vector<float>(count)) << "momentum 0 keeps no buffer";
          continue;
        }
        EXPECT_LE(normwise(b == 0 ? first : second, f.get<float>(key)), 1e-5) << key;
      }
    }
  }
}

ScheduleOptions schedule_of(const std::string& kind, const nlohmann::json& settings) {
  ScheduleOptions s;
  if (kind == "warmup") {
    s.warmup = settings.at("warmup").get<std::uint32_t>();
    return s;
  }
  s.kind = *parse_schedule(kind);
  s.step_epochs = settings.value("step_size", 1u);
  s.gamma = settings.value("gamma", 0.1);
  return s;
}

// The learning rate and momentum (or beta1) of every update as torch.optim.lr_scheduler
// sets them: StepLR stepped per epoch, OneCycleLR (momentum cycled, or not for Adadelta,
// which has none) and CosineAnnealingLR per update, the warm-up as LinearLR.
TEST(Schedule, ValuesAsTorchLrScheduler) {
  const testing::Fixture& f = testing::optimizer_fixture();
  const auto schedules = nlohmann::json::parse(f.meta("schedules"));
  const std::uint64_t per_epoch = std::stoul(f.meta("schedule_steps_per_epoch"));
  const auto epochs = static_cast<std::uint32_t>(std::stoul(f.meta("schedule_epochs")));
  for (const auto& [name, spec] : schedules.items()) {
    SCOPED_TRACE(name);
    OptimizerOptions o = fixture_case(spec[0].get<std::string>());
    if (spec[2].contains("max_lr")) o.lr = spec[2]["max_lr"].get<double>();
    const Schedule schedule(schedule_of(spec[1].get<std::string>(), spec[2]), o, per_epoch, epochs);
    const std::vector<double> lr = f.get<double>("schedule." + name + ".lr");
    const std::vector<double> momentum = f.get<double>("schedule." + name + ".momentum");
    ASSERT_EQ(lr.size(), per_epoch * epochs);
    double top = 0;
    for (double v : lr) top = std::max(top, v);
    for (std::size_t k = 0; k < lr.size(); ++k) {
      const UpdateValues v = schedule.at(k);
      // PyTorch's CosineAnnealingLR and LinearLR compute each value from the last one:
      // rounding apart from the closed forms here, and no more.
      EXPECT_NEAR(v.lr, lr[k], 1e-12 * top) << "update " << k;
      EXPECT_NEAR(v.momentum, momentum[k], 1e-12) << "update " << k;
    }
  }
}

TEST(Schedule, RefusesOptionsThatDefineNone) {
  OptimizerOptions o;
  ScheduleOptions onecycle;
  onecycle.kind = ScheduleKind::kOneCycle;
  onecycle.warmup = 10;
  EXPECT_THROW(check_schedule(onecycle), InputError);
  onecycle.warmup = 0;
  EXPECT_NO_THROW(Schedule(onecycle, o, 1, 2));
  try {
    Schedule(onecycle, o, 1, 1);
    ADD_FAILURE() << "a one-cycle run of one update";
  } catch (const InputError& e) {
    EXPECT_EQ(e.input(), "schedule");
  }
  ScheduleOptions step;
  step.kind = ScheduleKind::kStep;
  step.step_epochs = 0;
  EXPECT_THROW(check_schedule(step), InputError);
  step.step_epochs = 1;
  for (double gamma : {0.0, -1.0, std::nan(""), double{INFINITY}}) {
    step.gamma = gamma;
    EXPECT_THROW(check_schedule(step), InputError) << gamma;
  }
}

}  // namespace
}  // namespace mnist_mt
