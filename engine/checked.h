// checked.h: arithmetic on numbers that come from outside the program (flags, data files, checkpoints).
//
// A shape, a batch size or an offset read from a user can be anything, and a product or sum of two such
// numbers that wraps around int64 turns into a small, wrong size (a buffer too short, a bounds check that
// passes). Every such product, sum and double -> integer conversion goes through these helpers: each throws an
// engine::Error naming `what` (the flag, file or field), the values and the limit, instead of wrapping. `what`
// is a C string so that the common, fitting case builds no message (shapes do the same in engine/tensor.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "engine/error.h"

namespace engine {

inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  ENGINE_CHECK(!__builtin_mul_overflow(a, b, &r), what, ": ", a, " x ", b, " does not fit a 64-bit integer");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  ENGINE_CHECK(!__builtin_add_overflow(a, b, &r), what, ": ", a, " + ", b, " does not fit a 64-bit integer");
  return r;
}

inline size_t checked_mul(size_t a, size_t b, const char* what) {
  size_t r = 0;
  ENGINE_CHECK(!__builtin_mul_overflow(a, b, &r), what, ": ", a, " x ", b, " bytes does not fit a 64-bit size");
  return r;
}

// A number read as a double (JSON, a flag) as an integer in [lo, hi]: NaN, infinities, fractions and values
// outside the range are Errors naming `what`.
inline int64_t to_integer(double v, int64_t lo, int64_t hi, const char* what) {
  ENGINE_CHECK(std::isfinite(v) && v == std::floor(v), what, ": expected a whole number, got ", v);
  ENGINE_CHECK(v >= double(lo) && v <= double(hi), what, ": ", v, " is outside [", lo, ", ", hi, "]");
  return int64_t(v);
}

}  // namespace engine
