// cpu/dropout.cpp: the keep decision of element i is a pure function of (seed, offset, i), so the loop
// can run in any order (OpenMP on the contiguous path) and any device reproduces it.
#include "ops/cpu/dropout.h"

#include "engine/rng.h"
#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

void dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out, int64_t group) {
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const engine::DropoutRate rate = engine::dropout_rate(p);
    const A scale = A(rate.keep_scale);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    auto keep = [&](int64_t i) { return engine::dropout_bits(seed, offset, uint64_t(i / group)) >= rate.threshold; };
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
