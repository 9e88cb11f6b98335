// conv_cuda_util.h: what the GPU convolution tests (conv_cuda_test.cpp) and benchmarks (conv_perf_cuda_test.cpp)
// share: a layer's description (Case) and its geometry, random and NaN-poisoned tensors, the op's Winograd
// workspace, and scopes that set TF32 and Winograd for a block.
#pragma once
#include <cstdlib>
#include <limits>
#include <string>

#include "engine/dtype.h"
#include "engine/error.h"
#include "ops/conv.h"
#include "ops/conv_params.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "tests/util/cuda_compare_util.h"

namespace conv_test {

using engine::DType;
using engine::Shape;
using engine::Tensor;
using ops::ConvPass;

struct Case {
  int64_t n, h, w, cin, cout, kh, kw;
  ops::Conv2dParams p;
  bool bias = true;
};

inline ops::Conv2dParams params(int64_t stride, int64_t pad, int64_t dilation = 1, int64_t groups = 1) {
  ops::Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.dilation_h = p.dilation_w = dilation;
  p.groups = groups;
  return p;
}

inline ops::ConvGeometry geometry(const Case& c) {
  return ops::conv2d_geometry("conv_cuda_test", {c.n, c.h, c.w, c.cin}, {c.cout, c.kh, c.kw, c.cin / c.p.groups}, c.p);
}

inline std::string describe(const ops::ConvGeometry& g) {
  return engine::str("x [", g.n, ",", g.h, ",", g.w, ",", g.cin, "] -> ", g.cout, " k ", g.kh, "x", g.kw, " s ",
                     g.p.stride_h, "x", g.p.stride_w, " p ", g.p.pad_h, "x", g.p.pad_w, " d ", g.p.dilation_h, "x",
                     g.p.dilation_w, " g ", g.p.groups, " (y ", g.ho, "x", g.wo, ")");
}

inline Tensor random(const Shape& s, DType t) { return ops::to(ops::randn(s), t); }
inline Tensor poisoned(const Shape& s, DType t) {
  return ops::full(s, std::numeric_limits<double>::quiet_NaN(), t, testutil::cuda_device());
}

// Winograd's workspace for a pass of geometry g (the one the GPU computes) as the op allocates it (ops/conv.cpp),
// poisoned; undefined when the pass takes another kernel (conv_params.h's conv2d_winograd: TF32, ENGINE_CONV_WINOGRAD).
inline Tensor winograd_workspace(const ops::ConvGeometry& g, ConvPass pass, DType t) {
  const ops::WinogradPlan plan = ops::conv2d_winograd(g, pass, int64_t(engine::dtype_size(t)), engine::allow_tf32());
  return plan.chunk ? poisoned({plan.elems}, DType::f32) : Tensor();
}

// Sets engine::allow_tf32() for a scope (the process-wide switch of --precision tf32), off after.
struct Tf32Scope {
  explicit Tf32Scope(bool on) { engine::set_allow_tf32(on); }
  ~Tf32Scope() { engine::set_allow_tf32(false); }
};

// Sets ENGINE_CONV_WINOGRAD for a scope (on or off; on by default: conv_params.h), unset after.
struct WinogradScope {
  explicit WinogradScope(bool on) { setenv("ENGINE_CONV_WINOGRAD", on ? "1" : "0", 1); }
  ~WinogradScope() { unsetenv("ENGINE_CONV_WINOGRAD"); }
};

}  // namespace conv_test
