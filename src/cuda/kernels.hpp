#pragma once
// Host launchers of our own kernels (the .cu files beside this header). Each enqueues on
// `stream` and checks the launch. No CUDA header here, so plain C++ code includes it.
#include <cstddef>
#include <cstdint>

#include "mnist_mt/optimizer.hpp"
#include "mnist_mt/philox.hpp"

struct CUstream_st;

namespace mnist_mt::cuda {

using StreamHandle = CUstream_st*;  // cudaStream_t

// The dropout applied to a layer's output, keyed as docs/architecture.md decision 9: the element of
// row r is kept when dropout_keep(seed, epoch, samples[r], stream, element, p), element
// being its index within the row (PyTorch's flatten order). p == 0: no dropout.
struct DropoutArgs {
  const std::uint32_t* samples = nullptr;  // device: the global sample index of each row
  std::uint64_t seed = 0;
  std::uint32_t epoch = 0;
  RandomStream stream = RandomStream::kDropout0;
  float p = 0.0f;
  float scale = 1.0f;  // 1/(1-p), applied to kept elements
  // device: when given, the epoch is read from here instead (a recorded step's input
  // upload carries its batch's epoch, so one recording serves every epoch)
  const std::uint32_t* epoch_at = nullptr;
};

// out = (images/255 - mean) / std, elementwise.
void normalize_images(const std::uint8_t* images, float* out, std::size_t count, float mean, float std,
                      StreamHandle stream);
// A batch gathered from a split held in device memory: row r of out (kImageBytes floats)
// is image samples[r] of split_images normalised as above, and labels_out[r] =
// split_labels[samples[r]] (element_ops.hpp: gather_normalize_at).
void gather_images(const std::uint8_t* split_images, const std::uint8_t* split_labels, const std::uint32_t* samples,
                   std::uint32_t rows, float* out, std::uint8_t* labels_out, float mean, float std,
                   StreamHandle stream);
// A rank's epoch of samples on the device: plan[kPlanEpoch] is the epoch,
// plan[kPlanStep] the step the next gather_planned() takes, from plan + kPlanHeader on
// `rows` samples a step.
inline constexpr std::uint32_t kPlanEpoch = 0, kPlanStep = 1, kPlanHeader = 2;
// gather_images() of step plan[kPlanStep]'s rows, whose sample indices also go to
// samples_out (they key dropout); then plan[kPlanStep] is advanced by one. Two kernels.
void gather_planned(std::uint32_t* plan, std::uint32_t rows, const std::uint8_t* split_images,
                    const std::uint8_t* split_labels, float* out, std::uint32_t* samples_out,
                    std::uint8_t* labels_out, float mean, float std, StreamHandle stream);

// conv1's nine taps, and the sums conv1_backward keeps per plane: the nine weights' and
// the bias's.
inline constexpr int kConv1Taps = 9;
inline constexpr int kConv1Sums = kConv1Taps + 1;

// conv1 with its bias and ReLU: out[rows][32][26][26] from x[rows][28][28] (normalised),
// w[32][9], b[32] (element_ops.hpp: conv1_forward_at).
void conv1_forward(const float* x, const float* w, const float* b, std::uint32_t rows, float* out,
                   StreamHandle stream);
// conv1's weight and bias gradients (dw[32][9], db[32]) from its input x, its output `out`
// (after the ReLU) and the gradient at that output d_out, ReLU's backward applied (d_out is
// not written). `partial`: rows * 32 * 10 floats of scratch; `ticket`: one unsigned, zero
// when first used, kept for this scratch's later calls. Deterministic.
void conv1_backward(const float* x, const float* out, const float* d_out, std::uint32_t rows, float* partial,
                    unsigned* ticket, float* dw, float* db, StreamHandle stream);

// In place on y[rows][channels][spatial]: y = dropout(relu(y + bias[channel])).
void bias_relu_dropout(float* y, const float* bias, std::uint32_t rows, int channels, int spatial,
                       const DropoutArgs& dropout, StreamHandle stream);
// In place: grad = out > 0 ? grad * scale : 0, where out = dropout(relu(.)) of the forward
// pass; an element passes only if it was kept and positive.
void relu_dropout_backward(const float* out, float* grad, std::size_t count, float scale, StreamHandle stream);

// a2[rows][channels][2side][2side] = relu(a2 + bias[channel]) in place (conv2's bias and
// ReLU), and out[rows][channels][side][side] = dropout(max over its 2x2 windows).
void bias_relu_max_pool_dropout(float* a2, const float* bias, float* out, std::uint32_t rows, int channels, int side,
                                const DropoutArgs& dropout, StreamHandle stream);
// Writes every element of grad_in: each window's gradient goes to its first maximum, and
// only where the forward output is positive (kept by dropout, and by the ReLU before
// the pool). `in` and `out` are the forward pass's a2 (after the ReLU) and output. Also
// db[c], the sum of grad_in over rows and positions of channel c (conv2's bias
// gradient), deterministic: `partial` holds rows * channels floats of scratch, `ticket`
// one unsigned, zero when first used, kept for this scratch's later calls.
void max_pool_dropout_backward(const float* in, const float* out, const float* grad_out, float* grad_in,
                               std::uint32_t rows, int channels, int side, float scale, float* partial,
                               unsigned* ticket, float* db, StreamHandle stream);

// db[c] = sum over rows and spatial of dy[rows][channels][spatial], in a fixed order.
void bias_grad(const float* dy, float* db, std::uint32_t rows, int channels, int spatial, StreamHandle stream);

// From the fc2 product z[rows][10] and its bias: logprobs = log_softmax(z + bias);
// dlogits = (softmax - onehot(label)) / denominator; stats[0] += sum of NLL,
// stats[1] += correct argmaxes, stats[2] += rows (the replica passes its pending stats).
// Deterministic.
void log_softmax_nll(const float* z, const float* bias, const std::uint8_t* labels, std::uint32_t rows,
                     float denominator, float* logprobs, float* dlogits, double* stats, StreamHandle stream);

// fc2, the loss and their gradients in one kernel (one block, like log_softmax_nll): from
// fc1's output h[rows][128] (after its ReLU and dropout), z = h w^T (w: [10][128]; z
// without the bias, as logits() holds it), then log_softmax_nll's logprobs, dlogits and
// stats; with `dw` given also fc2's weight and bias gradients (dw, db), the gradient at
// fc1's output before its ReLU and dropout (dh, with that backward's `scale`) and fc1's
// bias gradient from it (dh_bias).
struct Fc2LossArgs {
  const float* h = nullptr;
  const float* w = nullptr;
  const float* bias = nullptr;
  const std::uint8_t* labels = nullptr;
  std::uint32_t rows = 0;
  float denominator = 1.0f;
  float* z = nullptr;
  float* logprobs = nullptr;
  float* dlogits = nullptr;
  double* stats = nullptr;  // stats[0..2] += loss, correct, rows
  float* dw = nullptr;      // null: the forward and the loss only
  float* db = nullptr;
  float* dh = nullptr;
  float* dh_bias = nullptr;
  float scale = 1.0f;
};
void fc2_loss(const Fc2LossArgs& args, StreamHandle stream);
// One block does all of fc2_loss's work, which grows with the rows: the replica runs it up
// to this many rows a call, and cuBLAS's products with log_softmax_nll beyond.
inline constexpr std::uint32_t kFc2LossMaxRows = 256;

// The optimizer's update. Its learning rate and momentum (SGD) or beta1 (Adam) are read
// from device memory, two doubles that write_update_values() sets before each update,
// so that a recorded step (a CUDA graph) replays under a schedule's changing values.
void write_update_values(double* values, double lr, double momentum, StreamHandle stream);
// One thread, before an update: its scalars (optimizer.hpp's update_scalars) from
// `options`, `values` and the updates applied so far (*applied), which advances when the
// update runs (`gate` null or non-zero).
void begin_update(const OptimizerOptions& options, const double* values, unsigned long long* applied, const int* gate,
                  UpdateScalars* scalars, StreamHandle stream);
// The update of `count` parameters from the device's `scalars` (update_at); `first` and
// `second`: the optimizer's state buffers. `gate`, when given, is a device flag: the
// update runs only where it is non-zero.
void optimizer_update(float* params, const float* grads, float* first, float* second, std::size_t count,
                      const UpdateScalars* scalars, StreamHandle stream, const int* gate = nullptr);

// The replica's statistics on the device, doubles: what a snapshot copies out and
// resets (the first kStatsReported), then the forwards since the last update
// (log_softmax_nll's stats), the halt flag and the guarded updates so far, which
// snapshots leave.
enum Stat : std::size_t {
  kStatLoss, kStatCorrect, kStatSamples, kStatSkipped, kStatNonFinite, kStatNonFiniteStep, kStatNonFiniteLoss,
  kStatNonFiniteNorm, kStatsReported, kStatPending = kStatsReported, kStatHalted = kStatPending + 3, kStatUpdates,
  kStatCount
};
// Adds the pending stats to the reported ones (before a snapshot).
void commit_stats(double* stats, StreamHandle stream);

// The sum of x[i]^2 in double, reproducible bit for bit. `scratch` holds kSquareScratch
// doubles; the sum is left in scratch[kSquareBlocks].
inline constexpr unsigned kSquareBlocks = 128;
inline constexpr std::size_t kSquareScratch = kSquareBlocks + 1;
void sum_of_squares(const float* x, std::size_t count, double* scratch, StreamHandle stream);

// A guarded update's decision (Replica::guarded_update): whether the update runs
// (*gate), from the gradients' sum of squares and the pending loss; the pending stats
// are committed or dropped. The update is step first_step + stats[kStatUpdates], which
// advances.
struct GuardArgs {
  double* stats = nullptr;  // the replica's (Stat)
  std::uint64_t first_step = 0;
  bool halt = false;        // a non-finite step halts the replica (--on-nan stop)
  int* gate = nullptr;
};
// One kernel before a guarded update: the sum of squares of grads[count] as
// sum_of_squares() adds it (the same bits, left in scratch[kSquareBlocks]; `scratch`
// holds kSquareScratch doubles), the decision, and begin_update()'s scalars under that
// gate. `ticket`: one unsigned, zero when first used, kept for this buffer's later calls.
void guard_update(const float* grads, std::size_t count, double* scratch, unsigned* ticket, const GuardArgs& guard,
                  const OptimizerOptions& options, const double* values, unsigned long long* applied,
                  UpdateScalars* scalars, StreamHandle stream);

// Keeps `stream` busy for about `microseconds`, doing nothing: a benchmark queues the
// work it times behind it, so that the device, not the host's launches, sets the pace.
void spin(double microseconds, StreamHandle stream);

// The local group's reduction (Device::reduce): out[j][i] = in[0][i] + in[1][i] + ... in
// that order, an average divided by `divisor` as the CPU backend divides, for every out.
// At most kReduceBuffers inputs and as many outputs; an output may be an input.
inline constexpr std::size_t kReduceBuffers = 32;
void reduce_in_order(const float* const* in, std::size_t inputs, float* const* out, std::size_t outputs,
                     std::size_t count, bool average, std::size_t divisor, StreamHandle stream);

}  // namespace mnist_mt::cuda
