// cuda/roi_align.cu: RoIAlign on the GPU, deterministic in both directions with no atomics.
//
//   roi_align_forward_kernel   a thread per output element (r, ph, pw, c), c fastest, so a warp reads 32 channels
//                              of the same 4 neighbours (NHWC: contiguous). Its sampling_ratio^2 samples are
//                              summed in the cpu's order (cpu/roi_align.h's geometry and mul_rn / add_rn).
//   roi_align_backward_kernel  output-stationary: a block owns a tile of kTilePixels pixels of one map and image,
//                              for kThreads channels (a thread per channel; its accumulators are its column of a
//                              shared [pixels][channels] array, so no two threads touch one element and no
//                              synchronisation is needed). Every thread walks all RoIs in order, skips those of
//                              another level or image or whose footprint misses the tile, and adds (g / count) w
//                              for each sample's neighbours that fall in the tile: each input element sums its
//                              contributions in the cpu's order (RoI, bin, sample, neighbour), so the gradient
//                              equals the cpu's bit for bit. Every pixel of every map is written exactly once.
// Bound: the forward by its reads (4 neighbours per sample, mostly from L2); the backward by the RoI walk, R per
// tile (a bounding-box test each) plus, per RoI that overlaps the tile, the samples whose rows and columns can reach
// it (sample_range: a large RoI's 14 x 14 x 4 samples span many tiles, each tile visits its own few; visiting all of
// them in every tile was 26 ms of a 77 ms bf16 Mask R-CNN step on the H200, 9 GB/s).
#include "ops/cpu/roi_align.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/roi_align.h"

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kMaxLevels = 8;
constexpr int kThreads = 128;      // channels per block (backward), threads per block (forward)
constexpr int kTileBytes = 32768;  // the backward's shared accumulators

template <typename T>
struct LevelTable {
  const T* x[kMaxLevels];
  T* dx[kMaxLevels];
  int64_t H[kMaxLevels], W[kMaxLevels];
  double scale[kMaxLevels];
  int64_t L, N, C, R, out_h, out_w, grid;
  bool aligned;
};

template <typename T>
LevelTable<T> table_of(const std::vector<Tensor>& maps, const Tensor& rois, const RoiAlignParams& p, bool output) {
  ENGINE_CHECK(maps.size() <= size_t(kMaxLevels), "roi_align on cuda: at most ", kMaxLevels, " levels, got ",
               maps.size());
  LevelTable<T> t{};
  t.L = int64_t(maps.size()), t.N = maps[0].size(0), t.C = maps[0].size(3), t.R = rois.size(0);
  t.out_h = p.out_h, t.out_w = p.out_w, t.grid = p.sampling_ratio, t.aligned = p.aligned;
  for (size_t l = 0; l < maps.size(); l++) {
    if (output) {
      t.dx[l] = static_cast<T*>(maps[l].data_ptr());
    } else {
      t.x[l] = static_cast<const T*>(maps[l].data_ptr());
    }
    t.H[l] = maps[l].size(1), t.W[l] = maps[l].size(2), t.scale[l] = p.scales[l];
  }
  return t;
}

template <typename T>
__global__ void roi_align_forward_kernel(LevelTable<T> t, const float* rois, const int64_t* levels, T* y) {
  using A = acc_t<T>;
  const int64_t total = t.R * t.out_h * t.out_w * t.C;
  const A count = A(t.grid * t.grid);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % t.C, rb = i / t.C, pw = rb % t.out_w, ph = rb / t.out_w % t.out_h,
                  r = rb / (t.out_w * t.out_h);
    const float* box = rois + r * 5;
    const int64_t l = cpu::roi_level(box, levels[r], t.L, t.N);
    if (l < 0) {
      y[i] = from_acc<T>(A(0));
      continue;
    }
    const int64_t H = t.H[l], W = t.W[l];
    const T* x = t.x[l] + int64_t(box[0]) * H * W * t.C;
    const cpu::RoiGeometry<A> g = cpu::roi_geometry<A>(box, A(t.scale[l]), t.out_h, t.out_w, t.aligned);
    A acc = A(0);
    for (int64_t iy = 0; iy < t.grid; iy++)
      for (int64_t ix = 0; ix < t.grid; ix++) {
        A sy, sx;
        cpu::sample_point(g, ph, pw, iy, ix, t.grid, &sy, &sx);
        const cpu::Bilinear<A> b = cpu::bilinear(sy, sx, H, W);
        if (!b.valid) continue;
        A v = cpu::mul_rn(b.w[0], to_acc<A>(x[b.at[0] * t.C + c]));
        for (int k = 1; k < 4; k++) v = cpu::add_rn(v, cpu::mul_rn(b.w[k], to_acc<A>(x[b.at[k] * t.C + c])));
        acc = cpu::add_rn(acc, v);
      }
    y[i] = from_acc<T>(acc / count);
  }
}

// The samples along one axis (index s = bin * grid + sample, position start + (s + 0.5) step / grid) whose
// neighbours can fall in pixels [t0, t0 + extent) of a map of `size`: a conservative range, two pixels and one sample
// wider than exact arithmetic needs (rounding moves a position by far less), the whole axis where the clamping at
// the map's edges reaches the tile or the step is not positive (an inverted aligned box).
struct SampleRange {
  int64_t lo, hi;  // inclusive; lo > hi: none
};
template <typename A>
__device__ SampleRange sample_range(A start, A step, int64_t grid, int64_t bins, int64_t t0, int64_t extent,
                                    int64_t size) {
  const int64_t last = bins * grid - 1;
  if (!(step > A(0)) || !isfinite(start) || !isfinite(step)) return {0, last};
  const A per = step / A(grid);  // the distance between samples
  // Neighbours are floor(y) and floor(y) + 1 (clamped into the map): y in [t0 - 1, t0 + extent) reaches the tile.
  int64_t lo = 0, hi = last;
  if (t0 > 0) lo = int64_t(floor((A(t0 - 3) - start) / per - A(0.5))) - 1;
  if (t0 + extent < size - 1) hi = int64_t(ceil((A(t0 + extent + 2) - start) / per - A(0.5))) + 1;
  return {lo < 0 ? 0 : lo, hi > last ? last : hi};
}

// Block (tile, channel block) of map l: tiles of kTileW x tile_h pixels over n images.
template <typename T>
__global__ void roi_align_backward_kernel(LevelTable<T> t, int64_t l, int64_t tile_h, int64_t tile_w, const float* rois,
                                          const int64_t* levels, const T* g) {
  using A = acc_t<T>;
  extern __shared__ unsigned char shared_bytes[];
  A* acc = reinterpret_cast<A*>(shared_bytes);  // [tile pixels][kThreads]
  const int64_t H = t.H[l], W = t.W[l], tiles_x = (W + tile_w - 1) / tile_w, tiles_y = (H + tile_h - 1) / tile_h;
  const int64_t tile = blockIdx.x, n = tile / (tiles_x * tiles_y), ty = tile / tiles_x % tiles_y, tx = tile % tiles_x;
  const int64_t y0 = ty * tile_h, x0 = tx * tile_w, c = int64_t(blockIdx.y) * kThreads + threadIdx.x;
  const int64_t pixels = tile_h * tile_w;
  if (c >= t.C) return;  // no synchronisation below: each thread is alone with its column
  for (int64_t k = 0; k < pixels; k++) acc[k * kThreads + threadIdx.x] = A(0);
  const A count = A(t.grid * t.grid);
  for (int64_t r = 0; r < t.R; r++) {
    const float* box = rois + r * 5;
    if (cpu::roi_level(box, levels[r], t.L, t.N) != l || int64_t(box[0]) != n) continue;
    const cpu::RoiGeometry<A> geo = cpu::roi_geometry<A>(box, A(t.scale[l]), t.out_h, t.out_w, t.aligned);
    // The footprint: every neighbour lies within one pixel of the box's extent, clamped into the map.
    const A ey = geo.y0 + A(t.out_h) * geo.bin_h, ex = geo.x0 + A(t.out_w) * geo.bin_w;  // the far edges
    const A fy0 = min(geo.y0, ey) - A(1), fy1 = max(geo.y0, ey) + A(1);  // (aligned boxes may be inverted)
    const A fx0 = min(geo.x0, ex) - A(1), fx1 = max(geo.x0, ex) + A(1);
    if (fy1 < A(y0) || fy0 > A(y0 + tile_h) || fx1 < A(x0) || fx0 > A(x0 + tile_w)) continue;
    const T* gr = g + r * t.out_h * t.out_w * t.C;
    // Only the sample rows and columns that can reach the tile: skipping the others leaves the order of the
    // contributions each pixel does receive as the cpu's (a subsequence of the same walk), so the sum is the same.
    const SampleRange rows = sample_range(geo.y0, geo.bin_h, t.grid, t.out_h, y0, tile_h, H);
    const SampleRange cols = sample_range(geo.x0, geo.bin_w, t.grid, t.out_w, x0, tile_w, W);
    for (int64_t ph = rows.lo / t.grid; ph <= rows.hi / t.grid; ph++)
      for (int64_t pw = cols.lo / t.grid; pw <= cols.hi / t.grid; pw++) {
        const A gv = to_acc<A>(gr[(ph * t.out_w + pw) * t.C + c]) / count;
        for (int64_t iy = 0; iy < t.grid; iy++) {
          if (ph * t.grid + iy < rows.lo || ph * t.grid + iy > rows.hi) continue;
          for (int64_t ix = 0; ix < t.grid; ix++) {
            if (pw * t.grid + ix < cols.lo || pw * t.grid + ix > cols.hi) continue;
            A sy, sx;
            cpu::sample_point(geo, ph, pw, iy, ix, t.grid, &sy, &sx);
            const cpu::Bilinear<A> b = cpu::bilinear(sy, sx, H, W);
            if (!b.valid) continue;
#pragma unroll
            for (int k = 0; k < 4; k++) {
              const int64_t py = b.at[k] / W - y0, px = b.at[k] % W - x0;
              if (py < 0 || py >= tile_h || px < 0 || px >= tile_w) continue;
              A& a = acc[(py * tile_w + px) * kThreads + threadIdx.x];
              a = cpu::add_rn(a, cpu::mul_rn(gv, b.w[k]));
            }
          }
        }
      }
  }
  T* dx = t.dx[l] + n * H * W * t.C;
  for (int64_t py = 0; py < tile_h && y0 + py < H; py++)
    for (int64_t px = 0; px < tile_w && x0 + px < W; px++)
      dx[((y0 + py) * W + x0 + px) * t.C + c] = from_acc<T>(acc[(py * tile_w + px) * kThreads + threadIdx.x]);
}

}  // namespace

void roi_align_forward(const std::vector<Tensor>& levels, const Tensor& rois, const Tensor& roi_levels,
                       const RoiAlignParams& p, const Tensor& y) {
  if (y.numel() == 0) return;
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(y.dtype(), T, {
    LevelTable<T> t = table_of<T>(levels, rois, p, false);
    roi_align_forward_kernel<T><<<grid_for(y.numel(), kThreads), kThreads, 0, stream>>>(
        t, static_cast<const float*>(rois.data_ptr()), static_cast<const int64_t*>(roi_levels.data_ptr()),
        static_cast<T*>(y.data_ptr()));
  });
  ENGINE_CUDA_LAUNCH_CHECK("roi_align");
}

void roi_align_backward(const Tensor& g, const Tensor& rois, const Tensor& roi_levels, const RoiAlignParams& p,
                        const std::vector<Tensor>& dx) {
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(g.dtype(), T, {
    using A = acc_t<T>;
    LevelTable<T> t = table_of<T>(dx, rois, p, true);
    constexpr int64_t kPixels = kTileBytes / int64_t(kThreads * sizeof(A));  // 64 (f32 accumulators), 32 (f64)
    const int64_t tile_w = 8, tile_h = kPixels / tile_w;
    for (int64_t l = 0; l < t.L; l++) {
      if (dx[size_t(l)].numel() == 0) continue;
      const int64_t tiles = t.N * ((t.H[l] + tile_h - 1) / tile_h) * ((t.W[l] + tile_w - 1) / tile_w);
      const dim3 blocks(unsigned(tiles), unsigned((t.C + kThreads - 1) / kThreads));
      roi_align_backward_kernel<T><<<blocks, kThreads, size_t(kTileBytes), stream>>>(
          t, l, tile_h, tile_w, static_cast<const float*>(rois.data_ptr()),
          static_cast<const int64_t*>(roi_levels.data_ptr()), static_cast<const T*>(g.data_ptr()));
    }
  });
  ENGINE_CUDA_LAUNCH_CHECK("roi_align_backward");
}

}  // namespace ops::cuda
