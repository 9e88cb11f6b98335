// cuda/detection.h: the detection ops' GPU kernels (ops/detection.h), with the cpu's ENGINE_HD math
// (cpu/detection.h): the same keys, IoUs and decisions, so the results equal the cpu's.
#pragma once
#include "engine/tensor.h"

namespace ops::cuda {

void topk(const engine::Tensor& x, int64_t k, const engine::Tensor& values, const engine::Tensor& indices);
void box_iou(const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& iou);
// mask: the op's temporary, u64 words [N, K, ceil(K / 64)] (stored as i64).
void nms(const engine::Tensor& boxes, const engine::Tensor& valid, float iou_threshold, const engine::Tensor& mask,
         const engine::Tensor& keep);

}  // namespace ops::cuda
