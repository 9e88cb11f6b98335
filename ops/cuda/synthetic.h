// cuda/synthetic.h: the GPU kernel of paint_rectangles, with ops/cpu/synthetic.h's contract: the same
// pixel owner, Philox draws and fma (the ENGINE_HD functions of cpu/synthetic.h), so the images agree with
// the cpu's bit for bit in every dtype and the labels exactly.
#pragma once
#include "engine/tensor.h"
#include "ops/synthetic.h"

namespace ops::cuda {

// images [N, S, S, 3] (o.dtype) and, when defined, labels [N * S * S] i64, both contiguous, painted from
// scenes [N, R, 5] i64 and palette [K, 3] f32 (contiguous, on the device) as ops/synthetic.h says.
void paint_rectangles(const engine::Tensor& scenes, const engine::Tensor& palette, const PaintOptions& o,
                      const engine::Tensor& images, const engine::Tensor& labels);

}  // namespace ops::cuda
