#pragma once
// Digit images for `predict`: PNG (libpng) or binary PGM (read strictly here), made 28x28 grey.
#include <array>
#include <cstdint>
#include <filesystem>

#include "mnist_mt/model.hpp"

namespace mnist_mt {

using DigitImage = std::array<std::uint8_t, kImageBytes>;

// Colour is converted to grey and transparency composited onto black; any other size
// than 28x28 is resized by area averaging (each output pixel the mean of the source
// area it covers; the aspect ratio is not kept). Pixels are taken as MNIST's are:
// white digit on black. PGM samples are scaled by the maxval to 0..255. Throws
// InputError("<path>: <problem>"), also for pixel data shorter (or, PGM, longer) than
// the header says, a PGM maxval of 0 or a sample above it, a PNG palette index past
// the palette.
DigitImage load_digit_image(const std::filesystem::path& path);

// Area-averaging resize of a width x height grey image to 28x28.
DigitImage resize_area(const std::uint8_t* grey, std::uint32_t width, std::uint32_t height);

}  // namespace mnist_mt
