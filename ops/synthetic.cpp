// synthetic.cpp: paint_rectangles: checks, the outputs allocated on every device alike, one kernel.
// No node is recorded: the images are data, not a function of anything that learns.
#include "ops/synthetic.h"

#include <cmath>

#include "ops/cpu/synthetic.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/synthetic.h"
#endif
#include "ops/op.h"

namespace ops {

PaintedImages paint_rectangles(const Tensor& scenes, const Tensor& palette, const PaintOptions& o) {
  const char* name = "paint_rectangles";
  OpScope scope(name);
  check_dtype(name, "scenes", scenes, DType::i64);
  check_dtype(name, "palette", palette, DType::f32);
  check_dim(name, "scenes", scenes, 3);
  check_dim(name, "palette", palette, 2);
  check_same_device(name, scenes, palette);
  ENGINE_CHECK(scenes.size(2) == cpu::kSceneFields, name, ": scenes must be [N, R, 5] (class, top, left, height, ",
               "width), got ", engine::shape_str(scenes.shape()));
  ENGINE_CHECK(palette.size(1) == 3 && palette.size(0) >= 1, name, ": palette must be [K >= 1, 3] (row 0 the ",
               "background), got ", engine::shape_str(palette.shape()));
  ENGINE_CHECK(scenes.is_contiguous() && palette.is_contiguous(), name, ": scenes ",
               engine::shape_str(scenes.shape()), " and palette ", engine::shape_str(palette.shape()),
               " must be contiguous");
  ENGINE_CHECK(o.height >= 1 && o.width >= 1, name, ": image height and width must be positive, got ", o.height, " x ",
               o.width);
  ENGINE_CHECK(engine::is_floating(o.dtype), name, ": images must have a floating dtype, got ",
               engine::dtype_name(o.dtype));
  ENGINE_CHECK(std::isfinite(o.noise) && o.noise >= 0, name, ": noise amplitude must be finite and >= 0, got ",
               o.noise);
  const int64_t N = scenes.size(0), H = o.height, W = o.width;
  PaintedImages out;
  out.images = new_empty(scenes, {N, H, W, 3}, o.dtype);                        // [N, H, W, 3]
  if (o.labels) out.labels = new_empty(scenes, {N * H * W}, DType::i64);        // [N * H * W]
  if (o.instances) out.instances = new_empty(scenes, {N * H * W}, DType::i64);  // [N * H * W]
  run_kernel(
      name, out.images, [&] { cpu::paint_rectangles(scenes, palette, o, out); },
      CUDA_KERNEL(cuda::paint_rectangles(scenes, palette, o, out)));
  double bytes = double(out.images.nbytes() + scenes.nbytes() + palette.nbytes());
  for (const Tensor* map : {&out.labels, &out.instances})
    if (map->defined()) bytes += double(map->nbytes());
  engine::count_op(name, 0.0, bytes);
  return out;
}

}  // namespace ops
