// Each CUDA kernel launcher (src/cuda/kernels.hpp), the cuDNN convolution and the cuBLAS
// products, at batch sizes 1, 3, 64 and 256, against host references: element_ops.hpp's
// functions for the own kernels (which test_cuda_reference checks against the CPU backend),
// conv_reference.hpp's float64 convolution for cuDNN, a float64 loop for cuBLAS. cuDNN
// times its algorithms per batch size, so the large batches compare the algorithms it
// picks there. Needs a GPU (gpu_main.cpp).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <random>
#include <vector>

#include "conv_reference.hpp"
#include "cuda/algo_cache.hpp"
#include "cuda/conv.hpp"
#include "cuda/element_ops.hpp"
#include "cuda/errors.hpp"
#include "cuda/fc.hpp"
#include "cuda/kernels.hpp"
#include "cuda/owners.hpp"
#include "kernel_inputs.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt::cuda {
namespace {

using testing_inputs::grid_values;
using testing_inputs::same;
using testing_inputs::sprinkle_nan;
using testing_inputs::uniform;
using Reference = testing_reference::Sums;

const std::uint32_t kBatches[] = {1, 3, 64, 256};
constexpr DropoutKey kKey{0xfeed'beefULL, 5};

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host, cudaStream_t stream) {
  DeviceBuffer<T> d(std::max<std::size_t>(host.size(), 1));
  CUDA_CHECK(cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return d;
}

template <typename T>
std::vector<T> download(const DeviceBuffer<T>& d, std::size_t count, cudaStream_t stream) {
  std::vector<T> host(count);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), d.data(), count * sizeof(T), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

// A device buffer of NaNs (all bits set), so an element a kernel fails to write shows.
DeviceBuffer<float> unwritten(std::size_t count, cudaStream_t stream) {
  DeviceBuffer<float> d(count);
  CUDA_CHECK(cudaMemsetAsync(d.data(), 0xff, d.bytes(), stream));
  return d;
}

class CudaKernels : public ::testing::Test {
 protected:
  cudaStream_t stream() const { return stream_.get(); }

  // Distinct global sample indices for n rows, on the host and the device.
  void make_samples(std::uint32_t n) {
    samples_.resize(n);
    for (std::uint32_t r = 0; r < n; ++r) samples_[r] = 7919u * r + 11u;
    device_samples_ = upload(samples_, stream());
  }
  DropoutArgs dropout(bool device, RandomStream s, float p) const {
    if (p == 0.0f) return {};
    return {device ? device_samples_.data() : samples_.data(), kKey.seed, kKey.epoch, s, p, 1.0f / (1.0f - p)};
  }

  StreamOwner stream_ = make_stream(0);
  std::vector<std::uint32_t> samples_;
  DeviceBuffer<std::uint32_t> device_samples_;
};

// One suite per operation, named as its source file (input.cu, activation.cu, pool.cu,
// bias_grad.cu, loss.cu, update.cu, norm.cu, fc.cpp) or, for conv.cpp's one class, as the layer it
// runs (Conv1, Conv2, as the CPU's conv1.cpp and conv2*.cpp): --gtest_filter '*Pool*'
// finds pool.cu's tests here and pool.cpp's in test_cpu_kernels.
class Input : public CudaKernels {
 protected:
  // A split of n random images and labels, on the host and the device.
  void make_split(std::uint32_t n, std::uint32_t seed) {
    split_.resize(std::size_t{n} * kImageBytes);
    labels_.resize(n);
    std::mt19937 rng(seed);
    for (auto& b : split_) b = static_cast<std::uint8_t>(rng());
    for (auto& l : labels_) l = static_cast<std::uint8_t>(rng() % 10);
    d_split_ = upload(split_, stream());
    d_labels_ = upload(labels_, stream());
  }
  std::vector<std::uint8_t> split_, labels_;
  DeviceBuffer<std::uint8_t> d_split_, d_labels_;
};
class Activation : public CudaKernels {};
class Pool : public CudaKernels {};
class BiasGrad : public CudaKernels {};
class Loss : public CudaKernels {};
class Update : public CudaKernels {};
class Norm : public CudaKernels {};
class Conv1 : public CudaKernels {};
class Conv2 : public CudaKernels {};
class Fc : public CudaKernels {};

// Every elementwise kernel is compared bit for bit, NaN included: the device rounds each
// fp32 add, multiply and divide as the host does, and none of them can be contracted into an FMA.
TEST_F(Input, NormalizeImages) {
  for (const std::uint32_t n : kBatches) {
    std::vector<std::uint8_t> images(std::size_t{n} * kImageBytes);
    std::mt19937 rng(n);
    for (auto& b : images) b = static_cast<std::uint8_t>(rng());
    const auto d_images = upload(images, stream());
    const auto d_out = unwritten(images.size(), stream());
    normalize_images(d_images.data(), d_out.data(), images.size(), kInputMean, kInputStd, stream());
    const auto out = download(d_out, images.size(), stream());
    for (std::size_t i = 0; i < out.size(); ++i)
      ASSERT_EQ(out[i], normalize_at(images.data(), i, kInputMean, kInputStd)) << "batch " << n << " at " << i;
  }
}

// The rows of a batch gathered by sample index from a split in device memory, with their
// labels; indices repeat and reach both ends of the split.
TEST_F(Input, GatherImagesFromAHeldSplit) {
  constexpr std::uint32_t kSplit = 1000;
  make_split(kSplit, 17);
  for (const std::uint32_t n : kBatches) {
    std::vector<std::uint32_t> samples(n);
    for (std::uint32_t r = 0; r < n; ++r) samples[r] = r == 0 ? kSplit - 1 : r == 1 ? 0 : (r * 389u) % kSplit;
    if (n > 2) samples[2] = samples[0];
    const auto d_samples = upload(samples, stream());
    const auto d_out = unwritten(std::size_t{n} * kImageBytes, stream());
    DeviceBuffer<std::uint8_t> d_row_labels(n);
    CUDA_CHECK(cudaMemsetAsync(d_row_labels.data(), 0xff, n, stream()));
    gather_images(d_split_.data(), d_labels_.data(), d_samples.data(), n, d_out.data(), d_row_labels.data(), kInputMean,
                  kInputStd, stream());
    const auto out = download(d_out, std::size_t{n} * kImageBytes, stream());
    const auto row_labels = download(d_row_labels, n, stream());
    for (std::uint32_t i = 0; i < out.size(); ++i)
      ASSERT_EQ(out[i], gather_normalize_at(split_.data(), samples.data(), i, kInputMean, kInputStd))
          << "batch " << n << " at " << i;
    for (std::uint32_t r = 0; r < n; ++r)
      ASSERT_EQ(row_labels[r], labels_[samples[r]]) << "batch " << n << " row " << r;
  }
}

// A rank's epoch planned on the device: each call gathers the step the counter names,
// writes its sample indices, and advances the counter by one.
TEST_F(Input, GatherPlannedTakesTheStepItsCounterNames) {
  constexpr std::uint32_t kSplit = 500, kSteps = 3;
  make_split(kSplit, 23);
  for (const std::uint32_t n : kBatches) {
    std::vector<std::uint32_t> plan{9, 1};  // epoch 9, from step 1
    for (std::uint32_t k = 0; k < kSteps * n; ++k) plan.push_back((k * 211u + 7u) % kSplit);
    auto d_plan = upload(plan, stream());
    for (std::uint32_t step = 1; step < kSteps; ++step) {
      const auto d_out = unwritten(std::size_t{n} * kImageBytes, stream());
      DeviceBuffer<std::uint32_t> d_samples(n);
      DeviceBuffer<std::uint8_t> d_row_labels(n);
      gather_planned(d_plan.data(), n, d_split_.data(), d_labels_.data(), d_out.data(), d_samples.data(),
                     d_row_labels.data(), kInputMean, kInputStd, stream());
      const auto out = download(d_out, std::size_t{n} * kImageBytes, stream());
      const auto samples = download(d_samples, n, stream());
      const auto row_labels = download(d_row_labels, n, stream());
      const std::uint32_t* want = plan.data() + kPlanHeader + std::size_t{step} * n;
      ASSERT_TRUE(std::equal(samples.begin(), samples.end(), want)) << "batch " << n << " step " << step;
      for (std::uint32_t i = 0; i < out.size(); ++i)
        ASSERT_EQ(out[i], gather_normalize_at(split_.data(), want, i, kInputMean, kInputStd))
            << "batch " << n << " step " << step << " at " << i;
      for (std::uint32_t r = 0; r < n; ++r) ASSERT_EQ(row_labels[r], labels_[want[r]]);
      EXPECT_EQ(download(d_plan, kPlanHeader, stream())[kPlanStep], step + 1);
    }
  }
}

struct Layer {
  int channels;
  int spatial;
};
constexpr Layer kLayers[] = {{kConv1Channels, kConv1Side * kConv1Side}, {kConv2Channels, kConv2Side * kConv2Side},
                             {kHidden, 1}, {10, 1}};

TEST_F(Activation, BiasReluDropoutAndBackward) {
  for (const std::uint32_t n : kBatches)
    for (const Layer layer : kLayers)
      for (const float p : {0.0f, kDropout2}) {
        SCOPED_TRACE(testing::Message() << "batch " << n << " channels " << layer.channels << " p " << p);
        make_samples(n);
        const std::size_t count = std::size_t{n} * layer.channels * layer.spatial;
        std::vector<float> y = grid_values(count, 1);
        const std::vector<float> bias = grid_values(layer.channels, 2);
        sprinkle_nan(y, 101, 7);
        const std::vector<float> grad = uniform(count, -1, 1, 3);
        const auto d_y = upload(y, stream()), d_bias = upload(bias, stream()), d_grad = upload(grad, stream());
        bias_relu_dropout(d_y.data(), d_bias.data(), n, layer.channels, layer.spatial,
                          dropout(true, RandomStream::kDropout1, p), stream());
        const auto out = download(d_y, count, stream());
        const DropoutArgs args = dropout(false, RandomStream::kDropout1, p);
        for (std::size_t i = 0; i < count; ++i)
          ASSERT_TRUE(same(out[i], bias_relu_dropout_at(y.data(), bias.data(), i, layer.channels, layer.spatial, args)))
              << "at " << i;
        relu_dropout_backward(d_y.data(), d_grad.data(), count, args.scale, stream());
        const auto back = download(d_grad, count, stream());
        for (std::size_t i = 0; i < count; ++i)
          ASSERT_TRUE(same(back[i], relu_dropout_backward_at(out.data(), grad.data(), i, args.scale))) << "at " << i;
      }
}

// conv2's bias and ReLU (written back in place) with the max-pool and dropout, bit for bit
// against element_ops.hpp; the backward's gradient and conv2's bias gradient too, the
// latter twice at each batch with one scratch and count of finished blocks, whose grid
// changes with the batch.
TEST_F(Pool, BiasReluMaxPoolDropoutForwardAndBackward) {
  constexpr int kSide = kPoolSide, kC = kConv2Channels, kP = 4 * kSide * kSide;
  DeviceBuffer<float> sums(std::size_t{kBatches[3]} * kC);
  DeviceBuffer<unsigned> ticket(1);
  CUDA_CHECK(cudaMemsetAsync(ticket.data(), 0, ticket.bytes(), stream()));
  const std::vector<float> bias = grid_values(kC, 6);
  const auto d_bias = upload(bias, stream());
  for (const std::uint32_t n : kBatches)
    for (const float p : {0.0f, kDropout1}) {
      SCOPED_TRACE(testing::Message() << "batch " << n << " p " << p);
      make_samples(n);
      const std::size_t in_count = std::size_t{n} * kC * kP, count = in_count / 4;
      std::vector<float> pre = grid_values(in_count, 4);
      sprinkle_nan(pre, 257, 9);
      const std::vector<float> grad_out = uniform(count, -1, 1, 5);
      const auto d_a2 = upload(pre, stream()), d_grad_out = upload(grad_out, stream());
      const auto d_out = unwritten(count, stream()), d_grad_in = unwritten(in_count, stream());
      const DropoutArgs args = dropout(false, RandomStream::kDropout0, p);
      bias_relu_max_pool_dropout(d_a2.data(), d_bias.data(), d_out.data(), n, kC, kSide,
                                 dropout(true, RandomStream::kDropout0, p), stream());
      const auto a2 = download(d_a2, in_count, stream()), out = download(d_out, count, stream());
      std::vector<float> ref_a2 = pre;
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_TRUE(same(out[i], bias_relu_max_pool_dropout_at(ref_a2.data(), bias.data(), i, kC, kSide, args)))
            << "at " << i;
      for (std::size_t i = 0; i < in_count; ++i) {
        ASSERT_TRUE(same(a2[i], ref_a2[i])) << "a2 at " << i;
        ASSERT_TRUE(same(a2[i], bias_relu_dropout_at(pre.data(), bias.data(), i, kC, kP, {}))) << "a2 at " << i;
      }
      std::vector<float> expected(in_count), planes(std::size_t{n} * kC), db(kC);
      for (std::size_t plane = 0; plane < planes.size(); ++plane) {
        float shares[kPoolBlock];
        for (int t = 0; t < kPoolBlock; ++t)
          shares[t] = pool_backward_share(a2.data(), out.data(), grad_out.data(), expected.data(), plane, kSide,
                                          args.scale, t, kPoolBlock);
        planes[plane] = block_tree_sum(shares, kPoolBlock);
      }
      for (int c = 0; c < kC; ++c) db[c] = rows_total_at(planes.data(), n, kC, 1, c, 0);
      for (int call = 0; call < 2; ++call) {
        SCOPED_TRACE(testing::Message() << "call " << call);
        const auto d_db = unwritten(kC, stream());
        max_pool_dropout_backward(d_a2.data(), d_out.data(), d_grad_out.data(), d_grad_in.data(), n, kC, kSide,
                                  args.scale, sums.data(), ticket.data(), d_db.data(), stream());
        const auto grad_in = download(d_grad_in, in_count, stream());
        for (std::size_t i = 0; i < in_count; ++i) ASSERT_TRUE(same(grad_in[i], expected[i])) << "at " << i;
        const auto got = download(d_db, kC, stream());
        for (int c = 0; c < kC; ++c) ASSERT_TRUE(same(got[c], db[c])) << "bias gradient " << c;
      }
    }
}

// The kernel sums in its own fixed order: any fp32 order of m terms is within
// m * 2^-24 * sum|term| of the exact sum, computed here in float64.
TEST_F(BiasGrad, SumsEachChannel) {
  for (const std::uint32_t n : kBatches)
    for (const Layer layer : kLayers) {
      SCOPED_TRACE(testing::Message() << "batch " << n << " channels " << layer.channels);
      const std::vector<float> dy = uniform(std::size_t{n} * layer.channels * layer.spatial, -1, 1, 6);
      const auto d_dy = upload(dy, stream());
      const auto d_db = unwritten(layer.channels, stream());
      bias_grad(d_dy.data(), d_db.data(), n, layer.channels, layer.spatial, stream());
      const auto db = download(d_db, layer.channels, stream());
      const std::size_t terms = std::size_t{n} * layer.spatial;
      for (int c = 0; c < layer.channels; ++c) {
        double sum = 0, magnitude = 0;
        for (std::size_t k = 0; k < terms; ++k) {
          const float t = bias_grad_term(dy.data(), k, c, layer.channels, layer.spatial);
          sum += t;
          magnitude += std::abs(t);
        }
        ASSERT_NEAR(db[c], sum, static_cast<double>(terms) * 0x1p-24 * magnitude) << "channel " << c;
      }
    }
}

// logprobs and dlogits: the device's expf and logf are within 2 and 1 ulp (CUDA
// Programming Guide, "Mathematical Functions"), glibc's within 1: a few ulp of log_sum in
// all, below 1e-5 of max(1, |value|). The counts are exact; the loss sums within that per row.
TEST_F(Loss, LogSoftmaxNll) {
  for (const std::uint32_t n : {1u, 3u, 64u, 256u, 1000u}) {  // 1000: more rows than threads
    SCOPED_TRACE(testing::Message() << "batch " << n);
    const std::vector<float> z = grid_values(std::size_t{n} * kClasses, 7), bias = grid_values(kClasses, 8);
    std::vector<std::uint8_t> labels(n);
    std::mt19937 rng(n);
    for (auto& l : labels) l = static_cast<std::uint8_t>(rng() % kClasses);
    const std::vector<double> stats0 = {1.5, 2.0, 7.0};  // the kernel adds to the running stats
    const auto d_z = upload(z, stream()), d_bias = upload(bias, stream());
    const auto d_labels = upload(labels, stream());
    const auto d_stats = upload(stats0, stream());
    const auto d_lp = unwritten(z.size(), stream()), d_dl = unwritten(z.size(), stream());
    const float denominator = static_cast<float>(2 * n);
    log_softmax_nll(d_z.data(), d_bias.data(), d_labels.data(), n, denominator, d_lp.data(), d_dl.data(),
                    d_stats.data(), stream());
    const auto lp = download(d_lp, z.size(), stream()), dl = download(d_dl, z.size(), stream());
    const auto stats = download(d_stats, 3, stream());
    std::vector<float> ref_lp(z.size()), ref_dl(z.size());
    double loss = 0, correct = 0, tolerance = 0;
    for (std::uint32_t r = 0; r < n; ++r) {
      const RowLoss row = log_softmax_nll_at(z.data(), bias.data(), labels.data(), r, denominator, ref_lp.data(),
                                             ref_dl.data());
      loss += row.nll;
      correct += row.correct;
      tolerance += 1e-5 * std::max(1.0f, row.nll);
    }
    for (std::size_t i = 0; i < z.size(); ++i) {
      ASSERT_NEAR(lp[i], ref_lp[i], 1e-5 * std::max(1.0f, std::abs(ref_lp[i]))) << "logprob " << i;
      ASSERT_NEAR(dl[i], ref_dl[i], 1e-5 / denominator) << "dlogit " << i;
    }
    EXPECT_NEAR(stats[0], stats0[0] + loss, tolerance);
    EXPECT_EQ(stats[1], stats0[1] + correct);
    EXPECT_EQ(stats[2], stats0[2] + n);
  }
}

// fc2 with the loss and its gradients in one kernel: z bit for bit (fc2_product_at); the
// loss, logprobs, dlogits and stats as log_softmax_nll's kernel makes them from that z
// (the same bits: the same device code); the gradients bit for bit against
// element_ops.hpp from the kernel's own dlogits and dh (expf and logf differ between device and
// host, so those are compared within log_softmax_nll's tolerance above). Without
// gradients, none is written.
TEST_F(Loss, Fc2LossAndItsGradients) {
  constexpr std::size_t kIn = kHidden;
  const std::vector<float> w = uniform(kClasses * kIn, -0.2f, 0.2f, 41), bias = uniform(kClasses, -0.1f, 0.1f, 42);
  const auto d_w = upload(w, stream()), d_bias = upload(bias, stream());
  for (const std::uint32_t n : {1u, 3u, 64u, 256u, 1000u}) {  // 1000: more rows than threads
    for (const bool gradients : {true, false}) {
      SCOPED_TRACE(testing::Message() << "batch " << n << (gradients ? " with gradients" : " forward only"));
      std::vector<float> h = uniform(std::size_t{n} * kIn, -1, 2, 43);
      for (float& v : h) v = v < 0 ? 0.0f : v;  // after a ReLU: about a third are 0
      std::vector<std::uint8_t> labels(n);
      std::mt19937 rng(n);
      for (auto& l : labels) l = static_cast<std::uint8_t>(rng() % kClasses);
      const std::vector<double> stats0 = {1.5, 2.0, 7.0};
      const auto d_h = upload(h, stream());
      const auto d_labels = upload(labels, stream());
      const auto d_stats = upload(stats0, stream()), d_stats_ref = upload(stats0, stream());
      const std::size_t logits = std::size_t{n} * kClasses;
      const auto d_z = unwritten(logits, stream()), d_lp = unwritten(logits, stream()), d_dl = unwritten(logits, stream());
      const auto d_lp_ref = unwritten(logits, stream()), d_dl_ref = unwritten(logits, stream());
      const auto d_dw = unwritten(w.size(), stream()), d_db = unwritten(kClasses, stream());
      const auto d_dh = unwritten(h.size(), stream()), d_dh_bias = unwritten(kIn, stream());
      const float denominator = static_cast<float>(n), scale = 2.0f;
      Fc2LossArgs a;
      a.h = d_h.data();
      a.w = d_w.data();
      a.bias = d_bias.data();
      a.labels = d_labels.data();
      a.rows = n;
      a.denominator = denominator;
      a.z = d_z.data();
      a.logprobs = d_lp.data();
      a.dlogits = d_dl.data();
      a.stats = d_stats.data();
      if (gradients) {
        a.dw = d_dw.data();
        a.db = d_db.data();
        a.dh = d_dh.data();
        a.dh_bias = d_dh_bias.data();
        a.scale = scale;
      }
      fc2_loss(a, stream());
      log_softmax_nll(d_z.data(), d_bias.data(), d_labels.data(), n, denominator, d_lp_ref.data(), d_dl_ref.data(),
                      d_stats_ref.data(), stream());
      const auto z = download(d_z, logits, stream()), dl = download(d_dl, logits, stream());
      for (std::uint32_t r = 0; r < n; ++r)
        for (int k = 0; k < kLogits; ++k)
          ASSERT_TRUE(same(z[r * kClasses + k], fc2_product_at(h.data(), w.data(), r, k))) << "z " << r << " " << k;
      EXPECT_EQ(download(d_lp, logits, stream()), download(d_lp_ref, logits, stream()));
      EXPECT_EQ(dl, download(d_dl_ref, logits, stream()));
      EXPECT_EQ(download(d_stats, 3, stream()), download(d_stats_ref, 3, stream()));
      const auto dw = download(d_dw, w.size(), stream()), db = download(d_db, kClasses, stream());
      const auto dh = download(d_dh, h.size(), stream());
      if (!gradients) {
        for (const float v : dw) ASSERT_TRUE(std::isnan(v)) << "a gradient was written";
        for (const float v : dh) ASSERT_TRUE(std::isnan(v)) << "a gradient was written";
        continue;
      }
      for (int j = 0; j < kLogits * int{kHidden}; ++j)
        ASSERT_TRUE(same(dw[j], fc2_weight_grad_at(dl.data(), h.data(), n, j))) << "dw " << j;
      for (int k = 0; k < kLogits; ++k) ASSERT_TRUE(same(db[k], column_sum_at(dl.data(), n, kLogits, k))) << "db " << k;
      std::size_t passed = 0;
      for (std::size_t i = 0; i < dh.size(); ++i) {
        ASSERT_TRUE(same(dh[i], fc2_input_grad_at(dl.data(), w.data(), h.data(), i, scale))) << "dh " << i;
        passed += dh[i] != 0;
      }
      EXPECT_GT(passed, dh.size() / 2);
      const auto dh_bias = download(d_dh_bias, kIn, stream());
      for (int c = 0; c < int{kHidden}; ++c)
        ASSERT_TRUE(same(dh_bias[c], column_sum_at(dh.data(), n, int{kHidden}, c))) << "fc1's bias gradient " << c;
    }
  }
}

// Bitwise (update_at's explicit roundings), over more elements than one grid covers, for
// every optimizer; the scalars come from begin_update on the device, and a closed gate
// leaves everything as it was.
TEST_F(Update, OptimizerUpdate) {
  constexpr std::size_t kCount = (std::size_t{1} << 24) + 1001;
  const std::vector<float> p0 = uniform(kCount, -1, 1, 9), g = uniform(kCount, -0.1f, 0.1f, 10);
  const std::vector<float> m0 = uniform(kCount, -0.1f, 0.1f, 11), v0 = uniform(kCount, 0.0f, 0.01f, 12);
  std::vector<OptimizerOptions> cases;
  for (const float decay : {0.0f, 5e-4f}) cases.push_back({0.05f, 0.9f, decay});
  cases.push_back({0.05f, 0.9f, 5e-4f, true});
  for (const OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kAdadelta})
    cases.push_back({1e-3, 0.0, 1e-2, false, kind});
  for (const OptimizerOptions& options : cases)
    for (const unsigned long long applied : {0ull, 7ull}) {
      SCOPED_TRACE(testing::Message() << optimizer_name(options.kind) << " weight decay " << options.weight_decay
                                      << " after " << applied << " updates");
      const std::vector<float>& first = options.kind == OptimizerKind::kAdadelta ? v0 : m0;
      const auto d_p = upload(p0, stream()), d_g = upload(g, stream()), d_m = upload(first, stream()),
                 d_v = upload(v0, stream());
      const UpdateValues values = base_values(options);
      DeviceBuffer<double> d_values(2);
      DeviceBuffer<unsigned long long> d_applied(1);
      DeviceBuffer<UpdateScalars> d_scalars(1);
      DeviceBuffer<int> d_gate(1);
      write_update_values(d_values.data(), values.lr, values.momentum, stream());
      CUDA_CHECK(cudaMemcpyAsync(d_applied.data(), &applied, sizeof applied, cudaMemcpyHostToDevice, stream()));
      const int closed = 0;
      CUDA_CHECK(cudaMemcpyAsync(d_gate.data(), &closed, sizeof closed, cudaMemcpyHostToDevice, stream()));
      // A closed gate: nothing moves, the count stays.
      begin_update(options, d_values.data(), d_applied.data(), d_gate.data(), d_scalars.data(), stream());
      optimizer_update(d_p.data(), d_g.data(), d_m.data(), d_v.data(), kCount, d_scalars.data(), stream(),
                       d_gate.data());
      begin_update(options, d_values.data(), d_applied.data(), nullptr, d_scalars.data(), stream());
      optimizer_update(d_p.data(), d_g.data(), d_m.data(), d_v.data(), kCount, d_scalars.data(), stream());
      unsigned long long after = 0;
      CUDA_CHECK(cudaMemcpyAsync(&after, d_applied.data(), sizeof after, cudaMemcpyDeviceToHost, stream()));
      const auto p = download(d_p, kCount, stream()), m = download(d_m, kCount, stream()),
                 v = download(d_v, kCount, stream());
      EXPECT_EQ(after, applied + 1);
      const UpdateScalars scalars = update_scalars(options, values, applied);
      std::vector<float> ref_p = p0, ref_m = first, ref_v = v0;
      for (std::size_t i = 0; i < kCount; ++i) {
        update_at(ref_p.data(), g.data(), ref_m.data(), ref_v.data(), i, scalars);
        ASSERT_TRUE(same(p[i], ref_p[i]) && same(m[i], ref_m[i]) && same(v[i], ref_v[i])) << "at " << i;
      }
    }
}

// The gradients' sum of squares: each float's square is exact in double, so any order of
// m terms is within m * 2^-53 * sum of the exact sum, and the reference here (float64, in
// order) within as much again: 2m * 2^-53 * sum apart at most. The same bits on a second run
// (the guard's decision must not depend on the run); one NaN or infinity anywhere makes the
// sum NaN or infinite. Sizes below a block of 256 threads, below one grid, past it, and the
// model's parameter count.
TEST_F(Norm, SumOfSquares) {
  for (const std::size_t count : {std::size_t{1}, std::size_t{200}, std::size_t{kSquareBlocks} * 256 - 1,
                                  std::size_t{kSquareBlocks} * 256 * 5 + 17, std::size_t{kParamCount}}) {
    SCOPED_TRACE(testing::Message() << count << " elements");
    const std::vector<float> x = uniform(count, -3, 3, 13);
    const auto d_x = upload(x, stream());
    DeviceBuffer<double> scratch(kSquareScratch);
    sum_of_squares(d_x.data(), count, scratch.data(), stream());
    const double first = download(scratch, kSquareScratch, stream())[kSquareBlocks];
    sum_of_squares(d_x.data(), count, scratch.data(), stream());
    const double second = download(scratch, kSquareScratch, stream())[kSquareBlocks];
    double exact = 0;
    for (const float v : x) exact += static_cast<double>(v) * v;
    EXPECT_NEAR(first, exact, 2.0 * static_cast<double>(count) * 0x1p-53 * exact);
    EXPECT_EQ(std::memcmp(&first, &second, sizeof first), 0) << first << " then " << second;
    for (const float bad : {std::nanf(""), INFINITY}) {
      std::vector<float> y = x;
      y[count / 2] = bad;
      const auto d_y = upload(y, stream());
      sum_of_squares(d_y.data(), count, scratch.data(), stream());
      const double sum = download(scratch, kSquareScratch, stream())[kSquareBlocks];
      EXPECT_TRUE(std::isnan(bad) ? std::isnan(sum) : std::isinf(sum)) << sum;
    }
  }
}

// guard_update: its sum of squares is sum_of_squares' bits, on every call (the count of
// finished blocks carries over from call to call); its gate, update count, scalars and
// stats are those of a guarded update: applied while the norm and the pending loss are
// finite, dropped and recorded once when not, and every later step dropped after a halt.
TEST_F(Norm, TheGuardAddsAsSumOfSquaresAndDecides) {
  constexpr std::uint64_t kFirst = 40;
  const std::size_t count = kParamCount;
  const std::vector<float> x = uniform(count, -3, 3, 17);
  std::vector<float> poisoned = x;
  poisoned[count / 3] = std::nanf("");
  const auto d_x = upload(x, stream()), d_poisoned = upload(poisoned, stream());
  DeviceBuffer<double> scratch(kSquareScratch), reference(kSquareScratch), d_stats(kStatCount), d_values(2);
  DeviceBuffer<unsigned> ticket(1);
  DeviceBuffer<int> gate(1);
  DeviceBuffer<unsigned long long> applied(1);
  DeviceBuffer<UpdateScalars> d_scalars(1);
  CUDA_CHECK(cudaMemsetAsync(d_stats.data(), 0, d_stats.bytes(), stream()));
  CUDA_CHECK(cudaMemsetAsync(ticket.data(), 0, ticket.bytes(), stream()));
  CUDA_CHECK(cudaMemsetAsync(applied.data(), 0, applied.bytes(), stream()));
  const OptimizerOptions sgd{0.01f, 0.9f, 0.0f};
  write_update_values(d_values.data(), 0.01, 0.9, stream());
  sum_of_squares(d_x.data(), count, reference.data(), stream());
  const double expected = download(reference, kSquareScratch, stream())[kSquareBlocks];
  const auto guard = [&](const float* grads, bool halt) {
    guard_update(grads, count, scratch.data(), ticket.data(), {d_stats.data(), kFirst, halt, gate.data()}, sgd,
                 d_values.data(), applied.data(), d_scalars.data(), stream());
  };
  for (std::uint64_t k = 0; k < 3; ++k) {
    SCOPED_TRACE(testing::Message() << "call " << k);
    guard(d_x.data(), true);
    const double total = download(scratch, kSquareScratch, stream())[kSquareBlocks];
    EXPECT_EQ(std::memcmp(&total, &expected, sizeof total), 0) << total << " against " << expected;
    EXPECT_EQ(download(gate, 1, stream())[0], 1);
    EXPECT_EQ(download(applied, 1, stream())[0], k + 1);
    const UpdateScalars got = download(d_scalars, 1, stream())[0], want = update_scalars(sgd, {0.01, 0.9}, k);
    EXPECT_EQ(got.lr, want.lr);
    EXPECT_EQ(got.momentum, want.momentum);
    EXPECT_EQ(got.first, want.first);
  }
  guard(d_poisoned.data(), true);  // update 3: dropped, recorded, halts
  guard(d_x.data(), true);         // update 4: dropped after the halt
  const std::vector<double> stats = download(d_stats, kStatCount, stream());
  EXPECT_EQ(download(gate, 1, stream())[0], 0);
  EXPECT_EQ(download(applied, 1, stream())[0], 3u);
  EXPECT_EQ(stats[kStatUpdates], 5);
  EXPECT_EQ(stats[kStatSkipped], 2);
  EXPECT_EQ(stats[kStatNonFinite], 1);
  EXPECT_EQ(stats[kStatNonFiniteStep], static_cast<double>(kFirst + 3));
  EXPECT_TRUE(std::isnan(stats[kStatNonFiniteNorm]));
  EXPECT_EQ(stats[kStatHalted], 1);
}

// ---- cuDNN and cuBLAS ----

// fp32 without TF32, but cuDNN may pick FFT or Winograd algorithms, whose rounding is
// bounded by the magnitudes over a whole tile rather than term by term (about 1e-6 of the
// sums of |terms| in the tile for these shapes), and cuBLAS may split long sums. So a
// value may differ by 1e-4 of its sum of |terms|, but at least of a quarter of the largest
// such sum (map borders have fewer terms than the tiles they share); a wrong layout,
// transpose or channel offset moves values by a large part of those sums.
constexpr double kLibraryTolerance = 1e-4;

void expect_close(const std::vector<float>& got, const Reference& ref, const char* what) {
  const double floor = *std::max_element(ref.magnitude.begin(), ref.magnitude.end()) / 4;
  double largest = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], ref.value[i], kLibraryTolerance * std::max(ref.magnitude[i], floor)) << what << " at " << i;
    largest = std::max(largest, std::abs(ref.value[i]));
  }
  EXPECT_GT(largest, 40 * kLibraryTolerance * floor) << what << ": values too small for the tolerance to tell";
}

constexpr ConvShape kConv2{int{kConv1Channels}, int{kConv2Channels}, int{kConv1Side}, 3};
constexpr std::size_t kWorkspaceCap = std::size_t{512} << 20;

// cuDNN's forward, backward filter and backward data of one convolution (conv.cpp) against
// the float64 reference.
void expect_conv_matches_reference(cudaStream_t stream, const ConvShape& shape) {
  const CudnnOwner cudnn = make_cudnn(stream);
  for (const std::uint32_t n : kBatches) {
    SCOPED_TRACE(testing::Message() << "batch " << n << " channels " << shape.in_channels << "->"
                                  << shape.out_channels);
    const std::size_t in = shape.in_side, out = shape.out_side();
    const std::vector<float> x = uniform(std::size_t{n} * shape.in_channels * in * in, -1, 1, 12);
    const std::vector<float> w = uniform(std::size_t(shape.out_channels) * shape.in_channels * 9, -0.5f, 0.5f, 13);
    const std::vector<float> dy = uniform(std::size_t{n} * shape.out_channels * out * out, -1, 1, 14);
    const auto ref = testing_reference::conv_reference(
        {n, std::size_t(shape.in_channels), std::size_t(shape.out_channels), in, std::size_t(shape.kernel)}, x, w, dy);
    const auto d_x = upload(x, stream), d_w = upload(w, stream), d_dy = upload(dy, stream);
    // Tuned at this batch (cuDNN's timed choice), then tuned at the largest and run at
    // this one (its heuristics' choice, as for an evaluation's last batch).
    for (const bool tuned_here : {true, false}) {
      if (!tuned_here && n == kBatches[3]) continue;
      SCOPED_TRACE(tuned_here ? "timed" : "heuristic");
      Conv2d conv(shape, BackendOptions{});
      const std::size_t bytes = conv.tune(cudnn.get(), static_cast<int>(tuned_here ? n : kBatches[3]), kWorkspaceCap);
      const DeviceBuffer<std::uint8_t> ws(std::max<std::size_t>(bytes, 256));
      const Workspace space{ws.data(), ws.bytes()};
      const auto d_y = unwritten(dy.size(), stream), d_dw = unwritten(w.size(), stream);
      const auto d_dx = unwritten(x.size(), stream);
      const int rows = static_cast<int>(n);
      conv.forward(cudnn.get(), rows, d_x.data(), d_w.data(), d_y.data(), space);
      conv.backward_filter(cudnn.get(), rows, d_x.data(), d_dy.data(), d_dw.data(), space);
      conv.backward_data(cudnn.get(), rows, d_w.data(), d_dy.data(), d_dx.data(), space);
      expect_close(download(d_y, dy.size(), stream), ref.y, "forward");
      expect_close(download(d_dw, w.size(), stream), ref.dw, "backward filter");
      expect_close(download(d_dx, x.size(), stream), ref.dx, "backward data");
    }
  }
}

TEST_F(Conv2, ForwardAndBackward) { expect_conv_matches_reference(stream(), kConv2); }

// A timed choice is kept in the algorithm cache and found again by a later convolution (a
// later run): the cache file's choice for batch 64, rewritten to the implicit GEMM
// algorithms (which need no workspace), is what the next tune() takes, and its results
// still match the reference; a cached choice cuDNN does not list as allowed here is timed
// again and replaced. Deterministic convolutions neither read nor write the cache.
TEST_F(Conv2, ATimedChoiceIsFoundAgainInTheAlgorithmCache) {
  namespace fs = std::filesystem;
  const fs::path file = fs::temp_directory_path() / ("mnist_mt_cudnn_cache_" + std::to_string(::getpid()) + ".txt");
  fs::remove(file);
  const CudnnOwner cudnn = make_cudnn(stream());
  constexpr int kN = 64;
  {
    AlgoCache cache(file);
    Conv2d conv(kConv2, BackendOptions{}, &cache);
    conv.tune(cudnn.get(), kN, kWorkspaceCap);
    ASSERT_TRUE(conv.choice(kN));
  }
  const auto rewrite = [&](const std::string& values) {
    std::ifstream in(file);
    std::string header, line;
    std::getline(in, header);
    std::getline(in, line);
    ASSERT_NE(line.find("batch 64"), std::string::npos) << line;
    std::ofstream(file) << header << "\n" << line.substr(0, line.find('\t')) << "\t" << values << "\n";
  };
  const std::string fma = std::to_string(static_cast<int>(CUDNN_FMA_MATH));
  rewrite("0 " + fma + " 0 " + fma + " 0 " + fma);  // IMPLICIT_GEMM and the ALGO_0s, FMA math
  {
    AlgoCache cache(file);
    Conv2d conv(kConv2, BackendOptions{}, &cache);
    const std::size_t bytes = conv.tune(cudnn.get(), kN, kWorkspaceCap);
    const int m = CUDNN_FMA_MATH;
    EXPECT_EQ(conv.choice(kN), (ConvChoice{0, m, 0, m, 0, m}));
    const std::vector<float> x = uniform(std::size_t{kN} * kConv1Channels * kConv1Side * kConv1Side, -1, 1, 12);
    const std::vector<float> w = uniform(std::size_t{kConv2Channels} * kConv1Channels * 9, -0.5f, 0.5f, 13);
    const auto ref = testing_reference::conv_reference({kN, kConv1Channels, kConv2Channels, kConv1Side, 3}, x, w, {});
    const auto d_x = upload(x, stream()), d_w = upload(w, stream());
    const auto d_y = unwritten(ref.y.value.size(), stream());
    const DeviceBuffer<std::uint8_t> ws(std::max<std::size_t>(bytes, 256));
    conv.forward(cudnn.get(), kN, d_x.data(), d_w.data(), d_y.data(), {ws.data(), ws.bytes()});
    expect_close(download(d_y, ref.y.value.size(), stream()), ref.y, "forward, cached algorithm");
  }
  // An algorithm cuDNN does not know, a math type that is none, TF32 math in an fp32 run:
  // each is timed again and replaced.
  const std::string tensor_op = std::to_string(static_cast<int>(CUDNN_TENSOR_OP_MATH));
  for (const std::string& bad : {"99 " + fma + " 0 " + fma + " 0 " + fma, "0 7 0 " + fma + " 0 " + fma,
                                 "0 " + tensor_op + " 0 " + fma + " 0 " + fma}) {
    SCOPED_TRACE(bad);
    rewrite(bad);
    AlgoCache cache(file);
    Conv2d conv(kConv2, BackendOptions{}, &cache);
    conv.tune(cudnn.get(), kN, kWorkspaceCap);
    EXPECT_EQ(conv.choice(kN)->forward_math, static_cast<int>(CUDNN_FMA_MATH));
    std::ifstream in(file);
    std::string header, line;
    std::getline(in, header);
    std::getline(in, line);
    EXPECT_EQ(line.substr(line.find('\t') + 1).rfind(bad, 0), std::string::npos) << "replaced: " << line;
  }
  {
    const auto before = fs::last_write_time(file);
    AlgoCache cache(fs::temp_directory_path() / "mnist_mt_no_such_dir_for_cache" / "x.txt");
    BackendOptions deterministic;
    deterministic.deterministic = true;
    Conv2d conv(kConv2, deterministic, &cache);
    conv.tune(cudnn.get(), kN, kWorkspaceCap);
    EXPECT_FALSE(fs::exists(fs::temp_directory_path() / "mnist_mt_no_such_dir_for_cache"));
    EXPECT_EQ(fs::last_write_time(file), before);
  }
  fs::remove(file);
}

// conv1's own kernels (conv1.cu) bit for bit against element_ops.hpp's reference, which
// test_cuda_reference checks against the CPU backend's conv1: forward with bias and ReLU
// (a NaN input passes to its outputs), and the weight and bias gradients, twice at each
// batch with one scratch and count of finished blocks, whose grid changes with the batch.
TEST_F(Conv1, OwnKernelsMatchTheirReferenceBitwise) {
  constexpr std::size_t kOut = std::size_t{kConv1Channels} * kConv1Side * kConv1Side;
  DeviceBuffer<float> sums(std::size_t{kBatches[3]} * kConv1Channels * kConv1Sums);
  DeviceBuffer<unsigned> ticket(1);
  CUDA_CHECK(cudaMemsetAsync(ticket.data(), 0, ticket.bytes(), stream()));
  const std::vector<float> w = uniform(kConv1Channels * 9, -0.5f, 0.5f, 21), b = uniform(kConv1Channels, -0.3f, 0.3f, 22);
  const auto d_w = upload(w, stream()), d_b = upload(b, stream());
  for (const std::uint32_t n : kBatches) {
    SCOPED_TRACE(testing::Message() << "batch " << n);
    std::vector<float> x = uniform(std::size_t{n} * kImageBytes, -1, 1, 23);
    std::vector<float> x_nan = x;
    sprinkle_nan(x_nan, 997, 1);
    for (const std::vector<float>* input : {&x_nan, &x}) {
      const auto d_x = upload(*input, stream());
      const auto d_out = unwritten(n * kOut, stream());
      conv1_forward(d_x.data(), d_w.data(), d_b.data(), n, d_out.data(), stream());
      const auto out = download(d_out, n * kOut, stream());
      for (std::size_t i = 0; i < out.size(); ++i)
        ASSERT_TRUE(same(out[i], conv1_forward_at(input->data(), w.data(), b.data(), i))) << "output " << i;
    }
    std::vector<float> a1(n * kOut);
    for (std::size_t i = 0; i < a1.size(); ++i) a1[i] = conv1_forward_at(x.data(), w.data(), b.data(), i);
    const std::vector<float> d_out = uniform(a1.size(), -1, 1, 24);
    std::vector<float> planes(std::size_t{n} * kConv1Channels * kConv1Sums), dw(w.size()), db(b.size());
    for (std::size_t p = 0; p < std::size_t{n} * kConv1Channels; ++p)
      conv1_plane_sums(x.data(), a1.data(), d_out.data(), p, planes.data() + p * kConv1Sums);
    for (int j = 0; j < int{kConv1Channels} * kConv1Sums; ++j) conv1_grad_total_at(planes.data(), n, j, dw.data(), db.data());
    const auto d_x = upload(x, stream()), d_a1 = upload(a1, stream()), d_dout = upload(d_out, stream());
    for (int call = 0; call < 2; ++call) {
      SCOPED_TRACE(testing::Message() << "call " << call);
      const auto d_dw = unwritten(w.size(), stream()), d_db = unwritten(b.size(), stream());
      conv1_backward(d_x.data(), d_a1.data(), d_dout.data(), n, sums.data(), ticket.data(), d_dw.data(), d_db.data(),
                     stream());
      EXPECT_EQ(download(d_dw, w.size(), stream()), dw);
      EXPECT_EQ(download(d_db, b.size(), stream()), db);
    }
    EXPECT_EQ(download(d_dout, a1.size(), stream()), d_out) << "the output gradient is read only";
  }
}

struct FcShape {
  int in;
  int out;
};

TEST_F(Fc, ForwardAndBackward) {
  cublasHandle_t raw = nullptr;
  CUBLAS_CHECK(cublasCreate(&raw));
  const CublasOwner cublas(raw);
  CUBLAS_CHECK(cublasSetStream(raw, stream()));
  CUBLAS_CHECK(cublasSetMathMode(raw, CUBLAS_DEFAULT_MATH));  // fp32, as the replica without TF32
  for (const FcShape fc : {FcShape{int{kFlat}, int{kHidden}}, FcShape{int{kHidden}, 10}})
    for (const std::uint32_t n : kBatches) {
      SCOPED_TRACE(testing::Message() << "batch " << n << " " << fc.in << "->" << fc.out);
      const std::size_t in = fc.in, out = fc.out;
      const std::vector<float> x = uniform(n * in, -1, 1, 15), w = uniform(out * in, -0.1f, 0.1f, 16);
      const std::vector<float> dy = uniform(n * out, -1, 1, 17);
      Reference y(n * out), dw(out * in), dx(n * in);
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t o = 0; o < out; ++o)
          for (std::size_t i = 0; i < in; ++i) {
            y.add(r * out + o, double{x[r * in + i]} * w[o * in + i]);
            dw.add(o * in + i, double{dy[r * out + o]} * x[r * in + i]);
            dx.add(r * in + i, double{dy[r * out + o]} * w[o * in + i]);
          }
      const auto d_x = upload(x, stream()), d_w = upload(w, stream()), d_dy = upload(dy, stream());
      const auto d_y = unwritten(y.value.size(), stream()), d_dw = unwritten(w.size(), stream());
      const auto d_dx = unwritten(x.size(), stream());
      const int rows = static_cast<int>(n);
      linear_forward(raw, d_x.data(), d_w.data(), d_y.data(), rows, fc.in, fc.out);
      linear_backward_weight(raw, d_x.data(), d_dy.data(), d_dw.data(), rows, fc.in, fc.out);
      linear_backward_data(raw, d_w.data(), d_dy.data(), d_dx.data(), rows, fc.in, fc.out);
      expect_close(download(d_y, y.value.size(), stream()), y, "forward");
      expect_close(download(d_dw, w.size(), stream()), dw, "backward weight");
      expect_close(download(d_dx, x.size(), stream()), dx, "backward data");
    }
}

}  // namespace
}  // namespace mnist_mt::cuda
