// rng.h: a counter-based random number generator (Philox-4x32, Salmon et al. 2011).
//
// A random number is a pure function of (seed, counter): no state is carried from one number to the next.
// So a dropout mask is regenerated exactly from the (seed, offset) it was drawn at, on any device and in
// any order: recomputation (activation checkpointing) and the CUDA kernels reproduce the cpu's masks.
//
// Element i of a draw made at generator offset `off` (a multiple of 4) uses Philox block (off + i) / 4,
// lane (off + i) % 4, keyed by the seed. A uniform float in [0, 1) keeps the top 24 bits. Dropout's keep
// decisions use each 32-bit number as two 16-bit ones (dropout_bits below): 8 decisions per Philox block.
// Two round counts: uniform draws (initialization, synthetic data, noise, drop path) use Random123's default,
// Philox-4x32-10; dropout's keep decisions use Philox-4x32-7 (dropout_block below).
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

namespace engine {

#if defined(__CUDACC__)
#define ENGINE_HD __host__ __device__ __forceinline__
#else
#define ENGINE_HD inline
#endif

// The generator with R rounds: 128-bit counter, 64-bit key (Random123's philox4x32_R; 10 is its default).
template <int R>
ENGINE_HD void philox4x32_rounds(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < R; r++) {
    // One round: (c0, c1, c2, c3) <- (hi(B*c2)^c1^k0, lo(B*c2), hi(A*c0)^c3^k1, lo(A*c0)).
    uint64_t a = uint64_t(0xD2511F53u) * c0;
    uint64_t b = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(b >> 32) ^ c1 ^ k0;
    uint32_t n2 = uint32_t(a >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = uint32_t(b);
    c2 = n2;
    c3 = uint32_t(a);
    k0 += 0x9E3779B9u;  // key schedule (Weyl sequence)
    k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}
ENGINE_HD void philox4x32_10_full(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  philox4x32_rounds<10>(ctr, key, out);
}

// The engine's use: key = seed, counter = (block, 0).
template <int R>
ENGINE_HD void philox_block(uint64_t seed, uint64_t block, uint32_t out[4]) {
  const uint32_t ctr[4] = {uint32_t(block), uint32_t(block >> 32), 0u, 0u};
  const uint32_t key[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  philox4x32_rounds<R>(ctr, key, out);
}
ENGINE_HD void philox4x32_10(uint64_t seed, uint64_t block, uint32_t out[4]) { philox_block<10>(seed, block, out); }

// Dropout's Philox block: the same counter and key with 7 rounds. Random123's authors found 7 the fewest rounds
// of Philox-4x32 that pass all of TestU01's BigCrush (10 keeps a margin), and FlashAttention-2, PyTorch's flash
// SDPA backend, draws its dropout with 7. A keep decision is one comparison, so on a GPU the rounds' integer
// multiplies are what dropout costs (inside flash attention they bound the forward): 7 rounds cost 0.7 of 10.
ENGINE_HD void dropout_block(uint64_t seed, uint64_t block, uint32_t out[4]) { philox_block<7>(seed, block, out); }

// One 32-bit Philox output as a uniform float in [0, 1) (its top 24 bits). Kernels that use all four lanes
// of a block convert each with this, so they draw exactly what philox_uniform does.
ENGINE_HD float philox_bits_to_uniform(uint32_t bits) { return float(bits >> 8) * (1.0f / 16777216.0f); }

// Uniform in [0, 1) for element i of a draw at `offset`.
ENGINE_HD float philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t n = offset + i;
  uint32_t r[4];
  philox4x32_10(seed, n >> 2, r);
  return philox_bits_to_uniform(r[n & 3]);
}

// ---------------------------------------------------------------------------------------------------
// Dropout's draws: 16-bit numbers.
//
// A keep decision needs one comparison, not a 24-bit uniform, and on a GPU the Philox rounds' integer
// multiplies are what dropout costs (inside flash attention they took more time than the matrix products).
// So dropout reads each 32-bit number as two 16-bit ones: element e of a dropout draw made at generator
// offset `off` is the low (e even) or high (e odd) half of number off + e / 2, number n being word n % 4 of
// dropout_block(seed, n / 4). With off a multiple of 4 (the generator reserves in fours), elements 8k .. 8k + 7
// are the 8 halves of block off / 4 + k, in order.
// Element e is kept iff its half >= DropoutRate::threshold = ceil(p * 2^16): the drop probability is p
// rounded up to a multiple of 2^-16 (p_q; 0.1 becomes 0.1000061), and kept elements are multiplied by
// 1 / (1 - p_q), so the expectation is the input's exactly. A draw of n elements reserves ceil(n / 2) numbers.
struct DropoutRate {
  uint32_t threshold = 0;  // keep iff the element's 16-bit number >= threshold (2^16: nothing is kept)
  double keep_scale = 1;   // 1 / (1 - p_q); 0 when nothing is kept
};

inline DropoutRate dropout_rate(double p) {
  DropoutRate r;
  const double t = std::ceil(p * 65536.0);  // p * 2^16 is exact in double
  r.threshold = t <= 0 ? 0u : t >= 65536 ? 65536u : uint32_t(t);
  r.keep_scale = r.threshold >= 65536u ? 0.0 : 65536.0 / double(65536u - r.threshold);
  return r;
}

// Numbers a dropout draw of n elements reserves.
ENGINE_HD uint64_t dropout_numbers(uint64_t n) { return (n + 1) / 2; }

// Half h (0..7, low half of word 0 first) of a Philox block.
ENGINE_HD uint32_t philox_half(const uint32_t (&r)[4], uint32_t h) {
  const uint32_t w = h < 4 ? (h < 2 ? r[0] : r[1]) : (h < 6 ? r[2] : r[3]);
  return (h & 1u) ? w >> 16 : w & 0xffffu;
}

// The 16-bit number of element e of a dropout draw at offset `offset`.
ENGINE_HD uint32_t dropout_bits(uint64_t seed, uint64_t offset, uint64_t e) {
  const uint64_t half = 2 * offset + e;  // position counted in 16-bit halves
  uint32_t r[4];
  dropout_block(seed, half >> 3, r);
  return philox_half(r, uint32_t(half & 7));
}

// The engine's generator: a seed and the offset of the next unused number.
struct Generator {
  uint64_t seed = 0;
  uint64_t offset = 0;
  // Reserves n numbers; returns the offset they start at (kept a multiple of 4).
  uint64_t reserve(uint64_t n) {
    uint64_t at = offset;
    offset += (n + 3) / 4 * 4;
    return at;
  }
};

Generator& generator();            // the default generator (thread-local)
void manual_seed(uint64_t seed);   // resets the default generator to (seed, 0)

}  // namespace engine
