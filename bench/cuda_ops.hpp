#pragma once
// op/cuda/<operation>/batch:B rows of bench_step (CUDA builds only): each operation of one
// GPU replica's training step on its own, as replica.cpp enqueues it, in µs per call.

#include <memory>

namespace mnist_mt {

// Registers the rows on GPU 0; call only where a CUDA device exists. Keep what it returns
// (the rows' device buffers) until the benchmarks have run, and release it before exit.
std::shared_ptr<void> register_cuda_ops();

}  // namespace mnist_mt
