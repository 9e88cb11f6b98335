// cuda/yolo.h: the GPU kernel of YOLOv3 target assignment, with ops/cpu/yolo.h's contract and its math
// (the same ENGINE_HD functions, in double): the outputs equal the cpu's up to the last bits of exp/log.
#pragma once
#include "engine/tensor.h"
#include "ops/yolo.h"

namespace ops::cuda {

// pred [N, H, W, A, 5 + C], boxes [N, M, 4] f32, labels [N, M] i64, all contiguous; target (pred's dtype)
// and weight (f32, f64 for f64) [N, H, W, A, 5 + C], fully written. A label >= C is an Error (after a stream
// synchronization, through the index-error flag), as on the cpu.
void yolo_targets(const engine::Tensor& pred, const engine::Tensor& boxes, const engine::Tensor& labels,
                  const YoloTargetParams& p, const engine::Tensor& target, const engine::Tensor& weight);

}  // namespace ops::cuda
