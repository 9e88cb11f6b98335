// cpu/synthetic.cpp: paint_rectangles' reference: a loop over pixels (OpenMP), each one asking which
// rectangle owns it and drawing its three channels' noise from Philox; every pixel is a pure function of
// (scene, palette, seed, step, its index), so the order does not matter.
#include "ops/cpu/synthetic.h"

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

void paint_rectangles(const Tensor& scenes, const Tensor& palette, const PaintOptions& o, const PaintedImages& out) {
  const int64_t N = scenes.size(0), R = scenes.size(1), K = palette.size(0), H = o.height, W = o.width;
  const int64_t* table = scenes.data<int64_t>();  // [N, R, 5]
  const float* colours = palette.data<float>();   // [K, 3]
  int64_t* label_map = out.labels.defined() ? out.labels.data<int64_t>() : nullptr;           // [N * H * W]
  int64_t* instance_map = out.instances.defined() ? out.instances.data<int64_t>() : nullptr;  // [N * H * W]
  const float noise = float(o.noise);
  ENGINE_FLOAT_SWITCH(out.images.dtype(), T, {
    T* image = out.images.data<T>();  // [N, H, W, 3]
    parallel_for(N * H * W, [&](int64_t p) {
      const int64_t n = p / (H * W), y = p / W % H, x = p % W;
      const PixelPaint px =
          synthetic_pixel(table + n * R * kSceneFields, R, K, y, x, o.borders, o.border_label, o.ellipses);
      for (int64_t c = 0; c < 3; c++) {
        const uint64_t e = uint64_t(p * 3 + c);
        image[e] = st<T>(synthetic_value(colours[px.colour * 3 + c], noise, synthetic_uniform(o.seed, o.step, e)));
      }
      if (label_map) label_map[p] = px.label;
      if (instance_map) instance_map[p] = px.instance;
    });
  });
}

}  // namespace ops::cpu
