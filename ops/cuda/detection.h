// cuda/detection.h: the detection ops' GPU kernels (ops/detection.h), with the cpu's ENGINE_HD math
// (cpu/detection.h): the same keys, IoUs and decisions, so the results equal the cpu's.
#pragma once
#include "engine/tensor.h"
#include "ops/cpu/detection.h"  // CoderWeights

namespace ops::cuda {

void topk(const engine::Tensor& x, int64_t k, const engine::Tensor& values, const engine::Tensor& indices);
void box_iou(const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& iou);
// mask: the op's temporary, u64 words [N, K, ceil(K / 64)] (stored as i64).
void nms(const engine::Tensor& boxes, const engine::Tensor& valid, float iou_threshold, const engine::Tensor& mask,
         const engine::Tensor& keep);

void box_code(bool decode, const engine::Tensor& in, const engine::Tensor& reference, const cpu::CoderWeights& w,
              const engine::Tensor& image_hw, const engine::Tensor& out);
void match_boxes(const engine::Tensor& iou, const engine::Tensor& valid, float high, float low, bool allow_low_quality,
                 const engine::Tensor& gmax, const engine::Tensor& matches);

void polygon_masks(const engine::Tensor& polygons, const engine::Tensor& counts, const engine::Tensor& rois,
                   const engine::Tensor& truth, const engine::Tensor& masks);

}  // namespace ops::cuda
