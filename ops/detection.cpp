// detection.cpp: topk, box_iou and nms: checks, fixed-shape outputs allocated on every device alike (and the GPU's
// temporaries), one kernel each. No autograd node (ops/detection.h).
#include "ops/detection.h"

#include <cmath>

#include "ops/cpu/detection.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/detection.h"
#endif
#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/op.h"

namespace ops {

namespace {

void check_no_grad(const char* op, const Tensor& x) {
  ENGINE_CHECK(!graph::any_requires_grad({x}), op, ": has no gradient (a selection, not a function that learns); ",
               "pass x.detach() (Mask R-CNN detaches its proposals), or run it under NoGrad");
}

void check_boxes(const char* op, const char* arg, const Tensor& t) {
  check_dtype(op, arg, t, DType::f32);
  ENGINE_CHECK(t.dim() == 3 && t.size(2) == 4, op, ": ", arg, " must be [N, K, 4] boxes (x1, y1, x2, y2), got ",
               engine::shape_str(t.shape()));
  ENGINE_CHECK(t.is_contiguous(), op, ": ", arg, " must be contiguous");
}

}  // namespace

TopK topk(const Tensor& x, int64_t k) {
  const char* name = "topk";
  OpScope scope(name);
  ENGINE_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16, name,
               ": x must be f32, bf16 or f16 (its order is f32's), got ", engine::dtype_name(x.dtype()),
               "; cast it with ops::to(x, f32)");
  ENGINE_CHECK(x.dim() == 2, name, ": x must be [N, K] (one selection per row), got ", engine::shape_str(x.shape()));
  ENGINE_CHECK(k >= 1 && k <= x.size(1), name, ": k must be in [1, K = ", x.size(1), "], got ", k);
  ENGINE_CHECK(x.size(1) < (int64_t(1) << 32), name, ": rows of 2^32 elements or more are not supported");
  ENGINE_CHECK(k <= kTopkMaxK, name, ": k = ", k, " is more than ", kTopkMaxK, ", the GPU kernel's limit (one block ",
               "sorts a row's candidates; every device keeps it, so meta predicts cuda): select in two rounds");
  check_no_grad(name, x);
  Tensor xc = contiguous(x);
  TopK out;
  out.values = new_empty(xc, {x.size(0), k});               // [N, k]
  out.indices = new_empty(xc, {x.size(0), k}, DType::i64);  // [N, k]
  run_kernel(
      name, out.values, [&] { cpu::topk(xc, k, out.values, out.indices); },
      CUDA_KERNEL(cuda::topk(xc, k, out.values, out.indices)));
  engine::count_op(name, 0.0, double(xc.nbytes() + out.values.nbytes() + out.indices.nbytes()));
  return out;
}

Tensor box_iou(const Tensor& a, const Tensor& b) {
  const char* name = "box_iou";
  OpScope scope(name);
  check_boxes(name, "a", a);
  check_boxes(name, "b", b);
  check_same_device(name, a, b);
  ENGINE_CHECK(a.size(0) == b.size(0), name, ": a ", engine::shape_str(a.shape()), " and b ",
               engine::shape_str(b.shape()), " must have the same N (images)");
  check_no_grad(name, a);
  check_no_grad(name, b);
  Tensor iou = new_empty(a, {a.size(0), a.size(1), b.size(1)});  // [N, A, B]
  run_kernel(
      name, iou, [&] { cpu::box_iou(a, b, iou); }, CUDA_KERNEL(cuda::box_iou(a, b, iou)));
  engine::count_op(name, 12.0 * double(iou.numel()), double(a.nbytes() + b.nbytes() + iou.nbytes()));
  return iou;
}

Tensor nms(const Tensor& boxes, const Tensor& valid, double iou_threshold, int64_t max_out) {
  const char* name = "nms";
  OpScope scope(name);
  check_boxes(name, "boxes", boxes);
  check_no_grad(name, boxes);
  const int64_t N = boxes.size(0), K = boxes.size(1);
  if (valid.defined()) {
    check_dtype(name, "valid", valid, DType::boolean);
    check_same_device(name, boxes, valid);
    ENGINE_CHECK(valid.shape() == (engine::Shape{N, K}) && valid.is_contiguous(), name, ": valid must be [N, K] = [", N,
                 ", ", K, "] and contiguous, got ", engine::shape_str(valid.shape()));
  }
  ENGINE_CHECK(std::isfinite(iou_threshold), name, ": iou_threshold must be finite, got ", iou_threshold);
  ENGINE_CHECK(max_out >= 1, name, ": max_out must be >= 1, got ", max_out);
  Tensor keep = new_empty(boxes, {N, max_out}, DType::i64);  // [N, max_out]
  {
    // The GPU's suppression bitmask, on every device alike: row i's bit j set when j > i overlaps i.
    const int64_t words = (K + 63) / 64;
    Tensor mask = new_empty(boxes, {N, K, words}, DType::i64);  // u64 words, stored as i64
    run_kernel(
        name, keep, [&] { cpu::nms(boxes, valid, float(iou_threshold), keep); },
        CUDA_KERNEL(cuda::nms(boxes, valid, float(iou_threshold), mask, keep)));
  }
  engine::count_op(name, 12.0 * double(N * K) * double(K) / 2, double(boxes.nbytes() + keep.nbytes()));
  return keep;
}

}  // namespace ops
