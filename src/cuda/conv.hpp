#pragma once
// A 3x3 stride-1 unpadded convolution through cuDNN (NCHW, fp32): forward, backward
// data, backward filter. Algorithms are chosen once per batch size the run prepares
// (tune(): the largest at setup, then each other the replica is prepared for, such as an
// evaluation's last batch): timed by cuDNN, or taken from the algorithm cache
// (algo_cache.hpp) where an earlier run timed them on this GPU and library; by cuDNN's
// heuristics when deterministic (a timed choice could differ from run to run) and for a
// batch never prepared; always within the workspace allocated at setup.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "algo_cache.hpp"
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
    int math = 0;  // the cudnnMathType_t it was chosen with
    ConvDescOwner conv;
  };

  // Made on the GPU it runs on (the current device). `cache`: where timed choices are
  // found and kept (null: none).
  Conv2d(const ConvShape& shape, const BackendOptions& options, AlgoCache* cache = nullptr);

  // Chooses the algorithms for batch `n` among those allowed that fit in `cap` bytes,
  // unless chosen already: the cache's, else the fastest as timed by cuDNN (which
  // allocates what it needs to try them), kept in the cache; or its heuristics' first
  // when deterministic. Returns the workspace bytes they need.
  std::size_t tune(cudnnHandle_t handle, int n, std::size_t cap);
  // The algorithms chosen for batch `n`, as the cache keeps them; nullopt before.
  std::optional<ConvChoice> choice(int n) const;

  void forward(cudnnHandle_t handle, int n, const float* x, const float* w, float* y, const Workspace& ws);
  void backward_filter(cudnnHandle_t handle, int n, const float* x, const float* dy, float* dw,
                       const Workspace& ws);
  void backward_data(cudnnHandle_t handle, int n, const float* w, const float* dy, float* dx,
                     const Workspace& ws);

 private:
  struct Plan {
    int n;
    std::size_t bytes;  // workspace
    TensorDescOwner x;
    TensorDescOwner y;
    Choice<cudnnConvolutionFwdAlgo_t> forward;
    Choice<cudnnConvolutionBwdFilterAlgo_t> filter;
    Choice<cudnnConvolutionBwdDataAlgo_t> data;
  };
  enum class Search { kTimed, kHeuristic };

  const Plan* find(int n) const;  // batch n's plan, or null
  // The first allowed algorithms of `search` within `limit` bytes (throws when there are
  // none); with `want`, those of the cached choice if `search` lists them as allowed here
  // within the limit, else nullopt.
  std::optional<Plan> make_plan(cudnnHandle_t handle, int n, Search search, std::size_t limit,
                                const ConvChoice* want = nullptr) const;
  const Plan& plan(cudnnHandle_t handle, int n, std::size_t limit);
  std::string cache_key(int n, std::size_t limit) const;

  ConvShape shape_;
  bool deterministic_;
  bool tf32_;
  FilterDescOwner filter_;
  ConvDescOwner conv_;  // searched with; each choice runs with its own (Choice::conv)
  AlgoCache* cache_;
  std::string device_key_;  // the GPU and the libraries, for cache keys
  std::vector<Plan> plans_;
};

}  // namespace mnist_mt::cuda
