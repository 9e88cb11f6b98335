// roi_align.cpp: RoIAlign and its backward: checks, outputs allocated on every device alike, one kernel each; each
// op's autograd rule is the other (they are adjoint linear maps of the feature maps).
#include "ops/roi_align.h"

#include <cmath>

#include "ops/cpu/roi_align.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/roi_align.h"
#endif
#include "ops/elementwise.h"
#include "ops/op.h"

namespace ops {

namespace {

// Checks the RoI table and parameters against L maps of shapes `shapes`; returns C.
int64_t check_rois(const char* op, const std::vector<Shape>& shapes, const Tensor& rois, const Tensor& roi_levels,
                   const RoiAlignParams& p) {
  ENGINE_CHECK(!shapes.empty(), op, ": needs at least one feature map");
  for (size_t l = 0; l < shapes.size(); l++) {
    const Shape& s = shapes[l];
    ENGINE_CHECK(s.size() == 4 && s[1] > 0 && s[2] > 0, op, ": level ", l, " must be [N, H, W, C] (channels last, ",
                 "H and W positive), got ", engine::shape_str(s));
    ENGINE_CHECK(s[0] == shapes[0][0] && s[3] == shapes[0][3], op, ": level ", l, " ", engine::shape_str(s),
                 " must have level 0's N and C (", engine::shape_str(shapes[0]), ")");
  }
  check_dtype(op, "rois", rois, DType::f32);
  check_dtype(op, "roi_levels", roi_levels, DType::i64);
  ENGINE_CHECK(rois.dim() == 2 && rois.size(1) == 5, op, ": rois must be [R, 5] (image, x1, y1, x2, y2), got ",
               engine::shape_str(rois.shape()));
  ENGINE_CHECK(roi_levels.dim() == 1 && roi_levels.size(0) == rois.size(0), op, ": roi_levels must be [R] = [",
               rois.size(0), "], got ", engine::shape_str(roi_levels.shape()));
  ENGINE_CHECK(rois.is_contiguous() && roi_levels.is_contiguous(), op, ": rois and roi_levels must be contiguous");
  ENGINE_CHECK(p.out_h > 0 && p.out_w > 0, op, ": output size must be positive, got ", p.out_h, " x ", p.out_w);
  ENGINE_CHECK(p.sampling_ratio > 0, op, ": sampling_ratio must be positive (maskrcnn-benchmark's 2), got ",
               p.sampling_ratio, "; the adaptive count (0) makes the work depend on the boxes and is not supported");
  ENGINE_CHECK(p.scales.size() == shapes.size(), op, ": one scale per level: ", shapes.size(), " levels, ",
               p.scales.size(), " scales");
  for (double s : p.scales) ENGINE_CHECK(std::isfinite(s) && s > 0, op, ": scales must be finite and > 0, got ", s);
  return shapes[0][3];
}

double roi_align_flops(int64_t R, int64_t C, const RoiAlignParams& p) {
  return 9.0 * double(R * p.out_h * p.out_w * p.sampling_ratio * p.sampling_ratio * C);
}

}  // namespace

Tensor roi_align(const std::vector<Tensor>& levels_in, const Tensor& rois, const Tensor& roi_levels,
                 const RoiAlignParams& p) {
  const char* name = "roi_align";
  OpScope scope(name);
  std::vector<Shape> shapes;
  std::vector<Tensor> levels;
  for (size_t l = 0; l < levels_in.size(); l++) {
    check_floating(name, "levels", levels_in[l]);
    check_same_dtype(name, levels_in[0], levels_in[l]);
    check_same_device(name, levels_in[0], levels_in[l]);
    shapes.push_back(levels_in[l].shape());
  }
  const int64_t C = check_rois(name, shapes, rois, roi_levels, p);
  check_same_device(name, levels_in[0], rois);
  check_same_device(name, levels_in[0], roi_levels);
  for (const Tensor& x : levels_in) levels.push_back(contiguous(x));
  const int64_t R = rois.size(0);
  Tensor y = new_empty(levels[0], {R, p.out_h, p.out_w, C});  // [R, out_h, out_w, C]
  run_kernel(
      name, y, [&] { cpu::roi_align_forward(levels, rois, roi_levels, p, y); },
      CUDA_KERNEL(cuda::roi_align_forward(levels, rois, roi_levels, p, y)));
  double bytes = double(y.nbytes() + rois.nbytes() + roi_levels.nbytes());
  for (const Tensor& x : levels) bytes += double(x.nbytes());
  engine::count_op(name, roi_align_flops(R, C, p), bytes);
  if (graph::any_requires_grad(levels)) {
    graph::record(name, levels, {y}, {}, [shapes, rois, roi_levels, p](Node&, const Grads& g) -> Grads {
      return roi_align_backward(g[0], shapes, rois, roi_levels, p);
    });
  }
  return y;
}

std::vector<Tensor> roi_align_backward(const Tensor& g_in, const std::vector<Shape>& shapes, const Tensor& rois,
                                       const Tensor& roi_levels, const RoiAlignParams& p) {
  const char* name = "roi_align_backward";
  OpScope scope(name);
  check_floating(name, "g", g_in);
  const int64_t C = check_rois(name, shapes, rois, roi_levels, p);
  check_same_device(name, g_in, rois);
  check_same_device(name, g_in, roi_levels);
  const Shape gs{rois.size(0), p.out_h, p.out_w, C};
  ENGINE_CHECK(g_in.shape() == gs, name, ": g ", engine::shape_str(g_in.shape()), " must be ", engine::shape_str(gs));
  Tensor g = contiguous(g_in);
  std::vector<Tensor> dx;
  for (const Shape& s : shapes) dx.push_back(new_empty(g, s));  // [N, H_l, W_l, C]
  run_kernel(
      name, dx[0], [&] { cpu::roi_align_backward(g, rois, roi_levels, p, dx); },
      CUDA_KERNEL(cuda::roi_align_backward(g, rois, roi_levels, p, dx)));
  double bytes = double(g.nbytes() + rois.nbytes() + roi_levels.nbytes());
  for (const Tensor& t : dx) bytes += double(t.nbytes());
  engine::count_op(name, roi_align_flops(rois.size(0), C, p), bytes);
  if (graph::any_requires_grad({g})) {
    graph::record(name, {g}, dx, {}, [rois, roi_levels, p](Node&, const Grads& h) -> Grads {
      // The adjoint of the backward is the forward; a level whose gradient is undefined contributes zeros.
      std::vector<Tensor> levels = h;
      return {roi_align(levels, rois, roi_levels, p)};
    });
  }
  return dx;
}

}  // namespace ops
