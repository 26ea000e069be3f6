#pragma once
// Test-only seam of the loader, kept out of the public header: a loader whose pipeline
// calls before_gather(step) on a pipeline thread before it gathers each step. An
// exception the hook throws reaches the consumers through next().
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "mnist_mt/loader.hpp"

namespace mnist_mt {

struct LoaderTesting {
  static std::unique_ptr<Loader> with_before_gather(const Split& split, const LoaderOptions& options,
                                                    std::function<void(std::uint32_t step)> before_gather) {
    return std::unique_ptr<Loader>(new Loader(split, options, std::move(before_gather)));
  }
};

}  // namespace mnist_mt
