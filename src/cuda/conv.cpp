#include "conv.hpp"

#include <algorithm>
#include <string>

#include "errors.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt::cuda {
namespace {

struct Selection {
  bool timed;          // cudnnFind* (runs every algorithm) or the *_v7 heuristics
  bool deterministic;  // --deterministic
  bool tf32;           // tensor-op (TF32) kernels allowed
  std::size_t limit;   // workspace bytes
};

// Without TF32 only FMA math: cuDNN's default math lets fp32 convolutions use TF32
// tensor cores on Ampere and later, and its results report it as CUDNN_DEFAULT_MATH.
template <typename Perf>
bool allowed(const Perf& p, const Selection& s) {
  if (p.status != CUDNN_STATUS_SUCCESS) return false;
  if (s.deterministic && p.determinism != CUDNN_DETERMINISTIC) return false;
  return s.tf32 || p.mathType == CUDNN_FMA_MATH;
}

// cuDNN lists candidates best first; takes the first allowed one whose workspace fits,
// with a descriptor of its math type, and raises `bytes` to what it needs.
template <typename Perf, typename Count, typename Search, typename WorkspaceOf>
auto choose(cudnnHandle_t handle, const Selection& s, Count count, Search search, WorkspaceOf workspace_of,
            std::size_t& bytes, const char* what) -> Conv2d::Choice<decltype(Perf{}.algo)> {
  int max = 0;
  CUDNN_CHECK(count(handle, &max));
  std::vector<Perf> perfs(static_cast<std::size_t>(max));
  int found = 0;
  CUDNN_CHECK(search(max, &found, perfs.data()));
  for (int i = 0; i < found; ++i) {
    const Perf& p = perfs[static_cast<std::size_t>(i)];
    std::size_t need = 0;
    if (!allowed(p, s) || workspace_of(p.algo, &need) != CUDNN_STATUS_SUCCESS || need > s.limit) continue;
    bytes = std::max(bytes, need);
    return {p.algo, make_conv_desc(p.mathType)};
  }
  throw RuntimeFailure(std::string("cuDNN offers no convolution ") + what + " algorithm" +
                       (s.deterministic ? " that is deterministic" : "") + (s.tf32 ? "" : " without TF32") +
                       " within " + std::to_string(s.limit) + " bytes of workspace");
}

}  // namespace

Conv2d::Conv2d(const ConvShape& shape, const BackendOptions& options, bool data_grad)
    : shape_(shape),
      deterministic_(options.deterministic),
      tf32_(options.tf32),
      data_grad_(data_grad),
      filter_(make_filter_desc(shape.out_channels, shape.in_channels, shape.kernel, shape.kernel)),
      // FMA math keeps fp32 convolutions off TF32 tensor cores, which cuDNN's default
      // math would use on Ampere and later.
      conv_(make_conv_desc(options.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH)) {}

Conv2d::Plan Conv2d::make_plan(cudnnHandle_t handle, int n, Search search, std::size_t limit,
                               std::size_t& bytes) const {
  const Selection s{search == Search::kTimed, deterministic_, tf32_, limit};
  Plan p{n,
         make_tensor_desc(n, shape_.in_channels, shape_.in_side, shape_.in_side),
         make_tensor_desc(n, shape_.out_channels, shape_.out_side(), shape_.out_side()),
         {},
         {},
         {}};
  const cudnnTensorDescriptor_t x = p.x.get(), y = p.y.get();
  const cudnnFilterDescriptor_t w = filter_.get();
  const cudnnConvolutionDescriptor_t conv = conv_.get();

  p.forward = choose<cudnnConvolutionFwdAlgoPerf_t>(
      handle, s, cudnnGetConvolutionForwardAlgorithmMaxCount,
      [&](int max, int* found, cudnnConvolutionFwdAlgoPerf_t* perfs) {
        return s.timed ? cudnnFindConvolutionForwardAlgorithm(handle, x, w, conv, y, max, found, perfs)
                       : cudnnGetConvolutionForwardAlgorithm_v7(handle, x, w, conv, y, max, found, perfs);
      },
      [&](cudnnConvolutionFwdAlgo_t algo, std::size_t* size) {
        return cudnnGetConvolutionForwardWorkspaceSize(handle, x, w, conv, y, algo, size);
      },
      bytes, "forward");

  p.filter = choose<cudnnConvolutionBwdFilterAlgoPerf_t>(
      handle, s, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
      [&](int max, int* found, cudnnConvolutionBwdFilterAlgoPerf_t* perfs) {
        return s.timed ? cudnnFindConvolutionBackwardFilterAlgorithm(handle, x, y, conv, w, max, found, perfs)
                       : cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, x, y, conv, w, max, found, perfs);
      },
      [&](cudnnConvolutionBwdFilterAlgo_t algo, std::size_t* size) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, x, y, conv, w, algo, size);
      },
      bytes, "backward-filter");

  if (data_grad_) {
    p.data = choose<cudnnConvolutionBwdDataAlgoPerf_t>(
        handle, s, cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
        [&](int max, int* found, cudnnConvolutionBwdDataAlgoPerf_t* perfs) {
          return s.timed ? cudnnFindConvolutionBackwardDataAlgorithm(handle, w, y, conv, x, max, found, perfs)
                         : cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, w, y, conv, x, max, found, perfs);
        },
        [&](cudnnConvolutionBwdDataAlgo_t algo, std::size_t* size) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, w, y, conv, x, algo, size);
        },
        bytes, "backward-data");
  }
  return p;
}

std::size_t Conv2d::tune(cudnnHandle_t handle, int n, std::size_t cap) {
  std::size_t bytes = 0;
  // Timings vary from run to run, and so would a timed choice: deterministic runs take
  // cuDNN's heuristics, which choose the same algorithms every time.
  plans_.push_back(make_plan(handle, n, deterministic_ ? Search::kHeuristic : Search::kTimed, cap, bytes));
  return bytes;
}

const Conv2d::Plan& Conv2d::plan(cudnnHandle_t handle, int n, std::size_t limit) {
  for (const Plan& p : plans_)
    if (p.n == n) return p;
  std::size_t bytes = 0;
  plans_.push_back(make_plan(handle, n, Search::kHeuristic, limit, bytes));
  return plans_.back();
}

void Conv2d::forward(cudnnHandle_t handle, int n, const float* x, const float* w, float* y, const Workspace& ws) {
  const Plan& p = plan(handle, n, ws.bytes);
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnConvolutionForward(handle, &one, p.x.get(), x, filter_.get(), w, p.forward.conv.get(), p.forward.algo, ws.data,
                                      ws.bytes, &zero, p.y.get(), y));
}

void Conv2d::backward_filter(cudnnHandle_t handle, int n, const float* x, const float* dy, float* dw,
                             const Workspace& ws) {
  const Plan& p = plan(handle, n, ws.bytes);
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, &one, p.x.get(), x, p.y.get(), dy, p.filter.conv.get(), p.filter.algo,
                                             ws.data, ws.bytes, &zero, filter_.get(), dw));
}

void Conv2d::backward_data(cudnnHandle_t handle, int n, const float* w, const float* dy, float* dx,
                           const Workspace& ws) {
  const Plan& p = plan(handle, n, ws.bytes);
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &one, filter_.get(), w, p.y.get(), dy, p.data.conv.get(), p.data.algo,
                                           ws.data, ws.bytes, &zero, p.x.get(), dx));
}

}  // namespace mnist_mt::cuda
