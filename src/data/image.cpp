#include "mnist_mt/image.hpp"

#include <png.h>
#include <stb_image.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "file_io.hpp"
#include "mnist_mt/error.hpp"

namespace mnist_mt {
namespace {

namespace fs = std::filesystem;

constexpr std::uint32_t kMaxSide = 8192;  // bounds the memory a header can ask for
constexpr std::uint64_t kMaxFileBytes = std::uint64_t{256} << 20;

[[noreturn]] void fail(const fs::path& path, const std::string& problem) {
  throw InputError(path.string() + ": " + problem);
}

void check_size(const fs::path& path, std::uint64_t width, std::uint64_t height) {
  if (width == 0 || height == 0 || width > kMaxSide || height > kMaxSide) {
    fail(path, std::to_string(width) + "x" + std::to_string(height) + " pixels; sides must be 1 to " +
                   std::to_string(kMaxSide));
  }
}

// libpng's simplified API: any PNG to 8-bit grey, alpha composited onto black.
DigitImage decode_png(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  struct Free {
    png_image* image;
    ~Free() { png_image_free(image); }
  } free_image{&image};
  if (png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()) == 0) fail(path, image.message);
  check_size(path, image.width, image.height);
  image.format = PNG_FORMAT_GRAY;
  std::vector<std::uint8_t> grey(PNG_IMAGE_SIZE(image));
  const png_color black{0, 0, 0};
  if (png_image_finish_read(&image, &black, grey.data(), 0, nullptr) == 0) fail(path, image.message);
  return resize_area(grey.data(), image.width, image.height);
}

// stb_image for binary PGM (P5); it reads the header's maxval and scales to 8 bits.
DigitImage decode_pgm(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  int width = 0, height = 0, channels = 0;
  const int len = static_cast<int>(bytes.size());
  if (stbi_info_from_memory(bytes.data(), len, &width, &height, &channels) == 0) {
    fail(path, std::string("not a valid PGM image: ") + stbi_failure_reason());
  }
  check_size(path, width, height);
  const std::unique_ptr<stbi_uc, decltype(&stbi_image_free)> grey(
      stbi_load_from_memory(bytes.data(), len, &width, &height, &channels, 1), stbi_image_free);
  if (!grey) fail(path, std::string("cannot decode the PGM image: ") + stbi_failure_reason());
  return resize_area(grey.get(), width, height);
}

}  // namespace

DigitImage load_digit_image(const fs::path& path) {
  const std::vector<std::uint8_t> bytes = read_file_bytes(path, kMaxFileBytes);
  static constexpr std::uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPngSignature, 8) == 0) return decode_png(path, bytes);
  if (bytes.size() >= 2 && bytes[0] == 'P' && bytes[1] == '5') return decode_pgm(path, bytes);
  if (bytes.size() >= 2 && bytes[0] == 'P' && bytes[1] == '2') {
    fail(path, "plain (ASCII, P2) PGM is not supported; use binary PGM (P5) or PNG");
  }
  fail(path, "not a PNG or binary PGM (P5) image");
}

DigitImage resize_area(const std::uint8_t* grey, std::uint32_t width, std::uint32_t height) {
  DigitImage out{};
  // Output pixel (x, y) covers source [x*w/28, (x+1)*w/28) x [y*h/28, (y+1)*h/28);
  // each source pixel is weighted by the part of it inside, in units of 1/28 pixel.
  const std::uint64_t side = kImageSide;
  for (std::uint64_t y = 0; y < side; ++y) {
    for (std::uint64_t x = 0; x < side; ++x) {
      const std::uint64_t x0 = x * width, x1 = (x + 1) * width;    // in 1/28 source pixels
      const std::uint64_t y0 = y * height, y1 = (y + 1) * height;
      std::uint64_t sum = 0;
      for (std::uint64_t sy = y0 / side; sy * side < y1; ++sy) {
        const std::uint64_t wy = std::min(y1, (sy + 1) * side) - std::max(y0, sy * side);
        for (std::uint64_t sx = x0 / side; sx * side < x1; ++sx) {
          const std::uint64_t wx = std::min(x1, (sx + 1) * side) - std::max(x0, sx * side);
          sum += wx * wy * grey[sy * width + sx];
        }
      }
      const std::uint64_t area = std::uint64_t{width} * height;  // (x1-x0)*(y1-y0)
      out[y * side + x] = static_cast<std::uint8_t>((sum + area / 2) / area);
    }
  }
  return out;
}

}  // namespace mnist_mt
