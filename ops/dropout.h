// dropout.h: inverted dropout with masks regenerated from the counter-based RNG instead of saved.
//
//   dropout(x, p, training)   element i (row-major index) is kept iff its 16-bit draw dropout_bits(seed, offset,
//                             i) >= ceil(p * 2^16) and then scaled by 1 / (1 - p_q), p_q = ceil(p * 2^16) / 2^16
//                             (engine/rng.h: p rounded up to a multiple of 2^-16, so E[out] = x); else 0.
//                             (seed, offset) is a reservation of ceil(numel(x) / 2) numbers (two 16-bit draws
//                             each) from engine::generator(), made on every device (meta too), so later draws
//                             line up across devices.
//   p == 0 or !training      returns x itself: no allocation, no node, no numbers reserved.
//
// No mask is saved. PyTorch keeps a bool (or byte) mask per dropout as an activation, 1 byte per element;
// here backward regenerates it from (seed, offset): the node saves nothing, and dropout's activation cost
// is 0 bytes (the price is recomputing the Philox draws, ~free next to the memory traffic). Backward is
// dropout_mask_apply(g, p, seed, offset): the same function applied to g. It is linear in g and diagonal,
// so its own backward is itself again (double backward). Recomputation (graph::recompute) restores the
// generator, so replayed forwards draw the same masks.
// FLOPs: 1 per element (the multiply; the random draw is not counted).
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

Tensor dropout(const Tensor& x, double p, bool training = true);
// g * keep(seed, offset, i) / (1 - p), elementwise: the dropout drawn at (seed, offset), applied to g.
Tensor dropout_mask_apply(const Tensor& g, double p, uint64_t seed, uint64_t offset);

// The draw of `decisions` keep decisions: the default generator's seed and the offset of the
// engine::dropout_numbers(decisions) numbers reserved from it, on every device (meta too), so that later draws
// line up across devices. Every op that drops (dropout, drop path, attention, dropout_add_layer_norm) takes its
// draw here.
struct DropoutDraw {
  uint64_t seed = 0, offset = 0;
};
DropoutDraw reserve_dropout_draw(uint64_t decisions);
// Throws "op: drop probability p must be in [0, 1], got p" otherwise.
void check_drop_probability(const char* op, double p);

// Drop path (NASNet's and stochastic depth's): a whole sample of x (its first dimension, N) is kept with
// probability keep_prob, then scaled by 1 / (1 - p_q), else zeroed: dropout at p = 1 - keep_prob with one draw per
// sample, sample n kept iff dropout_bits(seed, offset, n) >= ceil(p * 2^16), ceil(N / 2) numbers reserved. Saves
// nothing, as dropout.
// keep_prob == 1 or !training: x itself.
Tensor drop_path(const Tensor& x, double keep_prob, bool training = true);
Tensor drop_path_mask_apply(const Tensor& g, double keep_prob, uint64_t seed, uint64_t offset);

// StyleGAN's noise input: y = x + n * strength for x [N, ..., C], strength [C], n [N, ..., 1] standard normal drawn
// by ops::randn from the default generator. Like dropout's masks, n is not kept: the node saves the generator's
// state at the draw and backward draws n again from it (the same Philox numbers on every device) for
// d strength = sum over N, ... of g * n (written with ops: differentiable again); dx = g. The draw is freed when the
// forward ends, so the op's activation cost is 0 bytes (a multiply would keep n for strength's gradient).
Tensor add_noise(const Tensor& x, const Tensor& strength);

}  // namespace ops
