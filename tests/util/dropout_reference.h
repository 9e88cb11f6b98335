// dropout_reference.h: the dropout draw restated for tests from its definition (engine/rng.h), on top of the
// Philox block alone (tests/engine/rng_test.cpp checks that against Random123's known answers), so the tests
// of dropout, attention and the kernels compare against the definition, not against the engine's helpers.
//
//   element e of a dropout draw at generator offset `off` is 16-bit half e % 2 (low first) of 32-bit number
//   off + e / 2 (number n: word n % 4 of Philox-4x32-7's block n / 4, counter (n / 4, 0), key = seed); kept
//   iff half >= ceil(p * 65536); kept elements are scaled by 65536 / (65536 - ceil(p * 65536)).
#pragma once
#include <cmath>
#include <cstdint>

#include "engine/rng.h"

namespace testutil {

inline bool dropout_keeps(uint64_t seed, uint64_t offset, uint64_t e, double p) {
  const uint64_t number = offset + e / 2;
  const uint64_t block = number / 4;
  const uint32_t ctr[4] = {uint32_t(block), uint32_t(block >> 32), 0u, 0u};
  const uint32_t key[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  uint32_t r[4];
  engine::philox4x32_rounds<7>(ctr, key, r);
  const uint32_t half = e % 2 == 0 ? r[number % 4] & 0xffffu : r[number % 4] >> 16;
  return double(half) >= std::ceil(p * 65536.0);
}

inline double dropout_scale(double p) { return 65536.0 / (65536.0 - std::ceil(p * 65536.0)); }

// x's element e after dropout at p.
inline double dropout_reference(double x, double p, uint64_t seed, uint64_t offset, uint64_t e) {
  return dropout_keeps(seed, offset, e, p) ? x * dropout_scale(p) : 0.0;
}

}  // namespace testutil
