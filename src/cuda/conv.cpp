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

// An algorithm and math type to take again (a cached choice), or none: the first allowed.
struct Wanted {
  int algo = -1;
  int math = 0;
};

// cuDNN lists candidates best first; takes the first allowed one (or the wanted one, if
// cuDNN lists it as allowed here) whose workspace, queried with a descriptor of its own
// math type, fits; raises `bytes` to what it needs. nullopt when there is none.
template <typename Perf, typename Count, typename Search, typename WorkspaceOf>
auto choose(cudnnHandle_t handle, const Selection& s, Count count, Search search, WorkspaceOf workspace_of,
            std::size_t& bytes, const std::optional<Wanted>& want)
    -> std::optional<Conv2d::Choice<decltype(Perf{}.algo)>> {
  int max = 0;
  CUDNN_CHECK(count(handle, &max));
  std::vector<Perf> perfs(static_cast<std::size_t>(max));
  int found = 0;
  CUDNN_CHECK(search(max, &found, perfs.data()));
  for (int i = 0; i < found; ++i) {
    const Perf& p = perfs[static_cast<std::size_t>(i)];
    if (want && (static_cast<int>(p.algo) != want->algo || static_cast<int>(p.mathType) != want->math)) continue;
    if (!allowed(p, s)) continue;
    ConvDescOwner desc = make_conv_desc(p.mathType);
    std::size_t need = 0;
    if (workspace_of(desc.get(), p.algo, &need) != CUDNN_STATUS_SUCCESS || need > s.limit) continue;
    bytes = std::max(bytes, need);
    return Conv2d::Choice<decltype(Perf{}.algo)>{p.algo, static_cast<int>(p.mathType), std::move(desc)};
  }
  return std::nullopt;
}

// What a timed choice depends on besides the convolution: the GPU, its compute
// capability and multiprocessors (a MIG slice has fewer), the driver, cuDNN and CUDA
// runtime versions.
std::string device_key() {
  int device = 0, runtime = 0, driver = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  return std::string(p.name) + " sm" + std::to_string(p.major) + std::to_string(p.minor) + " x" +
         std::to_string(p.multiProcessorCount) + " driver " + std::to_string(driver) + " cudnn " +
         std::to_string(cudnnGetVersion()) + " cuda " + std::to_string(runtime);
}

}  // namespace

Conv2d::Conv2d(const ConvShape& shape, const BackendOptions& options, AlgoCache* cache)
    : shape_(shape),
      deterministic_(options.deterministic),
      tf32_(options.tf32),
      filter_(make_filter_desc(shape.out_channels, shape.in_channels, shape.kernel, shape.kernel)),
      // FMA math keeps fp32 convolutions off TF32 tensor cores, which cuDNN's default
      // math would use on Ampere and later.
      conv_(make_conv_desc(options.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH)),
      cache_(options.deterministic ? nullptr : cache),
      device_key_(cache_ != nullptr ? device_key() : std::string()) {}

std::string Conv2d::cache_key(int n, std::size_t limit) const {
  return device_key_ + " | conv " + std::to_string(shape_.in_channels) + "x" + std::to_string(shape_.in_side) + "^2 -> " +
         std::to_string(shape_.out_channels) + " k" + std::to_string(shape_.kernel) + " dgrad" +
         " | batch " + std::to_string(n) + " | workspace " + std::to_string(limit) + " | " + (tf32_ ? "tf32" : "fma");
}

std::optional<Conv2d::Plan> Conv2d::make_plan(cudnnHandle_t handle, int n, Search search, std::size_t limit,
                                              const ConvChoice* want) const {
  const Selection s{search == Search::kTimed, deterministic_, tf32_, limit};
  // The cached choice's algorithm and math of one pass, if there is a cached choice.
  const auto wanted = [want](int ConvChoice::*algo, int ConvChoice::*math) -> std::optional<Wanted> {
    if (want == nullptr) return std::nullopt;
    return Wanted{want->*algo, want->*math};
  };
  std::size_t bytes = 0;
  Plan p{n,
         0,
         make_tensor_desc(n, shape_.in_channels, shape_.in_side, shape_.in_side),
         make_tensor_desc(n, shape_.out_channels, shape_.out_side(), shape_.out_side()),
         {},
         {},
         {}};
  const cudnnTensorDescriptor_t x = p.x.get(), y = p.y.get();
  const cudnnFilterDescriptor_t w = filter_.get();
  const cudnnConvolutionDescriptor_t conv = conv_.get();
  const auto missing = [&](const char* what) -> std::optional<Plan> {
    if (want) return std::nullopt;
    throw RuntimeFailure(std::string("cuDNN offers no convolution ") + what + " algorithm" +
                         (s.deterministic ? " that is deterministic" : "") + (s.tf32 ? "" : " without TF32") +
                         " within " + std::to_string(s.limit) + " bytes of workspace");
  };

  auto forward = choose<cudnnConvolutionFwdAlgoPerf_t>(
      handle, s, cudnnGetConvolutionForwardAlgorithmMaxCount,
      [&](int max, int* found, cudnnConvolutionFwdAlgoPerf_t* perfs) {
        return s.timed ? cudnnFindConvolutionForwardAlgorithm(handle, x, w, conv, y, max, found, perfs)
                       : cudnnGetConvolutionForwardAlgorithm_v7(handle, x, w, conv, y, max, found, perfs);
      },
      [&](cudnnConvolutionDescriptor_t d, cudnnConvolutionFwdAlgo_t algo, std::size_t* size) {
        return cudnnGetConvolutionForwardWorkspaceSize(handle, x, w, d, y, algo, size);
      },
      bytes, wanted(&ConvChoice::forward, &ConvChoice::forward_math));
  if (!forward) return missing("forward");
  p.forward = std::move(*forward);

  auto filter = choose<cudnnConvolutionBwdFilterAlgoPerf_t>(
      handle, s, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
      [&](int max, int* found, cudnnConvolutionBwdFilterAlgoPerf_t* perfs) {
        return s.timed ? cudnnFindConvolutionBackwardFilterAlgorithm(handle, x, y, conv, w, max, found, perfs)
                       : cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, x, y, conv, w, max, found, perfs);
      },
      [&](cudnnConvolutionDescriptor_t d, cudnnConvolutionBwdFilterAlgo_t algo, std::size_t* size) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, x, y, d, w, algo, size);
      },
      bytes, wanted(&ConvChoice::filter, &ConvChoice::filter_math));
  if (!filter) return missing("backward-filter");
  p.filter = std::move(*filter);

  auto data = choose<cudnnConvolutionBwdDataAlgoPerf_t>(
      handle, s, cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
      [&](int max, int* found, cudnnConvolutionBwdDataAlgoPerf_t* perfs) {
        return s.timed ? cudnnFindConvolutionBackwardDataAlgorithm(handle, w, y, conv, x, max, found, perfs)
                       : cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, w, y, conv, x, max, found, perfs);
      },
      [&](cudnnConvolutionDescriptor_t d, cudnnConvolutionBwdDataAlgo_t algo, std::size_t* size) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, w, y, d, x, algo, size);
      },
      bytes, wanted(&ConvChoice::data, &ConvChoice::data_math));
  if (!data) return missing("backward-data");
  p.data = std::move(*data);
  p.bytes = bytes;
  return p;
}

const Conv2d::Plan* Conv2d::find(int n) const {
  for (const Plan& p : plans_)
    if (p.n == n) return &p;
  return nullptr;
}

std::size_t Conv2d::tune(cudnnHandle_t handle, int n, std::size_t cap) {
  if (const Plan* p = find(n)) return p->bytes;
  // Timings vary from run to run, and so would a timed choice: deterministic runs take
  // cuDNN's heuristics, which choose the same algorithms every time, and no cache.
  if (deterministic_) {
    plans_.push_back(*make_plan(handle, n, Search::kHeuristic, cap));
    return plans_.back().bytes;
  }
  // A cached choice is taken only where cuDNN's heuristics list each of its algorithms,
  // with its math type, as supported and allowed here (no TF32 into an fp32 run), and
  // within the workspace; else the candidates are timed again and the entry replaced.
  const std::string key = cache_ != nullptr ? cache_key(n, cap) : std::string();
  if (cache_ != nullptr) {
    if (const std::optional<ConvChoice> c = cache_->find(key)) {
      if (std::optional<Plan> p = make_plan(handle, n, Search::kHeuristic, cap, &*c)) {
        plans_.push_back(std::move(*p));
        return plans_.back().bytes;
      }
    }
  }
  plans_.push_back(*make_plan(handle, n, Search::kTimed, cap));
  if (cache_ != nullptr) cache_->store(key, *choice(n));
  return plans_.back().bytes;
}

std::optional<ConvChoice> Conv2d::choice(int n) const {
  const Plan* p = find(n);
  if (p == nullptr) return std::nullopt;
  return ConvChoice{static_cast<int>(p->forward.algo), p->forward.math, static_cast<int>(p->filter.algo),
                    p->filter.math, static_cast<int>(p->data.algo), p->data.math};
}

const Conv2d::Plan& Conv2d::plan(cudnnHandle_t handle, int n, std::size_t limit) {
  if (const Plan* p = find(n)) return *p;
  plans_.push_back(*make_plan(handle, n, Search::kHeuristic, limit));
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
