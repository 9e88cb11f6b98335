// cpu/synthetic.h: the CPU reference kernel of paint_rectangles (ops/synthetic.h says what it paints), and
// the per-pixel math it is made of, ENGINE_HD so that the CUDA kernel (cuda/synthetic.cu) runs the same
// lines: which rectangle owns a pixel, the Philox draw of an element, and the one fused multiply-add that
// makes its value (exact on both devices, so f32 images agree bit for bit).
#pragma once
#include <cmath>
#include <cstdint>

#include "engine/rng.h"  // ENGINE_HD, Philox
#include "engine/tensor.h"
#include "ops/synthetic.h"

namespace ops::cpu {

constexpr int64_t kSceneFields = 5;  // a scene row: class, top, left, height, width

// The four 32-bit draws of Philox block `block` of a batch keyed by (seed, step): counter (block, step),
// key seed. Element e of the batch (row-major over [N, H, W, 3]) takes lane e % 4 of block e / 4.
ENGINE_HD void synthetic_block(uint64_t seed, int64_t step, uint64_t block, uint32_t out[4]) {
  const uint64_t s = uint64_t(step);
  const uint32_t ctr[4] = {uint32_t(block), uint32_t(block >> 32), uint32_t(s), uint32_t(s >> 32)};
  const uint32_t key[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  engine::philox4x32_10_full(ctr, key, out);
}

// Uniform in [0, 1) (24 bits) of element e.
ENGINE_HD float synthetic_uniform(uint64_t seed, int64_t step, uint64_t e) {
  uint32_t r[4];
  synthetic_block(seed, step, e >> 2, r);
  return engine::philox_bits_to_uniform(r[e & 3]);
}

// colour + noise * (2u - 1) with one rounding: 2u - 1 is exact (u has 24 bits), and an explicit fma leaves
// the compilers no contraction choice, so every device computes the same float.
ENGINE_HD float synthetic_value(float colour, float noise, float u) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(noise, 2.f * u - 1.f, colour);
#else
  return std::fma(noise, 2.f * u - 1.f, colour);
#endif
}

// What a pixel shows: its palette row, its label and its instance (the owning slot + 1, 0 for none).
struct PixelPaint {
  int64_t colour = 0, label = 0, instance = 0;
};

// Pixel (y, x) of an image whose scene is `scene` [R, 5]: the last rectangle (class in [0, K)) holding it
// decides; on its one-pixel border (when `borders`) the label is border_label and the colour the
// background's; no rectangle: background (row 0, label 0). With `ellipses` a rectangle holds only the pixels whose
// centre lies in its inscribed ellipse: (2x + 1 - 2 left - w)^2 h^2 + (2y + 1 - 2 top - h)^2 w^2 <= w^2 h^2, exact in
// integers.
ENGINE_HD PixelPaint synthetic_pixel(const int64_t* scene, int64_t R, int64_t K, int64_t y, int64_t x, bool borders,
                                     int64_t border_label, bool ellipses = false) {
  for (int64_t r = R - 1; r >= 0; r--) {
    const int64_t* s = scene + r * kSceneFields;
    const int64_t cls = s[0], top = s[1], left = s[2], h = s[3], w = s[4];
    if (cls < 0 || cls >= K || y < top || y >= top + h || x < left || x >= left + w) continue;
    if (ellipses) {
      const int64_t dx = 2 * x + 1 - 2 * left - w, dy = 2 * y + 1 - 2 * top - h;
      if (dx * dx * h * h + dy * dy * w * w > w * w * h * h) continue;
    }
    if (borders && (y == top || y == top + h - 1 || x == left || x == left + w - 1)) return {0, border_label, r + 1};
    return {cls, cls, r + 1};
  }
  return {0, 0, 0};
}

// out.images [N, H, W, 3] (o.dtype) and, when defined, out.labels and out.instances [N * H * W] i64, all
// contiguous, painted from scenes [N, R, 5] i64 and palette [K, 3] f32 (contiguous) as ops/synthetic.h says.
void paint_rectangles(const engine::Tensor& scenes, const engine::Tensor& palette, const PaintOptions& o,
                      const PaintedImages& out);

}  // namespace ops::cpu
