#pragma once
// A stream that waits for the host without blocking a host thread: the stream runs a
// one-thread kernel that polls a word of pinned host memory until the host has written
// `value` or more (the staged communicator, staged_communicator.cpp). No CUDA header.
#include <cstdint>

struct CUstream_st;

namespace mnist_mt::cuda {

// `word` is pinned host memory (cudaMallocHost: mapped into every device under unified
// addressing). Work enqueued on `stream` after this starts once *word >= value.
void wait_for_host(const std::uint32_t* word, std::uint32_t value, CUstream_st* stream);

}  // namespace mnist_mt::cuda
