// cpu/synthetic.cpp: paint_rectangles' reference: a loop over pixels (OpenMP), each one asking which
// rectangle owns it and drawing its three channels' noise from Philox; every pixel is a pure function of
// (scene, palette, seed, step, its index), so the order does not matter.
#include "ops/cpu/synthetic.h"

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

void paint_rectangles(const Tensor& scenes, const Tensor& palette, const PaintOptions& o, const Tensor& images,
                      const Tensor& labels) {
  const int64_t N = scenes.size(0), R = scenes.size(1), K = palette.size(0), S = o.size;
  const int64_t* table = scenes.data<int64_t>();  // [N, R, 5]
  const float* colours = palette.data<float>();   // [K, 3]
  int64_t* label_map = labels.defined() ? labels.data<int64_t>() : nullptr;  // [N * S * S]
  const float noise = float(o.noise);
  ENGINE_FLOAT_SWITCH(images.dtype(), T, {
    T* out = images.data<T>();  // [N, S, S, 3]
    parallel_for(N * S * S, [&](int64_t p) {
      const int64_t n = p / (S * S), y = p / S % S, x = p % S;
      const PixelPaint px = synthetic_pixel(table + n * R * kSceneFields, R, K, y, x, o.borders, o.border_label);
      for (int64_t c = 0; c < 3; c++) {
        const uint64_t e = uint64_t(p * 3 + c);
        out[e] = st<T>(synthetic_value(colours[px.colour * 3 + c], noise, synthetic_uniform(o.seed, o.step, e)));
      }
      if (label_map) label_map[p] = px.label;
    });
  });
}

}  // namespace ops::cpu
