#pragma once
// A 3x3 stride-1 unpadded convolution through cuDNN (NCHW, fp32): forward, backward
// data, backward filter. Algorithms are chosen once per batch size: at setup for the
// largest batch (timed by cuDNN, or by its heuristics when deterministic), by its
// heuristics for any smaller batch met later (the last batch of an evaluation), always
// within the workspace allocated at setup.
#include <cstddef>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "owners.hpp"

namespace mnist_mt::cuda {

struct ConvShape {
  int in_channels;
  int out_channels;
  int in_side;
  int kernel;
  constexpr int out_side() const { return in_side - kernel + 1; }
};

struct Workspace {
  void* data;
  std::size_t bytes;
};

class Conv2d {
 public:
  // An algorithm and the convolution descriptor set to the math type it was chosen with
  // (as PyTorch does): the descriptor's math type is part of what selects the kernel.
  template <typename Algo>
  struct Choice {
    Algo algo{};
    ConvDescOwner conv;
  };

  Conv2d(const ConvShape& shape, const BackendOptions& options, bool data_grad);

  // Chooses the algorithms for batch `n` among those allowed that fit in `cap` bytes:
  // the fastest as timed by cuDNN (which allocates what it needs to try them), or its
  // heuristics' first when deterministic. Returns the workspace bytes they need.
  std::size_t tune(cudnnHandle_t handle, int n, std::size_t cap);

  void forward(cudnnHandle_t handle, int n, const float* x, const float* w, float* y, const Workspace& ws);
  void backward_filter(cudnnHandle_t handle, int n, const float* x, const float* dy, float* dw,
                       const Workspace& ws);
  void backward_data(cudnnHandle_t handle, int n, const float* w, const float* dy, float* dx,
                     const Workspace& ws);

 private:
  struct Plan {
    int n;
    TensorDescOwner x;
    TensorDescOwner y;
    Choice<cudnnConvolutionFwdAlgo_t> forward;
    Choice<cudnnConvolutionBwdFilterAlgo_t> filter;
    Choice<cudnnConvolutionBwdDataAlgo_t> data;
  };
  enum class Search { kTimed, kHeuristic };

  Plan make_plan(cudnnHandle_t handle, int n, Search search, std::size_t limit, std::size_t& bytes) const;
  const Plan& plan(cudnnHandle_t handle, int n, std::size_t limit);

  ConvShape shape_;
  bool deterministic_;
  bool tf32_;
  bool data_grad_;
  FilterDescOwner filter_;
  ConvDescOwner conv_;  // searched with; each choice runs with its own (Choice::conv)
  std::vector<Plan> plans_;
};

}  // namespace mnist_mt::cuda
