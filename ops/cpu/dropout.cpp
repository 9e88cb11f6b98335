// cpu/dropout.cpp: the keep decision of element i is a pure function of (seed, offset, i), so the loop
// can run in any order (OpenMP on the contiguous path) and any device reproduces it.
#include "ops/cpu/dropout.h"

#include "engine/rng.h"
#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

void dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out, int64_t group) {
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const A scale = p < 1 ? A(1.0 / (1.0 - p)) : A(0);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    auto keep = [&](int64_t i) { return engine::philox_uniform(seed, offset, uint64_t(i / group)) >= p; };
    if (x.is_contiguous()) {
      parallel_for(out.numel(), [&](int64_t i) { po[i] = st<T>(keep(i) ? ld(px[i]) * scale : A(0)); });
    } else {
      int64_t i = 0;
      for_each_index<1>(x.shape(), {x.strides()}, [&](const std::array<int64_t, 1>& o) {
        po[i] = st<T>(keep(i) ? ld(px[o[0]]) * scale : A(0));
        i++;
      });
    }
  });
}

}  // namespace ops::cpu
