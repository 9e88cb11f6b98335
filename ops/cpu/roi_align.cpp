// cpu/roi_align.cpp: RoIAlign's reference kernels. Forward: a loop over output elements (OpenMP over RoI bins).
// Backward: a scatter in the op's fixed order (RoI, bin, sample, neighbour), each thread owning a range of
// channels of every map, so every input element sums its contributions in that order whatever the thread count.
#include "ops/cpu/roi_align.h"

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

namespace {

struct Levels {
  std::vector<int64_t> H, W;
};

Levels level_sizes(const std::vector<Shape>& shapes) {
  Levels l;
  for (const Shape& s : shapes) l.H.push_back(s[1]), l.W.push_back(s[2]);
  return l;
}

}  // namespace

void roi_align_forward(const std::vector<Tensor>& levels, const Tensor& rois, const Tensor& roi_levels,
                       const RoiAlignParams& p, const Tensor& y) {
  const int64_t R = rois.size(0), L = int64_t(levels.size()), N = levels[0].size(0), C = levels[0].size(3);
  const int64_t grid = p.sampling_ratio, bins = p.out_h * p.out_w;
  const float* box = rois.data<float>();                 // [R, 5]
  const int64_t* assigned = roi_levels.data<int64_t>();  // [R]
  std::vector<Shape> shapes;
  for (const Tensor& x : levels) shapes.push_back(x.shape());
  const Levels sz = level_sizes(shapes);
  ENGINE_FLOAT_SWITCH(y.dtype(), T, {
    using A = acc_t<T>;
    std::vector<const T*> maps;
    for (const Tensor& x : levels) maps.push_back(x.data<T>());
    T* out = y.data<T>();  // [R, out_h, out_w, C]
    const A count = A(grid * grid);
    parallel_for(R * bins, [&](int64_t rb) {
      const int64_t r = rb / bins, ph = rb % bins / p.out_w, pw = rb % p.out_w;
      T* o = out + rb * C;
      const int64_t l = roi_level(box + r * 5, assigned[r], L, N);
      if (l < 0) {
        for (int64_t c = 0; c < C; c++) o[c] = st<T>(A(0));
        return;
      }
      const int64_t H = sz.H[size_t(l)], W = sz.W[size_t(l)];
      const T* x = maps[size_t(l)] + int64_t(box[r * 5]) * H * W * C;
      const RoiGeometry<A> g = roi_geometry<A>(box + r * 5, A(p.scales[size_t(l)]), p.out_h, p.out_w, p.aligned);
      for (int64_t c = 0; c < C; c++) {
        A acc = 0;
        for (int64_t iy = 0; iy < grid; iy++)
          for (int64_t ix = 0; ix < grid; ix++) {
            A sy, sx;
            sample_point(g, ph, pw, iy, ix, grid, &sy, &sx);
            const Bilinear<A> b = bilinear(sy, sx, H, W);
            if (!b.valid) continue;
            A v = mul_rn(b.w[0], ld(x[b.at[0] * C + c]));
            for (int k = 1; k < 4; k++) v = add_rn(v, mul_rn(b.w[k], A(ld(x[b.at[k] * C + c]))));
            acc = add_rn(acc, v);
          }
        o[c] = st<T>(acc / count);
      }
    });
  });
}

void roi_align_backward(const Tensor& g, const Tensor& rois, const Tensor& roi_levels, const RoiAlignParams& p,
                        const std::vector<Tensor>& dx) {
  const int64_t R = rois.size(0), L = int64_t(dx.size()), N = dx[0].size(0), C = dx[0].size(3);
  const int64_t grid = p.sampling_ratio, bins = p.out_h * p.out_w;
  const float* box = rois.data<float>();
  const int64_t* assigned = roi_levels.data<int64_t>();
  std::vector<Shape> shapes;
  for (const Tensor& t : dx) shapes.push_back(t.shape());
  const Levels sz = level_sizes(shapes);
  ENGINE_FLOAT_SWITCH(g.dtype(), T, {
    using A = acc_t<T>;
    const T* gy = g.data<T>();  // [R, out_h, out_w, C]
    // f32 (f64) accumulators per map, then stored in T: the sums round once into T at the end, as on the GPU.
    std::vector<std::vector<A>> acc(static_cast<size_t>(L));
    for (int64_t l = 0; l < L; l++) acc[size_t(l)].assign(size_t(dx[size_t(l)].numel()), A(0));
    const A count = A(grid * grid);
    constexpr int64_t kChannels = 16;  // per task: a task owns these channels of every map
    parallel_for((C + kChannels - 1) / kChannels, [&](int64_t task) {
      const int64_t c0 = task * kChannels, c1 = std::min(C, c0 + kChannels);
      for (int64_t r = 0; r < R; r++) {
        const int64_t l = roi_level(box + r * 5, assigned[r], L, N);
        if (l < 0) continue;
        const int64_t H = sz.H[size_t(l)], W = sz.W[size_t(l)];
        A* d = acc[size_t(l)].data() + int64_t(box[r * 5]) * H * W * C;
        const RoiGeometry<A> geo = roi_geometry<A>(box + r * 5, A(p.scales[size_t(l)]), p.out_h, p.out_w, p.aligned);
        for (int64_t bin = 0; bin < bins; bin++) {
          const int64_t ph = bin / p.out_w, pw = bin % p.out_w;
          const T* gb = gy + (r * bins + bin) * C;
          for (int64_t iy = 0; iy < grid; iy++)
            for (int64_t ix = 0; ix < grid; ix++) {
              A sy, sx;
              sample_point(geo, ph, pw, iy, ix, grid, &sy, &sx);
              const Bilinear<A> b = bilinear(sy, sx, H, W);
              if (!b.valid) continue;
              for (int64_t c = c0; c < c1; c++) {
                const A gv = A(ld(gb[c])) / count;
                for (int k = 0; k < 4; k++) d[b.at[k] * C + c] = add_rn(d[b.at[k] * C + c], mul_rn(gv, b.w[k]));
              }
            }
        }
      }
    });
    for (int64_t l = 0; l < L; l++) {
      T* out = dx[size_t(l)].data<T>();
      const std::vector<A>& a = acc[size_t(l)];
      for (size_t i = 0; i < a.size(); i++) out[i] = st<T>(a[i]);
    }
  });
}

}  // namespace ops::cpu
