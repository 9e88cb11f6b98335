// cuda/synthetic.cu: paint_rectangles on the GPU: the synthetic images made where they are used.
//
//   paint_rectangles_kernel   grid-stride, a thread per group of 4 consecutive pixels (row-major over
//                             [N, H, W]): their 12 channel values are elements 12g .. 12g + 11, i.e. exactly
//                             Philox blocks 3g, 3g + 1, 3g + 2 (cpu/synthetic.h's synthetic_block), so no
//                             draw is made twice. Each pixel asks synthetic_pixel (the cpu's function) which
//                             rectangle owns it (R <= a few rows of the scene table, read through L1), then
//                             one fma per channel (synthetic_value). Stores: 12 values as 16-byte vectors
//                             (f32 3 x 4, f64 6 x 2; bf16/f16 3 x 8-byte) and 4 labels (and 4 instances) as
//                             2 x 16 bytes when the group is whole and the outputs 16-byte aligned; the tail
//                             group element-wise.
// Bound: memory, by the writes: N H W (3 sizeof(T) + 8 per map) bytes; the scene table and palette
// are a few hundred bytes. The 30 Philox rounds per 4 pixels (two 32x32->64 multiplies each) are the
// other cost: about as many integer multiplies as bytes / 2 for f32, below the store time on an H200.
#include "engine/rng.h"
#include "ops/cpu/synthetic.h"
#include "ops/cuda/convert.cuh"
#include "ops/cuda/synthetic.h"

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kThreads = 256;
constexpr int kGroup = 4;  // pixels per thread: 12 channel values = 3 whole Philox blocks

struct PaintArgs {
  const int64_t* scenes;  // [N, R, 5]
  const float* palette;   // [K, 3]
  int64_t R, K, H, W, pixels;  // pixels = N H W
  uint64_t seed;
  int64_t step;
  float noise;
  bool borders;
  int64_t border_label;
  bool ellipses;
};

// The 4 int64 of a whole group to a 16-byte aligned map as 2 x 16 bytes, else element-wise.
__device__ void store_map(int64_t* map, const int64_t (&v)[4], int count, bool vector_stores) {
  if (count == 4 && vector_stores) {
    reinterpret_cast<Vec<int64_t, 2>*>(map)[0] = Vec<int64_t, 2>{{v[0], v[1]}};
    reinterpret_cast<Vec<int64_t, 2>*>(map)[1] = Vec<int64_t, 2>{{v[2], v[3]}};
  } else {
    for (int j = 0; j < count; j++) map[j] = v[j];
  }
}

// Elements per vector store: 4 (16 bytes f32, 8 bytes bf16/f16), 2 for f64 (16 bytes). 12 / VEC stores
// per group; group g starts at byte 12 g sizeof(T), a multiple of the vector's size.
template <typename T> constexpr int store_vec() { return vec16<T>() < 4 ? vec16<T>() : 4; }

template <typename T>
__global__ void paint_rectangles_kernel(PaintArgs a, T* images, int64_t* labels, int64_t* instances,
                                        bool vector_stores) {
  constexpr int VEC = store_vec<T>();
  static_assert(kGroup == 4, "store_map writes groups of 4");
  const int64_t groups = (a.pixels + kGroup - 1) / kGroup, plane = a.H * a.W;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    uint32_t bits[3 * kGroup];  // bits[k]: element 12 g + k
#pragma unroll
    for (int b = 0; b < 3; b++) cpu::synthetic_block(a.seed, a.step, uint64_t(3 * g + b), bits + 4 * b);
    const int64_t p0 = kGroup * g;
    const int count = int(min(int64_t(kGroup), a.pixels - p0));
    int64_t n = p0 / plane, y = (p0 - n * plane) / a.W, x = p0 - n * plane - y * a.W;
    float v[3 * kGroup];
    int64_t lab[kGroup], inst[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; j++) {
      lab[j] = inst[j] = 0;
      v[3 * j] = v[3 * j + 1] = v[3 * j + 2] = 0.f;
      if (j < count) {
        const cpu::PixelPaint px = cpu::synthetic_pixel(a.scenes + n * a.R * cpu::kSceneFields, a.R, a.K, y, x,
                                                        a.borders, a.border_label, a.ellipses);
        lab[j] = px.label;
        inst[j] = px.instance;
#pragma unroll
        for (int c = 0; c < 3; c++)
          v[3 * j + c] = cpu::synthetic_value(__ldg(a.palette + px.colour * 3 + c), a.noise,
                                              engine::philox_bits_to_uniform(bits[3 * j + c]));
      }
      if (++x == a.W) {  // the next pixel in row-major order
        x = 0;
        if (++y == a.H) y = 0, n++;
      }
    }
    T* out = images + 3 * p0;
    if (count == kGroup && vector_stores) {
#pragma unroll
      for (int k = 0; k < 3 * kGroup / VEC; k++) {
        Vec<T, VEC> w;
#pragma unroll
        for (int i = 0; i < VEC; i++) w.v[i] = st<T>(v[k * VEC + i]);
        reinterpret_cast<Vec<T, VEC>*>(out)[k] = w;
      }
    } else {
      for (int i = 0; i < 3 * count; i++) out[i] = st<T>(v[i]);
    }
    if (labels) store_map(labels + p0, lab, count, vector_stores);
    if (instances) store_map(instances + p0, inst, count, vector_stores);
  }
}

}  // namespace

void paint_rectangles(const Tensor& scenes, const Tensor& palette, const PaintOptions& o, const PaintedImages& out) {
  PaintArgs a;
  a.scenes = static_cast<const int64_t*>(scenes.data_ptr());
  a.palette = static_cast<const float*>(palette.data_ptr());
  a.R = scenes.size(1), a.K = palette.size(0), a.H = o.height, a.W = o.width;
  a.pixels = scenes.size(0) * o.height * o.width;
  a.seed = o.seed, a.step = o.step, a.noise = float(o.noise);
  a.borders = o.borders, a.border_label = o.border_label, a.ellipses = o.ellipses;
  if (a.pixels == 0) return;
  int64_t* label_map = out.labels.defined() ? static_cast<int64_t*>(out.labels.data_ptr()) : nullptr;
  int64_t* instance_map = out.instances.defined() ? static_cast<int64_t*>(out.instances.data_ptr()) : nullptr;
  const bool vector_stores = aligned16(out.images.data_ptr()) && (!label_map || aligned16(label_map)) &&
                             (!instance_map || aligned16(instance_map));
  const int64_t groups = (a.pixels + kGroup - 1) / kGroup;
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(out.images.dtype(), T, {
    paint_rectangles_kernel<T><<<grid_for(groups, kThreads), kThreads, 0, stream>>>(
        a, static_cast<T*>(out.images.data_ptr()), label_map, instance_map, vector_stores);
  });
  ENGINE_CUDA_LAUNCH_CHECK("paint_rectangles");
}

}  // namespace ops::cuda
