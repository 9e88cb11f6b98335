// synthetic.h: seeded synthetic image batches painted where they live (the vision models' default data).
//
// The host draws only what defines a scene (a few int64 per rectangle) and uploads that small table; one op
// paints every pixel on the tensors' device. Drawing 8 x 513 x 513 x 3 noisy pixels on the host and copying
// them over was 2/3 of a deeplabv3 step on the H200; the scene table is a few hundred bytes.
//
//   paint_rectangles(scenes, palette, options) -> {images, labels, instances}
//     scenes   i64 [N, R, 5], contiguous: image n's rectangle r is (class, top, left, height, width) in
//              pixels; a class outside [0, K) marks an empty slot (nothing painted). Rectangles are painted
//              in slot order: a later one covers an earlier one. With options.ellipses each paints the ellipse
//              inscribed in it instead (the pixels whose centre lies inside; Mask R-CNN's objects).
//     palette  f32 [K, 3], contiguous: class k's colour. Row 0 is the background (class 0's colour and
//              label wherever no rectangle lies). A model whose classes are all foreground shifts them by
//              one in the table and makes row 0 its background colour.
//     images   [N, H, W, 3] (NHWC) in options.dtype (H, W: options.height, options.width): pixel value =
//              fma(noise, 2u - 1, colour) in f32, then stored in dtype (f64: widened; bf16/f16: rounded to
//              nearest even), where colour is the palette row of the pixel's class (background row 0 on a
//              border pixel) and u the uniform draw of element e = ((n H + y) W + x) 3 + c from Philox
//              (engine/rng.h) keyed by (options.seed, options.step): synthetic_uniform() in cpu/synthetic.h.
//              The fma is exact on every device, so cpu and cuda give the same bits.
//     labels   i64 [N * H * W] (only when options.labels; else undefined): the class of the last rectangle
//              holding the pixel, 0 (background) where none does, and options.border_label on that
//              rectangle's one-pixel border when options.borders (VOC's 255 outlines; a border pixel is
//              painted the background colour: its class is unknown, its look plausible).
//     instances i64 [N * H * W] (only when options.instances; else undefined): r + 1 for the last rectangle r
//              (its slot) holding the pixel, border included; 0 where none does (pix2pixHD's instance maps).
//
// Both outputs are allocated by the op on every device alike; meta paints nothing. No autograd node: data.
// The scene table and the palette are data too: no value is read on the host (a cuda table stays there).
// Counted bytes: the outputs written plus the table and palette read; no FLOPs (model FLOPs only).
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

struct PaintOptions {
  int64_t height = 0, width = 0;             // H x W images
  engine::DType dtype = engine::DType::f32;  // the images' dtype (floating)
  double noise = 0.2;                      // amplitude: colour + noise * (2u - 1), u uniform in [0, 1)
  uint64_t seed = 0;                       // the noise's Philox key ...
  int64_t step = 0;                        // ... and counter high word: a different batch per step
  bool labels = false;                     // also paint the label map
  bool instances = false;                  // also paint the instance map (slot + 1)
  bool borders = false;                    // label a rectangle's one-pixel border border_label
  int64_t border_label = 255;
  bool ellipses = false;  // paint each rectangle's inscribed ellipse instead (cpu/synthetic.h)
};

struct PaintedImages {
  Tensor images;     // [N, H, W, 3] options.dtype
  Tensor labels;     // [N * H * W] i64, or undefined
  Tensor instances;  // [N * H * W] i64, or undefined
};

PaintedImages paint_rectangles(const Tensor& scenes, const Tensor& palette, const PaintOptions& options);

}  // namespace ops
