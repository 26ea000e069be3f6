// libFuzzer target: the IDX reader on arbitrary bytes, as images and as labels. The
// first byte picks which; with FUZZ_GZIP the rest is gzip-compressed first, so the
// fuzzer explores the decompressed contents through the gzip path. Bad input must be an
// InputError; anything else (a crash, a sanitizer report, another exception) is a finding.
#include <zlib.h>

#include <cstdint>
#include <vector>

#include "fuzz_file.hpp"
#include "mnist_mt/error.hpp"
#include "data/idx.hpp"

namespace {

std::vector<std::uint8_t> gzip(const std::uint8_t* data, std::size_t size) {
  z_stream z{};
  deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: gzip wrapper
  std::vector<std::uint8_t> out(deflateBound(&z, size) + 32);
  z.next_in = const_cast<std::uint8_t*>(data);
  z.avail_in = static_cast<uInt>(size);
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool images = data[0] & 1;
#ifdef FUZZ_GZIP
  const std::vector<std::uint8_t> packed = gzip(data + 1, size - 1);
  const auto& path = mnist_mt::fuzz::write_input(packed.data(), packed.size());
#else
  const auto& path = mnist_mt::fuzz::write_input(data + 1, size - 1);
#endif
  try {
    if (images) {
      const mnist_mt::IdxImages read = mnist_mt::read_idx_images(path);
      if (read.pixels.size() != std::size_t{read.count} * read.rows * read.cols) __builtin_trap();
    } else {
      mnist_mt::read_idx_labels(path);
    }
  } catch (const mnist_mt::InputError&) {
  }
  return 0;
}
