// cuda/factory.cu: rand, randn and randint on the GPU, element for element the cpu's loop in ops/factory.cpp.
//
// Every element is a pure function of (seed, offset, i) (engine/rng.h's philox_uniform, an ENGINE_HD
// function, so host and device run the same code), so a thread per element reproduces the cpu exactly.
// The double arithmetic is written with explicitly rounded intrinsics (__dmul_rn, __dadd_rn): nvcc would
// otherwise fuse a + (b - a) * u into one fma, rounding once where the cpu rounds twice, and a last-bit
// difference can survive the conversion to the tensor's dtype. randn's log and cos are the device's (within
// an ulp or two of the host's), so randn alone may differ in the last bits.
// Random tensors are made once (initialization), so the kernels are simple: one Philox block per element,
// bound by the Philox rounds rather than by the bytes written.
#include "engine/rng.h"
#include "ops/cuda/convert.cuh"
#include "ops/cuda/factory.h"

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kThreads = 256;

enum class Dist { uniform, normal, integer };

// random_fill: grid-stride, thread t takes elements t, t + grid, ...; t[i] as the cpu computes it.
template <Dist kDist, typename T>
__global__ void random_fill(T* out, int64_t n, double a, double b, uint64_t seed, uint64_t offset) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    double v;
    if constexpr (kDist == Dist::uniform) {
      v = __dadd_rn(a, __dmul_rn(__dsub_rn(b, a), double(engine::philox_uniform(seed, offset, uint64_t(i)))));
    } else if constexpr (kDist == Dist::integer) {
      v = floor(__dmul_rn(double(engine::philox_uniform(seed, offset, uint64_t(i))), b));
      if (v >= b) v = b - 1;
    } else {
      double u1 = engine::philox_uniform(seed, offset, uint64_t(2 * i));
      double u2 = engine::philox_uniform(seed, offset, uint64_t(2 * i + 1));
      double radius = sqrt(__dmul_rn(-2.0, log(__dsub_rn(1.0, u1))));
      double angle = cos(__dmul_rn(6.283185307179586, u2));
      v = __dadd_rn(a, __dmul_rn(__dmul_rn(b, radius), angle));
    }
    out[i] = st<T>(v);
  }
}

template <Dist kDist>
void launch_random(const Tensor& t, double a, double b, uint64_t seed, uint64_t offset) {
  ENGINE_CHECK(t.is_contiguous(), "cuda random: the tensor must be contiguous");
  const int64_t n = t.numel();
  if (n == 0) return;
  ENGINE_CUDA_ALL_SWITCH(t.dtype(), T, {
    random_fill<kDist><<<grid_for(n, kThreads), kThreads, 0, engine::cuda::stream()>>>(
        static_cast<T*>(t.data_ptr()), n, a, b, seed, offset);
  });
}

}  // namespace

void rand_uniform(const Tensor& t, double low, double high, uint64_t seed, uint64_t offset) {
  launch_random<Dist::uniform>(t, low, high, seed, offset);
  ENGINE_CUDA_LAUNCH_CHECK("rand");
}

void randn(const Tensor& t, double mean, double std, uint64_t seed, uint64_t offset) {
  launch_random<Dist::normal>(t, mean, std, seed, offset);
  ENGINE_CUDA_LAUNCH_CHECK("randn");
}

void randint(const Tensor& t, double high, uint64_t seed, uint64_t offset) {
  launch_random<Dist::integer>(t, 0.0, high, seed, offset);
  ENGINE_CUDA_LAUNCH_CHECK("randint");
}

}  // namespace ops::cuda
