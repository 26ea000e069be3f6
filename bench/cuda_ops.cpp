// Each operation of the CUDA replica's training step, timed on its own on GPU 0 with CUDA
// events: kReps calls after kWarmup, µs per call, three repetitions. The calls are queued
// behind a kernel that keeps the device busy while the host enqueues them (spin), so the
// rows time the device's work and its gaps between kernels, not the host's launches:
// about what a replayed graph's node of that kind costs. Inputs are random
// in [-1, 1], sized as the replica sizes them, so the kernels do the step's work; conv2's
// cuDNN algorithms are the timed choice at that batch, as a run makes it. Where the next
// tuning step pays is read off these rows beside the step rows (step/cuda/...).
#include "cuda_ops.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/activations.hpp"
#include "cuda/conv.hpp"
#include "cuda/errors.hpp"
#include "cuda/fc.hpp"
#include "cuda/geometry.hpp"
#include "cuda/kernels.hpp"
#include "cuda/owners.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt {
namespace {

using namespace cuda;

constexpr int kWarmup = 5;
constexpr int kReps = 50;
// Longer than the host takes to enqueue kReps calls (cuDNN's take about 10 µs each).
constexpr double kSpinMicroseconds = 5000;

// Uniform in [-1, 1], so the kernels do the step's work (ReLUs pass about half).
void fill_random(DeviceBuffer<float>& d, std::uint32_t seed, cudaStream_t stream) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> host(d.bytes() / sizeof(float));
  for (float& v : host) v = value(gen);
  CUDA_CHECK(cudaMemcpyAsync(d.data(), host.data(), d.bytes(), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

// One replica's buffers, handles and conv2 for batch n, on a stream of its own.
struct Step {
  explicit Step(std::uint32_t n)
      : rows(n),
        stream(make_stream(0)),
        cudnn(make_cudnn(stream.get())),
        cublas_workspace(std::size_t{32} << 20),
        cublas(make_cublas(stream.get(), cublas_workspace, false)),
        conv2(kConv2Shape, BackendOptions{}),
        workspace(std::max<std::size_t>(conv2.tune(cudnn.get(), static_cast<int>(n), std::size_t{256} << 20), 256)),
        params(kParamCount),
        grads(kParamCount),
        first(kParamCount),
        act(n),
        stats(kStatCount),
        squares(kSquareScratch),
        values(2),
        scalars(1),
        ticket(1),
        gate(1),
        applied(1),
        images(std::size_t{n} * kImageBytes),
        labels(n),
        samples(n) {
    const cudaStream_t s = stream.get();
    std::uint32_t seed = 1;
    for (DeviceBuffer<float>* b : {&params, &grads, &first, &act.x, &act.a1, &act.a2, &act.pooled, &act.h, &act.z,
                                   &act.dlogits, &act.dh, &act.dpooled, &act.da2, &act.da1})
      fill_random(*b, seed++, s);
    act.zero_tickets(s);
    CUDA_CHECK(cudaMemsetAsync(stats.data(), 0, stats.bytes(), s));
    CUDA_CHECK(cudaMemsetAsync(ticket.data(), 0, ticket.bytes(), s));
    CUDA_CHECK(cudaMemsetAsync(applied.data(), 0, applied.bytes(), s));
    CUDA_CHECK(cudaMemsetAsync(images.data(), 0x5a, images.bytes(), s));
    CUDA_CHECK(cudaMemsetAsync(labels.data(), 0, labels.bytes(), s));
    CUDA_CHECK(cudaMemsetAsync(samples.data(), 0, samples.bytes(), s));
    const int open = 1;  // the update runs: a row of its own times the full update
    CUDA_CHECK(cudaMemcpyAsync(gate.data(), &open, sizeof open, cudaMemcpyHostToDevice, s));
    write_update_values(values.data(), 0.0, 0.9, s);
    begin_update(OptimizerOptions{0.0, 0.9, 0.0}, values.data(), applied.data(), nullptr, scalars.data(), s);
    CUDA_CHECK(cudaStreamSynchronize(s));
  }
  float* param(int i) { return params.data() + kParams[static_cast<std::size_t>(i)].offset; }
  float* grad(int i) { return grads.data() + kParams[static_cast<std::size_t>(i)].offset; }
  Workspace ws() const { return {workspace.data(), workspace.bytes()}; }
  int n() const { return static_cast<int>(rows); }
  DropoutArgs dropout(RandomStream s, float p) const { return {samples.data(), 7, 0, s, p, 1.0f / (1.0f - p)}; }

  std::uint32_t rows;
  StreamOwner stream;
  CudnnOwner cudnn;
  DeviceBuffer<std::uint8_t> cublas_workspace;
  CublasOwner cublas;
  Conv2d conv2;
  DeviceBuffer<std::uint8_t> workspace;
  DeviceBuffer<float> params, grads, first;
  Activations act;  // the replica's activations and the reducing kernels' scratch
  DeviceBuffer<double> stats, squares, values;
  DeviceBuffer<UpdateScalars> scalars;
  DeviceBuffer<unsigned> ticket;  // the guard's count of finished blocks
  DeviceBuffer<int> gate;
  DeviceBuffer<unsigned long long> applied;
  DeviceBuffer<std::uint8_t> images, labels;
  DeviceBuffer<std::uint32_t> samples;
};

// The step's operations in the order the replica enqueues them (training, ddp).
std::vector<std::pair<std::string, std::function<void(Step&)>>> operations() {
  return {
      {"normalize", [](Step& s) {
         normalize_images(s.images.data(), s.act.x.data(), std::size_t{s.rows} * kImageBytes, kInputMean, kInputStd,
                          s.stream.get());
       }},
      {"conv1_forward", [](Step& s) {
         conv1_forward(s.act.x.data(), s.param(0), s.param(1), s.rows, s.act.a1.data(), s.stream.get());
       }},
      {"conv2_forward_cudnn", [](Step& s) {
         s.conv2.forward(s.cudnn.get(), s.n(), s.act.a1.data(), s.param(2), s.act.a2.data(), s.ws());
       }},
      {"conv2_bias_relu_pool_dropout", [](Step& s) {
         bias_relu_max_pool_dropout(s.act.a2.data(), s.param(3), s.act.pooled.data(), s.rows, kC2, kPoolSideInt,
                                    s.dropout(RandomStream::kDropout0, kDropout1), s.stream.get());
       }},
      {"fc1_forward_cublas", [](Step& s) {
         linear_forward(s.cublas.get(), s.act.pooled.data(), s.param(4), s.act.h.data(), s.n(), kFc1In, kFc1Out);
       }},
      {"fc1_bias_relu_dropout", [](Step& s) {
         bias_relu_dropout(s.act.h.data(), s.param(5), s.rows, kFc1Out, 1,
                           s.dropout(RandomStream::kDropout1, kDropout2), s.stream.get());
       }},
      {"fc2_loss_and_gradients", [](Step& s) {
         fc2_loss({.h = s.act.h.data(), .w = s.param(6), .bias = s.param(7), .labels = s.labels.data(),
                   .rows = s.rows, .denominator = static_cast<float>(s.rows), .z = s.act.z.data(),
                   .logprobs = s.act.logprobs.data(), .dlogits = s.act.dlogits.data(),
                   .stats = s.stats.data() + kStatPending, .dw = s.grad(6), .db = s.grad(7), .dh = s.act.dh.data(),
                   .dh_bias = s.grad(5), .scale = 2.0f},
                  s.stream.get());
       }},
      {"fc1_backward_weight_cublas", [](Step& s) {
         linear_backward_weight(s.cublas.get(), s.act.pooled.data(), s.act.dh.data(), s.grad(4), s.n(), kFc1In,
                                kFc1Out);
       }},
      {"fc1_backward_data_cublas", [](Step& s) {
         linear_backward_data(s.cublas.get(), s.param(4), s.act.dh.data(), s.act.dpooled.data(), s.n(), kFc1In,
                              kFc1Out);
       }},
      {"pool_backward_conv2_bias_grad", [](Step& s) {
         max_pool_dropout_backward(s.act.a2.data(), s.act.pooled.data(), s.act.dpooled.data(), s.act.da2.data(),
                                   s.rows, kC2, kPoolSideInt, 2.0f, s.act.pool_sums.data(), s.act.pool_ticket.data(),
                                   s.grad(3), s.stream.get());
       }},
      {"conv2_backward_filter_cudnn", [](Step& s) {
         s.conv2.backward_filter(s.cudnn.get(), s.n(), s.act.a1.data(), s.act.da2.data(), s.grad(2), s.ws());
       }},
      {"conv2_backward_data_cudnn", [](Step& s) {
         s.conv2.backward_data(s.cudnn.get(), s.n(), s.param(2), s.act.da2.data(), s.act.da1.data(), s.ws());
       }},
      {"conv1_backward", [](Step& s) {
         conv1_backward(s.act.x.data(), s.act.a1.data(), s.act.da1.data(), s.rows, s.act.conv1_sums.data(),
                        s.act.conv1_ticket.data(), s.grad(0), s.grad(1), s.stream.get());
       }},
      {"guard", [](Step& s) {
         guard_update(s.grads.data(), kParamCount, s.squares.data(), s.ticket.data(),
                      {s.stats.data(), 0, false, s.gate.data()}, OptimizerOptions{0.0, 0.9, 0.0}, s.values.data(),
                      s.applied.data(), s.scalars.data(), s.stream.get());
       }},
      {"update", [](Step& s) {
         optimizer_update(s.params.data(), s.grads.data(), s.first.data(), nullptr, kParamCount, s.scalars.data(),
                          s.stream.get(), s.gate.data());
       }},
  };
}

// The buffers of the batch being timed, made once per batch and released before exit.
struct Holder {
  std::unique_ptr<Step> step;
};

void time_operation(benchmark::State& state, Holder& holder, std::uint32_t batch,
                    const std::function<void(Step&)>& op) {
  std::unique_ptr<Step>& step = holder.step;
  try {
    CUDA_CHECK(cudaSetDevice(0));
    if (!step || step->rows != batch) {
      step.reset();
      step = std::make_unique<Step>(batch);
    }
    const EventOwner start = make_timing_event(), stop = make_timing_event();
    for (int i = 0; i < kWarmup; ++i) op(*step);
    for (auto _ : state) {
      spin(kSpinMicroseconds, step->stream.get());
      CUDA_CHECK(cudaEventRecord(start.get(), step->stream.get()));
      for (int i = 0; i < kReps; ++i) op(*step);
      CUDA_CHECK(cudaEventRecord(stop.get(), step->stream.get()));
      CUDA_CHECK(cudaEventSynchronize(stop.get()));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
      state.SetIterationTime(ms / 1e3 / kReps);
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

std::shared_ptr<void> register_cuda_ops() {
  auto holder = std::make_shared<Holder>();
  for (const std::uint32_t batch : {4u, 64u, 256u}) {
    for (const auto& [name, op] : operations()) {
      const std::string row = "op/cuda/" + name + "/batch:" + std::to_string(batch);
      Holder* h = holder.get();
      benchmark::RegisterBenchmark(row.c_str(),
                                   [h, batch, op](benchmark::State& st) { time_operation(st, *h, batch, op); })
          ->UseManualTime()
          ->Iterations(1)
          ->Repetitions(3)  // op_table.py shows the least
          ->Unit(benchmark::kMicrosecond);
    }
  }
  return holder;
}

}  // namespace mnist_mt
