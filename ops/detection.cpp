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
#include "ops/factory.h"
#include "ops/op.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/view.h"

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

namespace {

Tensor box_code(const char* name, bool decode, const Tensor& in, const Tensor& reference, const BoxCoderParams& p,
                const Tensor& image_hw) {
  OpScope scope(name);
  check_boxes(name, decode ? "deltas" : "boxes", in);
  check_boxes(name, "reference", reference);
  check_same_device(name, in, reference);
  ENGINE_CHECK(in.shape() == reference.shape(), name, ": ", engine::shape_str(in.shape()), " and the reference ",
               engine::shape_str(reference.shape()), " must have one shape (a box per reference box)");
  for (double w : {p.wx, p.wy, p.ww, p.wh, p.clip})
    ENGINE_CHECK(std::isfinite(w) && w > 0, name, ": the weights and clip must be finite and > 0, got ", w);
  check_no_grad(name, in);
  check_no_grad(name, reference);
  if (image_hw.defined()) {
    check_dtype(name, "image_hw", image_hw, DType::f32);
    check_same_device(name, in, image_hw);
    ENGINE_CHECK(image_hw.shape() == (engine::Shape{in.size(0), 2}) && image_hw.is_contiguous(), name,
                 ": image_hw must be [N, 2] = [", in.size(0), ", 2] (height, width per image), got ",
                 engine::shape_str(image_hw.shape()));
  }
  const cpu::CoderWeights w{float(p.wx), float(p.wy), float(p.ww), float(p.wh), float(p.clip)};
  Tensor out = new_empty(in, in.shape());  // [N, K, 4]
  run_kernel(
      name, out, [&] { cpu::box_code(decode, in, reference, w, image_hw, out); },
      CUDA_KERNEL(cuda::box_code(decode, in, reference, w, image_hw, out)));
  engine::count_op(name, 20.0 * double(in.size(0) * in.size(1)),
                   double(in.nbytes() + reference.nbytes() + out.nbytes()));
  return out;
}

}  // namespace

Tensor box_encode(const Tensor& boxes, const Tensor& reference, const BoxCoderParams& p) {
  return box_code("box_encode", false, boxes, reference, p, Tensor());
}

Tensor box_decode(const Tensor& deltas, const Tensor& reference, const BoxCoderParams& p, const Tensor& image_hw) {
  return box_code("box_decode", true, deltas, reference, p, image_hw);
}

Tensor match_boxes(const Tensor& iou, const Tensor& gt_valid, double high, double low, bool allow_low_quality) {
  const char* name = "match_boxes";
  OpScope scope(name);
  check_dtype(name, "iou", iou, DType::f32);
  ENGINE_CHECK(iou.dim() == 3 && iou.is_contiguous(), name, ": iou must be [N, G, A] (truths x anchors) and ",
               "contiguous, got ", engine::shape_str(iou.shape()));
  check_no_grad(name, iou);
  const int64_t N = iou.size(0), G = iou.size(1), A = iou.size(2);
  if (gt_valid.defined()) {
    check_dtype(name, "gt_valid", gt_valid, DType::boolean);
    check_same_device(name, iou, gt_valid);
    ENGINE_CHECK(gt_valid.shape() == (engine::Shape{N, G}) && gt_valid.is_contiguous(), name,
                 ": gt_valid must be [N, G] = [", N, ", ", G, "] and contiguous, got ",
                 engine::shape_str(gt_valid.shape()));
  }
  ENGINE_CHECK(std::isfinite(high) && std::isfinite(low) && low <= high, name, ": thresholds must be finite with ",
               "low <= high, got low ", low, ", high ", high);
  Tensor matches = new_empty(iou, {N, A}, DType::i64);  // [N, A]
  {
    Tensor gmax = new_empty(iou, {N, G});  // each truth's best IoU (a temporary on every device)
    run_kernel(
        name, matches,
        [&] { cpu::match_boxes(iou, gt_valid, float(high), float(low), allow_low_quality, gmax, matches); },
        CUDA_KERNEL(cuda::match_boxes(iou, gt_valid, float(high), float(low), allow_low_quality, gmax, matches)));
  }
  engine::count_op(name, 2.0 * double(iou.numel()), double(iou.nbytes() + matches.nbytes()));
  return matches;
}

Tensor polygon_masks(const Tensor& polygons, const Tensor& counts, const Tensor& rois, const Tensor& truth,
                     int64_t size) {
  const char* name = "polygon_masks";
  OpScope scope(name);
  check_dtype(name, "polygons", polygons, DType::f32);
  check_dtype(name, "counts", counts, DType::i64);
  check_dtype(name, "truth", truth, DType::i64);
  check_boxes(name, "rois", rois);
  for (const Tensor* t : {&counts, &truth}) check_same_device(name, polygons, *t);
  check_same_device(name, polygons, rois);
  ENGINE_CHECK(polygons.dim() == 5 && polygons.size(4) == 2 && polygons.is_contiguous(), name,
               ": polygons must be contiguous [N, G, P, V, 2] (truths x parts x vertices x (x, y)), got ",
               engine::shape_str(polygons.shape()));
  const int64_t N = polygons.size(0), G = polygons.size(1), P = polygons.size(2), R = rois.size(1);
  ENGINE_CHECK(counts.shape() == (engine::Shape{N, G, P}) && counts.is_contiguous(), name,
               ": counts must be contiguous [N, G, P] = [", N, ", ", G, ", ", P, "] (vertices per part), got ",
               engine::shape_str(counts.shape()));
  ENGINE_CHECK(rois.size(0) == N && truth.shape() == (engine::Shape{N, R}) && truth.is_contiguous(), name,
               ": rois [N, R, 4] and truth [N, R] (contiguous) for N = ", N, " images expected, got ",
               engine::shape_str(rois.shape()), " and ", engine::shape_str(truth.shape()));
  check_no_grad(name, polygons);
  check_no_grad(name, rois);
  ENGINE_CHECK(size >= 1 && size <= 4096, name, ": size must be in [1, 4096], got ", size);
  Tensor masks = new_empty(rois, {N, R, size, size});  // [N, R, M, M] f32
  run_kernel(
      name, masks, [&] { cpu::polygon_masks(polygons, counts, rois, truth, masks); },
      CUDA_KERNEL(cuda::polygon_masks(polygons, counts, rois, truth, masks)));
  engine::count_op(name, 0.0, double(masks.nbytes() + rois.nbytes() + truth.nbytes()));
  return masks;
}

// ---------------------------------------------------------------------------------------------------
// Built from other ops

Tensor grid_anchors(int64_t grid_h, int64_t grid_w, int64_t stride_h, int64_t stride_w,
                    const std::vector<double>& sizes, const std::vector<double>& ratios,
                    std::shared_ptr<engine::Device> device) {
  OpScope scope("grid_anchors");
  ENGINE_CHECK(grid_h > 0 && grid_w > 0 && stride_h > 0 && stride_w > 0, "grid_anchors: the grid (", grid_h, " x ",
               grid_w, ") and strides (", stride_h, ", ", stride_w, ") must be positive");
  ENGINE_CHECK(!sizes.empty() && !ratios.empty(), "grid_anchors: needs at least one size and one aspect ratio");
  for (double v : sizes) ENGINE_CHECK(std::isfinite(v) && v > 0, "grid_anchors: sizes must be > 0, got ", v);
  for (double v : ratios) ENGINE_CHECK(std::isfinite(v) && v > 0, "grid_anchors: aspect ratios must be > 0, got ", v);
  std::vector<float> cell;  // [A, 4], ratio-major, as torchvision's generate_anchors (in f32)
  for (double r : ratios) {
    const float h_ratio = std::sqrt(float(r)), w_ratio = 1.f / h_ratio;
    for (double s : sizes) {
      const float w = w_ratio * float(s), h = h_ratio * float(s);
      for (float v : {-w, -h, w, h}) cell.push_back(std::nearbyint(v / 2.f));  // torch.round: half to even
    }
  }
  const int64_t A = int64_t(cell.size() / 4);
  std::vector<float> out(size_t(grid_h * grid_w * A * 4));
  for (int64_t y = 0; y < grid_h; y++)
    for (int64_t x = 0; x < grid_w; x++)
      for (int64_t a = 0; a < A; a++) {
        float* o = &out[size_t(((y * grid_w + x) * A + a) * 4)];
        const float shift[4] = {float(x * stride_w), float(y * stride_h), float(x * stride_w), float(y * stride_h)};
        for (int k = 0; k < 4; k++) o[k] = shift[k] + cell[size_t(a * 4 + k)];
      }
  return from_vector(out, {grid_h * grid_w * A, 4}, DType::f32, device);
}

Tensor fpn_levels(const Tensor& boxes, int64_t k_min, int64_t k_max, double canonical_size, int64_t canonical_level,
                  double eps) {
  const char* name = "fpn_levels";
  OpScope scope(name);
  check_boxes(name, "boxes", boxes);
  ENGINE_CHECK(k_min <= k_max && canonical_size > 0, name, ": needs k_min <= k_max and canonical_size > 0");
  check_no_grad(name, boxes);
  Tensor w = sub(select(boxes, 2, 2), select(boxes, 2, 0)), h = sub(select(boxes, 2, 3), select(boxes, 2, 1));
  Tensor s = sqrt(mul(w, h));  // [N, K]
  // level >= k  <=>  canonical_level + log2(s / canonical_size) + eps >= k  <=>  s >= canonical_size 2^(k - lvl0 - eps)
  Tensor level = zeros(s.shape(), DType::f32, s.device_ptr());
  for (int64_t k = k_min + 1; k <= k_max; k++) {
    const double bound = canonical_size * std::exp2(double(k - canonical_level) - eps);
    level = add(level, to(compare(CompareOp::ge, s, bound), DType::f32));
  }
  return to(level, DType::i64);
}

Sampled sample_balanced(const Tensor& labels, int64_t num, double positive_fraction) {
  const char* name = "sample_balanced";
  OpScope scope(name);
  check_dtype(name, "labels", labels, DType::i64);
  ENGINE_CHECK(labels.dim() == 2, name, ": labels must be [N, A], got ", engine::shape_str(labels.shape()));
  const int64_t N = labels.size(0), A = labels.size(1), P = int64_t(std::floor(double(num) * positive_fraction));
  ENGINE_CHECK(num >= 1 && num <= A && num <= kTopkMaxK, name, ": num must be in [1, min(A = ", A, ", ", kTopkMaxK,
               ")], got ", num);
  ENGINE_CHECK(positive_fraction >= 0 && positive_fraction <= 1, name, ": positive_fraction must be in [0, 1], got ",
               positive_fraction);
  // A random key per candidate: u in [0, 1) for the candidates of a kind, -1 for the others; the top keys are a
  // uniform draw without replacement among the candidates.
  Tensor u = rand({N, A}, 0, 1, DType::f32, labels.device_ptr());
  auto keys = [&](int64_t kind) {
    Tensor is = to(compare(CompareOp::eq, labels, double(kind)), DType::f32);
    return add(mul(u, is), add(is, -1.0));
  };
  Tensor j = to(arange(num, DType::i64, labels.device_ptr()), DType::f32);  // [num] slot numbers
  Tensor j2 = broadcast_to(reshape(j, {1, num}), {N, num});
  Tensor chosen_pos, n_pos;
  if (P > 0) {
    TopK pos = topk(keys(1), P);                                                      // [N, P]
    n_pos = sum(to(compare(CompareOp::ge, pos.values, 0.0), DType::f32), {1}, true);  // [N, 1]
    Tensor jp = to(minimum(j2, full({N, num}, double(P - 1), DType::f32, labels.device_ptr())), DType::i64);
    chosen_pos = gather(pos.indices, 1, contiguous(jp));  // slot j < P: the j-th positive
  } else {
    n_pos = zeros({N, 1}, DType::f32, labels.device_ptr());
    chosen_pos = zeros({N, num}, DType::i64, labels.device_ptr());
  }
  TopK neg = topk(keys(0), num);                                                           // [N, num]
  Tensor n_neg = sum(to(compare(CompareOp::ge, neg.values, 0.0), DType::f32), {1}, true);  // [N, 1]
  Tensor jn = sub(j2, n_pos);  // slot j >= n_pos: negative j - n_pos
  Tensor chosen_neg = gather(neg.indices, 1, index_or_zero(jn));
  Tensor is_pos = compare(CompareOp::lt, j2, n_pos);  // [N, num]
  Tensor is_neg = mul(to(compare(CompareOp::ge, jn, 0.0), DType::f32),
                      to(compare(CompareOp::lt, jn, n_neg), DType::f32));  // 1 where a negative is taken
  Tensor pos_f = to(is_pos, DType::f32);
  Sampled out;
  // index = the positive, the negative, or 0 for padding; label = 1, 0 or -1.
  out.index = add(mul(to(chosen_pos, DType::f32), pos_f), mul(to(chosen_neg, DType::f32), is_neg));
  out.index = to(out.index, DType::i64);
  out.label = to(add(pos_f, add(add(pos_f, is_neg), -1.0)), DType::i64);
  return out;
}

Tensor unit_boxes_where_invalid(const Tensor& boxes, const Tensor& valid) {
  OpScope scope("unit_boxes_where_invalid");
  check_boxes("unit_boxes_where_invalid", "boxes", boxes);
  ENGINE_CHECK(valid.shape() == (engine::Shape{boxes.size(0), boxes.size(1)}), "unit_boxes_where_invalid: valid must ",
               "be [N, K] for boxes ", engine::shape_str(boxes.shape()), ", got ", engine::shape_str(valid.shape()));
  Tensor keep = reshape(to(valid, DType::f32), {boxes.size(0), boxes.size(1), 1});
  Tensor unit = from_vector(std::vector<double>{0, 0, 1, 1}, {4}, DType::f32, boxes.device_ptr());
  return contiguous(add(mul(boxes, keep), mul(unit, add(neg(keep), 1.0))));
}

Tensor index_or_zero(const Tensor& index) {
  Tensor i = to(index, DType::f32);
  return to(maximum(i, zeros(i.shape(), DType::f32, i.device_ptr())), DType::i64);
}

}  // namespace ops
