#pragma once
// What the Winograd transforms of conv2 (conv2_winograd.cpp, conv2_winograd_f2.cpp) share: a
// two-dimensional transform made of a one-dimensional one, and the offset of an element
// in the ISA's blocked activation layout.
#include <cstddef>

namespace mnist_mt::cpu {

// out = F_rows(F_cols(in)): in is R x C, out R' x C'. F is a function object mapping an
// array of R (then C) values to R' (then C'), inlined into each ISA's entry point (a
// lambda would not take on the entry point's target attribute).
template <class F, std::size_t R, std::size_t C, std::size_t R2, std::size_t C2, class T>
[[gnu::always_inline]] inline void separable(const T (&in)[R][C], T (&out)[R2][C2]) {
  const F f;
  T mid[R2][C];
  for (std::size_t j = 0; j < C; ++j) {
    T col[R], res[R2];
    for (std::size_t i = 0; i < R; ++i) col[i] = in[i][j];
    f(col, res);
    for (std::size_t i = 0; i < R2; ++i) mid[i][j] = res[i];
  }
  for (std::size_t i = 0; i < R2; ++i) f(mid[i], out[i]);
}

// Offset of (image, channel block, y, x) in an nChw{B}c map of `channels` x side x side.
template <std::size_t B>
constexpr std::size_t at_blocked(std::size_t channels, std::size_t side, std::size_t n, std::size_t cb, std::size_t y,
                                 std::size_t x) {
  return (((n * (channels / B) + cb) * side + y) * side + x) * B;
}

}  // namespace mnist_mt::cpu
