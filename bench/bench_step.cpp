// Training step time through the real trainer (forward + backward + allreduce + SGD),
// DDP against the DataParallel-style baseline, 1..N devices, batch 4 (the template's),
// 64 and 256 per device. Each case trains two short epochs on synthetic in-memory
// data and reports the second, so one-time setup (threads, primitives, first touch of
// memory) stays out of the figures. Reported time is per step.
//
// layer/cpu/...: where one CPU rank's training step goes, per operation (forward, backward
// and SGD, oneDNN's implementation or ours as the label), at the kernel ISA of the process
// (ONEDNN_MAX_CPU_ISA=AVX2 holds oneDNN and our kernels to AVX2), and the step's images/s
// against this machine's ceiling: single-thread sgemm FLOP/s / 71.6 MFLOP per training
// image (direct convolution's count; Winograd needs fewer, so more than 100% is possible).
// ceiling_% on the trainer rows divides by that ceiling times the ranks.
//
// precision/cpu/...: conv2 and fc1 through oneDNN in f32 and in bf16 (register_precisions).
//
// step/cuda/..., step/cuda_eager/... (--no-cuda-graphs), step/cuda_tf32/... (--tf32),
// step/cuda_copied/... (--no-device-data: each batch copied from the host): the same on
// GPUs; op/cuda/<operation>/batch:B: each operation of a GPU replica's step
// on its own (cuda_ops.cpp), which tests/gpu/op_table.py sets beside the step.
#include <benchmark/benchmark.h>
#include <dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <numeric>
#include <omp.h>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cpu/device.hpp"
#include "cpu/isa.hpp"
#include "cpu/kernels.hpp"
#include "cpu/replica.hpp"
#include "cpu/step.hpp"
#include "mnist_mt/backend.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/trainer.hpp"
#ifdef MNIST_MT_BENCH_CUDA
#include "cuda_ops.hpp"
#endif

namespace mnist_mt {
namespace {

constexpr std::uint32_t kBatches[] = {4, 64, 256};
constexpr double kTrainFlopPerImage = 71.6e6;  // forward + backward, docs/architecture.md

// Single-thread sgemm (oneDNN's, at the process's ISA) on a device's compute thread, which
// runs oneDNN with one thread: the best of a few 1024^3 products, in FLOP/s. Measured once.
double sgemm_flops() {
  static const double flops = [] {
    constexpr dnnl_dim_t n = 1024;
    std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
    double best = 0;
    cpu::CpuDevice device(0);
    device.compute().wait(device.compute().enqueue([&] {
      for (int rep = 0; rep < 6; ++rep) {
        const auto start = std::chrono::steady_clock::now();
        dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        best = std::max(best, 2.0 * n * n * n / s);
      }
    }));
    return best;
  }();
  return flops;
}

// Images/s of `ranks` cores running at the sgemm rate with 71.6 MFLOP per image.
double ceiling(int ranks) { return sgemm_flops() * ranks / kTrainFlopPerImage; }

// Images each device trains on per measured epoch: a few seconds per case on one core.
std::uint32_t images_per_device(const Backend& backend) { return backend.name() == "cpu" ? 2048 : 16384; }

Split synthetic_split(std::uint32_t size, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255), label(0, 9);
  Split s;
  s.images.resize(std::size_t{size} * kImageBytes);
  s.labels.resize(size);
  for (auto& p : s.images) p = static_cast<std::uint8_t>(byte(gen));
  for (auto& l : s.labels) l = static_cast<std::uint8_t>(label(gen));
  return s;
}

void bench_step(benchmark::State& state, Backend& backend, Mode mode, int world, std::uint32_t batch,
                Exchange exchange = Exchange::kGradients) {
  const std::uint32_t steps = std::max<std::uint32_t>(3, images_per_device(backend) / batch);
  Dataset data{synthetic_split(steps * batch * world, 1), synthetic_split(batch * world, 2)};
  TrainConfig config;
  config.mode = mode;
  config.devices.resize(world);
  std::iota(config.devices.begin(), config.devices.end(), 0);
  config.epochs = 2;
  config.batch = batch;
  config.optimizer = {0.01f, 0.9f, 0.0f};
  config.max_steps = steps;
  config.evaluate = false;
  config.exchange = exchange;

  TrainResult result;
  for (auto _ : state) {
    try {
      result = train(backend, data, config);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
    const EpochMetrics& m = result.epochs.back();
    state.SetIterationTime(m.seconds / static_cast<double>(m.steps ? m.steps : steps));
  }
  const EpochMetrics& m = result.epochs.back();
  const double n = static_cast<double>(m.steps ? m.steps : steps);
  const double us = 1e6 / n;
  const PhaseSeconds& p = m.phase_seconds;
  state.counters["images/s"] = m.images_per_s;
  if (backend.name() == "cpu") state.counters["ceiling_%"] = 100.0 * m.images_per_s / ceiling(world);
  state.counters["us/step"] = m.seconds * us;
  state.counters["data_us"] = p.data_wait * us;
  if (p.replayed == 0) {  // a step replayed as a CUDA graph is timed whole (replayed_us below)
    // Exposed communication: time the step waited for allreduce beyond the backward.
    state.counters["comm_us"] = p.comm_wait * us;
    state.counters["comm_%"] = m.seconds > 0 ? 100.0 * p.comm_wait / m.seconds : 0.0;
    state.counters["fwd_us"] = p.forward * us;
    state.counters["bwd_us"] = p.backward * us;
    state.counters["opt_us"] = p.optimizer * us;
  }
  if (mode == Mode::kDdp) state.counters["launch_us"] = p.host_launch * us;  // the host's enqueueing
  if (m.bytes_sent_per_step) state.counters["fc1_bytes"] = (*m.bytes_sent_per_step)[kFc1];
  // A replayed step: its device time whole, and its graph's nodes.
  if (p.replayed > 0) state.counters["replayed_us"] = p.replayed * us;
  if (m.graph_nodes) state.counters["graph_nodes"] = static_cast<double>(*m.graph_nodes);
  if (m.planned_input) state.counters["planned_input"] = 1;  // the rows gathered on the GPU, nothing copied
  if (p.broadcast + p.gather > 0) {  // --mode dp's own phases
    state.counters["bcast_us"] = p.broadcast * us;
    state.counters["gather_us"] = p.gather * us;
  }
}

// `label`: the backend's name, and how it was made ("cuda_eager": --no-cuda-graphs;
// "cuda_tf32": --tf32, one device and ddp only, beside PyTorch's TF32 rows;
// "cuda_copied": --no-device-data, one device and ddp only).
void register_steps(Backend& backend, int max_world, const std::string& label, bool ddp_only = false) {
  for (std::uint32_t batch : kBatches) {
    for (int world = 1; world <= max_world; ++world) {
      for (Mode mode : {Mode::kDdp, Mode::kDp}) {
        if (ddp_only && mode != Mode::kDdp) continue;
        const std::string name = "step/" + label + "/" + (mode == Mode::kDdp ? "ddp" : "dp") +
                                 "/devices:" + std::to_string(world) + "/batch:" + std::to_string(batch);
        benchmark::RegisterBenchmark(name.c_str(), [&backend, mode, world, batch](benchmark::State& st) {
          bench_step(st, backend, mode, world, batch);
        })->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

// --exchange: ddp on CPU devices with fc1's gradient allreduced or its factors gathered,
// at the batches where they differ most, on 2 and 4 ranks (4 share 2 cores here).
void register_exchanges(Backend& backend) {
  for (std::uint32_t batch : {1u, 4u, 16u, 64u}) {
    for (int world : {2, 4}) {
      for (Exchange exchange : {Exchange::kGradients, Exchange::kFactors}) {
        const std::string name = std::string("exchange/cpu/") +
                                 (exchange == Exchange::kFactors ? "factors" : "gradients") +
                                 "/devices:" + std::to_string(world) + "/batch:" + std::to_string(batch);
        benchmark::RegisterBenchmark(name.c_str(), [&backend, world, batch, exchange](benchmark::State& st) {
          bench_step(st, backend, Mode::kDdp, world, batch, exchange);
        })->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

// --exchange factors' two ways to the guard's norm over `rows` gathered rows, on one core:
// from the factors (Fc1Factors keeps the product in them), or what writing fc1's whole
// weight gradient adds (its write, and a read each for the norm and the update); and the
// product itself.
void register_factor_norms() {
  for (std::uint32_t rows : {8u, 16u, 32u, 64u, 128u}) {
    const std::string suffix = "/rows:" + std::to_string(rows);
    benchmark::RegisterBenchmark(("factors/norm_from_factors" + suffix).c_str(), [rows](benchmark::State& st) {
      const std::vector<float> x(std::size_t{rows} * kFlat, 0.5f), g(std::size_t{rows} * kHidden, 0.01f);
      for (auto _ : st) benchmark::DoNotOptimize(cpu::factor_product_squares(g.data(), x.data(), rows));
    })->Unit(benchmark::kMillisecond);
  }
  // fc1's product over `rows` rows into all 128 output rows, as the update takes it (in
  // chunks of 8 output rows) and in one call (materialize(), own_fc1_backward's weights).
  for (std::uint32_t rows : {8u, 64u}) {
    for (const bool whole : {false, true}) {
      const std::string name = std::string("factors/product/") + (whole ? "one_call" : "chunks_of_8") +
                               "/rows:" + std::to_string(rows);
      benchmark::RegisterBenchmark(name.c_str(), [rows, whole](benchmark::State& st) {
        std::vector<float> x(std::size_t{rows} * kFlat), g(std::size_t{rows} * kHidden), out(kHidden * kFlat);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) / 97;
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 89) / 89 - 0.5f;
        for (auto _ : st) {
          if (whole) cpu::factor_product_rows(g.data(), x.data(), rows, 0, kHidden, out.data());
          else
            for (std::size_t r = 0; r < kHidden; r += 8)
              cpu::factor_product_rows(g.data(), x.data(), rows, r, 8, out.data() + r * kFlat);
          benchmark::DoNotOptimize(out.data());
        }
        st.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * kHidden * kFlat, benchmark::Counter::kIsIterationInvariantRate,
                                                    benchmark::Counter::kIs1000);
      })->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RegisterBenchmark("factors/written_gradient_passes", [](benchmark::State& st) {
    std::vector<float> w(std::size_t{kHidden} * kFlat);
    int k = 0;
    for (auto _ : st) {
      std::fill(w.begin(), w.end(), 0.001f * static_cast<float>(++k));  // the product's write
      benchmark::DoNotOptimize(cpu::sum_of_squares(w.data(), w.size()));  // the norm's read
      benchmark::DoNotOptimize(cpu::sum_of_squares(w.data(), w.size()));  // standing in for the update's
    }
  })->Unit(benchmark::kMillisecond);
}

// One pass of conv2 (`conv`) or fc1 through oneDNN with `dt` inputs, on one core: its time
// and implementation, or why oneDNN has none here.
struct PassTiming {
  double seconds = 0;
  std::string impl, error;
};

PassTiming time_pass(bool conv, const std::string& pass, dnnl::memory::data_type dt) {
  using namespace dnnl;
  using Tag = memory::format_tag;
  using Dt = memory::data_type;
  constexpr memory::dim kBatch = 64;
  const engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  const memory::desc src = conv ? memory::desc({kBatch, kConv1Channels, kConv1Side, kConv1Side}, dt, Tag::any)
                                : memory::desc({kBatch, kFlat}, dt, Tag::nc);
  const memory::desc wei = conv ? memory::desc({kConv2Channels, kConv1Channels, 3, 3}, dt, Tag::any)
                                : memory::desc({kHidden, kFlat}, dt, Tag::any);
  const memory::desc dst = conv ? memory::desc({kBatch, kConv2Channels, kConv2Side, kConv2Side}, dt, Tag::any)
                                : memory::desc({kBatch, kHidden}, dt, Tag::nc);
  const auto f32 = [](const memory::desc& d) { return memory::desc(d.dims(), Dt::f32, Tag::any); };
  const memory::desc bias({static_cast<memory::dim>(conv ? kConv2Channels : kHidden)}, Dt::f32, Tag::x);
  const memory::dims one{1, 1}, none{0, 0};
  PassTiming t;
  try {
    primitive_desc_base pd;
    if (conv) {
      const auto f = convolution_forward::primitive_desc(
          convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, src, wei, bias,
                                    f32(dst), one, none, none),
          eng);
      if (pass == "forward")
        pd = f;
      else if (pass == "backward_data")
        pd = convolution_backward_data::primitive_desc(
            convolution_backward_data::desc(algorithm::convolution_direct, f32(src), wei, dst, one, none, none), eng, f);
      else
        pd = convolution_backward_weights::primitive_desc(
            convolution_backward_weights::desc(algorithm::convolution_direct, src, f32(wei), bias, dst, one, none, none),
            eng, f);
    } else {
      const memory::desc y({kBatch, kHidden}, Dt::f32, Tag::nc), dx({kBatch, kFlat}, Dt::f32, Tag::nc);
      const auto f = inner_product_forward::primitive_desc(
          inner_product_forward::desc(prop_kind::forward_training, src, wei, bias, y), eng);
      if (pass == "forward")
        pd = f;
      else if (pass == "backward_data")
        pd = inner_product_backward_data::primitive_desc(inner_product_backward_data::desc(dx, wei, dst), eng, f);
      else
        pd = inner_product_backward_weights::primitive_desc(
            inner_product_backward_weights::desc(src, f32(wei), bias, dst), eng, f);
    }
    // Every buffer holds ordinary numbers, in either type: 0x3f80 is bf16's 1.0, and two of
    // them are a float near 1.002 (no subnormals or NaNs to slow a row).
    std::unordered_map<int, memory> args;
    const auto bind = [&](int arg, const memory::desc& d) {
      memory m(d, eng);
      auto* halves = static_cast<std::uint16_t*>(m.get_data_handle());
      std::fill(halves, halves + d.get_size() / 2, std::uint16_t{0x3f80});
      args[arg] = m;
    };
    for (const int arg : {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_DIFF_SRC, DNNL_ARG_DIFF_WEIGHTS,
                          DNNL_ARG_DIFF_DST})
      if (const memory::desc d = pd.query_md(query::exec_arg_md, arg); d.get_size() != 0) bind(arg, d);
    if (pass != "backward_data") bind(pass == "forward" ? DNNL_ARG_BIAS : DNNL_ARG_DIFF_BIAS, bias);
    t.impl = pd.impl_info_str();
    const primitive prim(pd.get());
    for (int k = 0; k < 3; ++k) prim.execute(strm, args);
    strm.wait();
    constexpr int kRuns = 20;
    const auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < kRuns; ++k) prim.execute(strm, args);
    strm.wait();
    t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kRuns;
  } catch (const dnnl::error& e) {
    t.error = std::string("oneDNN has no implementation here: ") + e.what();
  }
  return t;
}

// precision/cpu/...: what bf16 would buy the CPU step's two large layers, on one core at
// batch 64: oneDNN's direct convolution of conv2 (forward, backward data, backward
// weights) and fc1's inner product (the same three), with f32 or bf16 inputs (sources,
// weights and output gradients; outputs and gradients f32, as autocast-style mixed
// precision keeps them), against the layer profile's rows for what runs them in fp32
// (layer/cpu/.../batch:64/conv2 forward, conv2 backward, fc1 ...). A CPU that oneDNN runs
// no bf16 implementation on skips with its reason.
void register_precisions() {
  using Dt = dnnl::memory::data_type;
  for (const Dt dt : {Dt::f32, Dt::bf16}) {
    const std::string prefix = std::string("precision/cpu/") + (dt == Dt::f32 ? "f32" : "bf16") + "/batch:64/";
    for (const char* pass : {"forward", "backward_data", "backward_weights"})
      for (const bool conv : {true, false})
        benchmark::RegisterBenchmark((prefix + (conv ? "conv2 " : "fc1 ") + pass).c_str(), [=](benchmark::State& st) {
          PassTiming t;
          std::thread([&] {  // one OpenMP thread, as a rank's compute thread runs oneDNN
            omp_set_num_threads(1);
            t = time_pass(conv, pass, dt);
          }).join();
          if (!t.error.empty()) {
            st.SkipWithError(t.error.c_str());
            return;
          }
          for (auto _ : st) st.SetIterationTime(t.seconds);
          st.SetLabel(t.impl);
          st.counters["ms"] = 1e3 * t.seconds;
        })->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
  }
}

// One CPU replica trains kProfileSteps steps at `batch` after a warm-up; the per-operation
// times of those steps, and their wall time. Made once per batch size and shared by the
// benchmarks that report it.
struct LayerProfile {
  std::vector<cpu::OpTime> ops;
  double step_seconds = 0;
};
constexpr int kProfileSteps = 30;

// With `bf16`, fc1's and fc2's products on bfloat16 operands (--precision bf16).
const LayerProfile& layer_profile(std::uint32_t batch, bool bf16) {
  static std::map<std::pair<std::uint32_t, bool>, LayerProfile> profiles;
  auto it = profiles.find({batch, bf16});
  if (it != profiles.end()) return it->second;
  cpu::CpuDevice device(0);
  auto replica = cpu::make_cpu_replica(device, batch, bf16);
  replica->write_params(initial_parameters(1));
  const Split split = synthetic_split(batch, 3);
  Batch input;
  input.size = batch;
  input.images = split.images;
  input.labels = split.labels;
  input.indices.resize(batch);
  std::iota(input.indices.begin(), input.indices.end(), 0u);
  const auto step = [&](int k) {
    replica->set_input(input);
    replica->forward(true, {1, static_cast<std::uint32_t>(k)}, batch);
    replica->backward([](int) {});
    replica->update(OptimizerOptions{0.01, 0.9, 0.0});
  };
  for (int k = 0; k < 5; ++k) step(k);
  device.synchronize();
  replica->take_profile();
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < kProfileSteps; ++k) step(k);
  device.synchronize();
  LayerProfile p;
  p.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kProfileSteps;
  p.ops = replica->take_profile();
  return profiles.emplace(std::pair{batch, bf16}, std::move(p)).first->second;
}

// The rows of one batch size: "layer/cpu/<isa>/batch:N/", or "layer/cpu/<isa>-bf16/..."
// for --precision bf16.
void register_layers(std::uint32_t batch, bool bf16) {
  const std::string prefix = "layer/cpu/" + std::string(cpu::isa_name(cpu::kernel_isa())) + (bf16 ? "-bf16" : "") +
                             "/batch:" + std::to_string(batch) + "/";
  benchmark::RegisterBenchmark((prefix + "step").c_str(), [batch, bf16](benchmark::State& st) {
    const LayerProfile& p = layer_profile(batch, bf16);
    for (auto _ : st) st.SetIterationTime(p.step_seconds);
    st.counters["images/s"] = batch / p.step_seconds;
    st.counters["ms/step"] = 1e3 * p.step_seconds;
    st.counters["sgemm_GFLOP/s"] = sgemm_flops() / 1e9;
    st.counters["ceiling_%"] = 100.0 * batch / p.step_seconds / ceiling(1);
  })->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
  for (int op = 0; op < cpu::kOpCount; ++op) {  // profiled when the first of them runs
    benchmark::RegisterBenchmark((prefix + cpu::kOpNames[op]).c_str(), [batch, bf16, op](benchmark::State& st) {
      const LayerProfile& p = layer_profile(batch, bf16);
      const cpu::OpTime& t = p.ops[op];
      const double per_step = t.seconds / kProfileSteps;
      for (auto _ : st) st.SetIterationTime(per_step);
      st.SetLabel(t.impl);
      st.counters["ms/step"] = 1e3 * per_step;
      st.counters["%_of_step"] = 100.0 * per_step / p.step_seconds;
    })->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
  }
}

// Every batch size's rows; also with bf16 products where the CPU has them.
void register_layers() {
  for (const bool bf16 : {false, true}) {
    if (bf16 && !cpu::bf16_products()) continue;
    for (std::uint32_t batch : kBatches) register_layers(batch, bf16);
  }
}

}  // namespace
}  // namespace mnist_mt

int main(int argc, char** argv) {
  using namespace mnist_mt;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  BackendOptions pinned;  // as mnist_mt runs them: a CPU each when the ranks are as many as the CPUs
  pinned.pin_cpu_threads = true;
  std::unique_ptr<Backend> cpu = make_cpu_backend(pinned);
  register_layers();
  register_factor_norms();
  register_precisions();
  register_steps(*cpu, cpu->device_count(), "cpu");
  register_exchanges(*cpu);
  std::unique_ptr<Backend> cuda, cuda_eager, cuda_tf32, cuda_copied;
  std::shared_ptr<void> cuda_ops;  // the op/cuda/ rows' buffers, released before the backends
  if (cuda_built()) {
    try {
      BackendOptions eager, tf32, copied;
      eager.cuda_graphs = false;
      tf32.tf32 = true;
      copied.device_data = false;
      cuda = make_cuda_backend({});
      cuda_eager = make_cuda_backend(eager);
      cuda_tf32 = make_cuda_backend(tf32);
      cuda_copied = make_cuda_backend(copied);
      if (cuda->device_count() > 0) {
        register_steps(*cuda, cuda->device_count(), "cuda");
        register_steps(*cuda_eager, cuda->device_count(), "cuda_eager");
        register_steps(*cuda_tf32, 1, "cuda_tf32", true);
        register_steps(*cuda_copied, 1, "cuda_copied", true);
#ifdef MNIST_MT_BENCH_CUDA
        cuda_ops = register_cuda_ops();
#endif
      }
    } catch (const std::exception& e) {
      benchmark::AddCustomContext("cuda", std::string("not measured: ") + e.what());
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  cuda_ops.reset();
  return 0;
}
