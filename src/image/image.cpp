#include "mnist_mt/image.hpp"

#include <png.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "mnist_mt/file_io.hpp"
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

// A read of a PNG in memory by libpng's simplified API: its header read on construction,
// freed on destruction; a failure names the file.
class PngRead {
 public:
  PngRead(const fs::path& path, const std::vector<std::uint8_t>& bytes) : path_(path) {
    image_.version = PNG_IMAGE_VERSION;
    if (png_image_begin_read_from_memory(&image_, bytes.data(), bytes.size()) == 0) {
      const std::string message = image_.message;
      png_image_free(&image_);
      fail(path, message);
    }
  }
  PngRead(const PngRead&) = delete;
  PngRead& operator=(const PngRead&) = delete;
  ~PngRead() { png_image_free(&image_); }

  png_image& image() { return image_; }
  // The pixels in image().format, into buffer (and the palette into colormap).
  void finish(const png_color* background, void* buffer, void* colormap) {
    if (png_image_finish_read(&image_, background, buffer, 0, colormap) == 0) fail(path_, image_.message);
  }

 private:
  const fs::path& path_;
  png_image image_{};
};

// libpng maps a palette index past the palette to black without a word; such a file
// is refused. The colour-mapped read hands over the indices as they are in the file.
void check_palette_indices(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  PngRead read(path, bytes);
  png_image& image = read.image();
  const std::uint32_t entries = image.colormap_entries;
  image.format = PNG_FORMAT_RGBA_COLORMAP;
  std::vector<std::uint8_t> indices(PNG_IMAGE_SIZE(image));
  std::vector<std::uint8_t> colormap(PNG_IMAGE_COLORMAP_SIZE(image));
  read.finish(nullptr, indices.data(), colormap.data());
  const auto bad = std::find_if(indices.begin(), indices.end(), [&](std::uint8_t i) { return i >= entries; });
  if (bad != indices.end())
    fail(path, "palette index " + std::to_string(*bad) + " at pixel " + std::to_string(bad - indices.begin()) +
                   " is past the " + std::to_string(entries) + "-entry palette");
}

// libpng's simplified API: any PNG to 8-bit grey, alpha composited onto black.
DigitImage decode_png(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  PngRead read(path, bytes);
  png_image& image = read.image();
  check_size(path, image.width, image.height);
  if ((image.format & PNG_FORMAT_FLAG_COLORMAP) != 0) check_palette_indices(path, bytes);
  image.format = PNG_FORMAT_GRAY;
  std::vector<std::uint8_t> grey(PNG_IMAGE_SIZE(image));
  const png_color black{0, 0, 0};
  read.finish(&black, grey.data(), nullptr);
  return resize_area(grey.data(), image.width, image.height);
}

bool pgm_space(std::uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

// The next number of a PGM header, after whitespace and '#' comments (to the end of the
// line); nothing when there is none or it is over 32 bits. `at` moves past it.
std::optional<std::uint32_t> pgm_number(const std::vector<std::uint8_t>& bytes, std::size_t& at) {
  while (at < bytes.size() && (pgm_space(bytes[at]) || bytes[at] == '#')) {
    if (bytes[at] == '#')
      while (at < bytes.size() && bytes[at] != '\n' && bytes[at] != '\r') ++at;
    else
      ++at;
  }
  std::uint64_t value = 0;
  const std::size_t first = at;
  for (; at < bytes.size() && bytes[at] >= '0' && bytes[at] <= '9'; ++at) {
    value = value * 10 + (bytes[at] - '0');
    if (value > std::numeric_limits<std::uint32_t>::max()) return std::nullopt;
  }
  if (at == first) return std::nullopt;
  return static_cast<std::uint32_t>(value);
}

// Binary PGM (P5) as Netpbm defines it, read here rather than by a lenient decoder:
// width, height and maxval (1 to 65535), one whitespace byte, then exactly width x height
// samples of one byte (two, big-endian, when maxval > 255), none above maxval. Samples
// are scaled to 0..255.
DigitImage decode_pgm(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  std::size_t at = 2;  // past "P5"
  std::array<std::uint32_t, 3> header{};
  static constexpr std::array<const char*, 3> kNames = {"width", "height", "maxval"};
  for (std::size_t i = 0; i < header.size(); ++i) {
    const std::optional<std::uint32_t> value = pgm_number(bytes, at);
    if (!value) fail(path, std::string("PGM header has no valid ") + kNames[i]);
    header[i] = *value;
  }
  const auto [width, height, maxval] = header;
  if (at == bytes.size() || !pgm_space(bytes[at])) fail(path, "PGM header: no whitespace after the maxval");
  ++at;
  check_size(path, width, height);
  if (maxval == 0 || maxval > 65535) fail(path, "PGM maxval " + std::to_string(maxval) + " is not 1 to 65535");
  const std::size_t sample_bytes = maxval > 255 ? 2 : 1;
  const std::uint64_t pixels = std::uint64_t{width} * height;
  const std::uint64_t needed = pixels * sample_bytes, present = bytes.size() - at;
  if (present < needed)
    fail(path, "PGM pixel data truncated: " + std::to_string(present) + " bytes, the " + std::to_string(width) + "x" +
                   std::to_string(height) + " header needs " + std::to_string(needed));
  if (present > needed)
    fail(path, std::to_string(present - needed) + " bytes after the PGM pixel data (" + std::to_string(needed) +
                   " bytes for " + std::to_string(width) + "x" + std::to_string(height) + ")");
  std::vector<std::uint8_t> grey(pixels);
  const std::uint8_t* data = bytes.data() + at;
  for (std::size_t i = 0; i < pixels; ++i) {
    const std::uint32_t value = sample_bytes == 1 ? data[i] : (std::uint32_t{data[2 * i]} << 8) | data[2 * i + 1];
    if (value > maxval)
      fail(path, "PGM sample " + std::to_string(value) + " at pixel " + std::to_string(i) + " exceeds the maxval " +
                     std::to_string(maxval));
    grey[i] = static_cast<std::uint8_t>((value * 255 + maxval / 2) / maxval);
  }
  return resize_area(grey.data(), width, height);
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
