// cuda/synthetic.h: the GPU kernel of paint_rectangles, with ops/cpu/synthetic.h's contract: the same
// pixel owner, Philox draws and fma (the ENGINE_HD functions of cpu/synthetic.h), so the images agree with
// the cpu's bit for bit in every dtype and the labels exactly.
#pragma once
#include "engine/tensor.h"
#include "ops/synthetic.h"

namespace ops::cuda {

// out.images [N, H, W, 3] (o.dtype) and, when defined, out.labels and out.instances [N * H * W] i64, all
// contiguous, painted from scenes [N, R, 5] i64 and palette [K, 3] f32 (contiguous, on the device) as
// ops/synthetic.h says.
void paint_rectangles(const engine::Tensor& scenes, const engine::Tensor& palette, const PaintOptions& o,
                      const PaintedImages& out);

}  // namespace ops::cuda
