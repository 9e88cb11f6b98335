// conv_cuda_test.cpp: the GPU convolution kernels (ops/cuda/conv*) against the cpu reference kernels
// (ops/cpu/conv.h), called directly on the same random inputs: forward, data gradient and weight gradient
// over a sweep of geometries (kernel 1/3/5/7, stride 1/2, dilation 1/2/6/12/18, groups 1, grouped and
// depthwise, odd sizes, channels multiples of 8 and not) in f32/bf16/f16 (f64 on the generic paths), so
// that every GPU path (gemm, depthwise, igemm, generic) meets shapes that cross its tile edges. GPU outputs
// are poisoned with NaN first (every element must be written), and the split-K workspace too. The error is
// max |cuda - cpu| / max |cpu| (relative to the output's scale), within a tolerance by dtype. The same sweep
// runs in f32 with TF32 allowed (engine::allow_tf32(): the implicit GEMMs on TF32 tensor cores, the 1x1
// GEMMs on cuBLASLt's FAST_TF32) against the f32 cpu reference with the TF32 tolerance derived below; with
// TF32 off again f32 is true fp32 (1e-5); the ledger of a TF32 training step equals meta's. The benchmarks of the
// same kernels are in conv_perf_cuda_test.cpp; the helpers both use in conv_cuda_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>

#include "engine/cuda/runtime.h"
#include "engine/device.h"
#include "graph/autograd.h"
#include "ops/conv.h"
#include "ops/cpu/conv.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv_kernels.cuh"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "tests/ops/conv_cuda_util.h"
#include "tests/util/cuda_compare_util.h"

using namespace conv_test;  // NOLINT: Case, geometry, random, poisoned, the scopes (conv_cuda_util.h)

namespace {

// TF32 keeps 10 of f32's 23 mantissa bits; cvt.rna (and cuBLASLt's FAST_TF32) rounds each operand to
// nearest, a relative error of at most u = 2^-11 each, so each product a*b carries a relative error delta
// within 2u, roughly uniform and independent across the K terms (std sqrt(2/3) u ~ 0.82u); f32 accumulation
// adds ~1e-7. An output's error is then ~0.82u sqrt(K) rms(a b), its value ~ sqrt(K) rms(a b): both grow as
// sqrt(K), so max |error| / max |output| is about 0.82u times the ratio of the two maxima's tail factors
// (<= ~4.5 / 2.5 over these sizes), ~1.5u ~ 7e-4 whatever K is. 4u = 2^-9 ~ 2e-3 leaves a margin of ~2.7.
constexpr double kTf32Tolerance = 1.0 / 512;

double tolerance(DType t) {
  if (t == DType::f32 && engine::allow_tf32()) return kTf32Tolerance;
  switch (t) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 2e-5;
    case DType::f16:
      return 3e-3;
    default:
      return 1.5e-2;  // bf16: 8 mantissa bits
  }
}

// max |got - ref| / max |ref|; NaN (an unwritten element) gives NaN.
double scaled_error(const Tensor& got, const Tensor& ref) {
  auto a = got.to_double(), b = ref.to_double();
  EXPECT_EQ(a.size(), b.size());
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); i++) {
    const double e = std::fabs(a[i] - b[i]);
    if (std::isnan(e)) return std::numeric_limits<double>::quiet_NaN();
    err = std::max(err, e);
    scale = std::max(scale, std::fabs(b[i]));
  }
  return err / scale;
}

void expect_pass_close(const char* pass, const ops::ConvGeometry& g, DType t, ConvPass which, const Tensor& got,
                       const Tensor& ref) {
  const double err = scaled_error(got, ref);
  EXPECT_TRUE(err <= tolerance(t)) << pass << " " << describe(g) << " " << engine::dtype_name(t) << " path "
                                   << ops::cuda::conv2d_path(which, g, t) << ": max error / max |cpu| = " << err
                                   << " > " << tolerance(t);
}

void expect_close_named(const std::string& what, const ops::ConvGeometry& g, DType t, const Tensor& got,
                        const Tensor& ref) {
  const double err = scaled_error(got, ref);
  EXPECT_TRUE(err <= tolerance(t)) << what << " " << describe(g) << " " << engine::dtype_name(t)
                                   << ": max error / max |cpu| = " << err << " > " << tolerance(t);
}

void check_case(const Case& c, DType t) {
  const ops::ConvGeometry g = geometry(c);
  const auto dev = testutil::cuda_device();
  const Shape xs{g.n, g.h, g.w, g.cin}, ws{g.cout, g.kh, g.kw, g.cin_per_group()}, ys{g.n, g.ho, g.wo, g.cout};
  Tensor x = random(xs, t), w = random(ws, t), dy = random(ys, t);
  Tensor bias = c.bias ? random({g.cout}, t) : Tensor();

  Tensor y = Tensor::empty(ys, t), dx = Tensor::empty(xs, t), dw = Tensor::empty(ws, t);
  ops::cpu::conv2d_forward(x, w, bias, y, g);
  ops::cpu::conv2d_backward_data(dy, w, dx, g);
  ops::cpu::conv2d_backward_weight(x, dy, dw, Tensor(), g);

  Tensor xg = ops::to_device(x, dev), wg = ops::to_device(w, dev), dyg = ops::to_device(dy, dev);
  Tensor bg = c.bias ? ops::to_device(bias, dev) : Tensor();
  Tensor yg = poisoned(ys, t), dxg = poisoned(xs, t), dwg = poisoned(ws, t);
  // The workspaces as the op allocates them (ops/conv.cpp), poisoned: the channel padding's zeros must be written
  // by the kernels' wrappers.
  const int64_t es = int64_t(engine::dtype_size(t));
  const ops::ConvGeometry gp = ops::conv2d_padded(g, es);
  const bool padding = gp.cin != g.cin || gp.cout != g.cout;
  Tensor pad = padding ? poisoned({ops::conv2d_padding_elems(g, es)}, t) : Tensor();
  const Tensor wino_f = winograd_workspace(gp, ConvPass::forward, t);
  const Tensor wino_d = winograd_workspace(gp, ConvPass::data, t), wino_w = winograd_workspace(gp, ConvPass::weight, t);
  const int64_t splits = wino_w.defined() ? 1 : ops::conv2d_weight_grad_splits(gp);
  Tensor wsg = splits > 1 ? poisoned({splits, gp.cout, g.kh, g.kw, gp.cin_per_group()}, DType::f32) : Tensor();
  ops::cuda::conv2d_forward(xg, wg, bg, yg, g, pad, wino_f);
  ops::cuda::conv2d_backward_data(dyg, wg, dxg, g, pad, wino_d);
  ops::cuda::conv2d_backward_weight(xg, dyg, dwg, wsg, g, pad, wino_w);

  expect_pass_close("conv2d_forward", g, t, ConvPass::forward, yg, y);
  expect_pass_close("conv2d_backward_data", g, t, ConvPass::data, dxg, dx);
  expect_pass_close("conv2d_backward_weight", g, t, ConvPass::weight, dwg, dw);
  if (padding) {  // the unpadded geometry's own paths too (the gathering kernels, the generic one)
    const int64_t splits0 = ops::conv2d_weight_grad_splits(g);
    Tensor ws0 = splits0 > 1 ? poisoned({splits0, g.cout, g.kh, g.kw, g.cin_per_group()}, DType::f32) : Tensor();
    Tensor y0 = poisoned(ys, t), dx0 = poisoned(xs, t), dw0 = poisoned(ws, t);
    ops::cuda::conv2d_forward(xg, wg, bg, y0, g);
    ops::cuda::conv2d_backward_data(dyg, wg, dx0, g);
    ops::cuda::conv2d_backward_weight(xg, dyg, dw0, ws0, g);
    expect_close_named("conv2d_forward (unpadded)", g, t, y0, y);
    expect_close_named("conv2d_backward_data (unpadded)", g, t, dx0, dx);
    expect_close_named("conv2d_backward_weight (unpadded)", g, t, dw0, dw);
  }

  // The kernels that the dispatch above did not pick for this shape, called directly: the generic
  // anchor on every shape, and the all-taps data gradient wherever the per-phase one ran.
  namespace k = ops::cuda::conv;
  const k::Dims d = k::dims_of(g);
  const void* b = c.bias ? bg.data_ptr() : nullptr;
  const std::string data_path = ops::cuda::conv2d_path(ConvPass::data, g, t);
  if (wino_f.defined() && !padding) {  // Winograd ran: the direct SIMT kernels too
    const int64_t splits1 = ops::conv2d_weight_grad_splits(g);
    Tensor ws1 = splits1 > 1 ? poisoned({splits1, g.cout, g.kh, g.kw, g.cin}, DType::f32) : Tensor();
    Tensor y2 = poisoned(ys, t), dx2 = poisoned(xs, t), dw2 = poisoned(ws, t);
    k::simt_forward(d, xg.data<float>(), wg.data<float>(), c.bias ? bg.data<float>() : nullptr, y2.data<float>());
    k::simt_data(d, dyg.data<float>(), wg.data<float>(), dx2.data<float>());
    float* partials = ws1.defined() ? ws1.data<float>() : nullptr;
    k::simt_weight(d, xg.data<float>(), dyg.data<float>(), dw2.data<float>(), partials, int(splits1));
    expect_close_named("conv2d_forward (SIMT)", g, t, y2, y);
    expect_close_named("conv2d_backward_data (SIMT)", g, t, dx2, dx);
    expect_close_named("conv2d_backward_weight (SIMT)", g, t, dw2, dw);
  }
  if (data_path == "igemm" || data_path == "igemm_tf32") {
    Tensor dx2 = poisoned(xs, t);
    k::igemm_data(d, t, dyg.data_ptr(), wg.data_ptr(), dx2.data_ptr());
    expect_close_named("conv2d_backward_data (all-taps implicit GEMM)", g, t, dx2, dx);
  }
  {
    Tensor y2 = poisoned(ys, t), dx2 = poisoned(xs, t), dw2 = poisoned(ws, t);
    k::generic_forward(d, t, xg.data_ptr(), wg.data_ptr(), b, y2.data_ptr());
    k::generic_data(d, t, dyg.data_ptr(), wg.data_ptr(), dx2.data_ptr());
    k::generic_weight(d, t, xg.data_ptr(), dyg.data_ptr(), dw2.data_ptr());
    expect_close_named("conv2d_forward (generic)", g, t, y2, y);
    expect_close_named("conv2d_backward_data (generic)", g, t, dx2, dx);
    expect_close_named("conv2d_backward_weight (generic)", g, t, dw2, dw);
  }
}

std::vector<Case> sweep() {
  return {
      // 1x1: the GEMM path (stride 1), the implicit GEMM / generic (stride 2)
      {2, 7, 9, 16, 24, 1, 1, params(1, 0)},
      {2, 6, 5, 13, 7, 1, 1, params(1, 0), false},
      {2, 9, 7, 16, 32, 1, 1, params(2, 0)},
      // 3x3, odd sizes, channels multiples of 8 and not
      {2, 13, 11, 16, 24, 3, 3, params(1, 1)},
      {1, 12, 10, 24, 40, 3, 3, params(2, 1)},
      {2, 9, 8, 5, 6, 3, 3, params(1, 1)},
      {1, 11, 13, 8, 8, 3, 3, params(2, 0), false},
      {2, 13, 11, 12, 8, 3, 3, params(3, 1)},  // stride 3: nine phases of unequal sizes
      // several tiles in M, N and K; K slices that straddle filter taps (136 % 64 != 0); partial tiles
      {2, 20, 19, 136, 200, 3, 3, params(1, 1)},
      {1, 17, 21, 72, 136, 3, 3, params(2, 1)},
      // weight-gradient split-K (M >= 2048 pixels)
      {2, 40, 37, 32, 48, 3, 3, params(1, 1)},
      {4, 33, 30, 16, 16, 1, 1, params(1, 0)},
      // 5x5 and 7x7 (the stem: 3 input channels; and a multiple of 8)
      {2, 15, 14, 8, 16, 5, 5, params(1, 2)},
      {1, 31, 29, 3, 16, 7, 7, params(2, 3)},
      {1, 23, 25, 8, 16, 7, 7, params(2, 3)},
      // dilation 2 / 6 / 12 / 18 (ASPP), padding = dilation
      {1, 16, 15, 32, 16, 3, 3, params(1, 2, 2)},
      {1, 19, 20, 16, 24, 3, 3, params(1, 6, 6)},
      {1, 25, 23, 16, 8, 3, 3, params(1, 12, 12)},
      {1, 21, 22, 8, 16, 3, 3, params(1, 18, 18)},
      {1, 14, 13, 16, 16, 3, 3, params(2, 2, 2)},
      // groups: channels per group multiples of 8 and not
      {2, 10, 9, 32, 48, 3, 3, params(1, 1, 1, 2)},
      {1, 9, 10, 12, 6, 3, 3, params(2, 1, 1, 3)},
      // gathering implicit GEMM (Cin/g % 8 != 0, Cout/g % 8 == 0): grouped, several K-slices, split-K
      {1, 9, 10, 6, 16, 3, 3, params(1, 1, 1, 2)},
      {2, 70, 69, 3, 16, 7, 7, params(2, 3)},
      // (the next three pad Cin to whole vectors; check_case runs their unpadded, gathering paths as well)
      {1, 34, 66, 39, 64, 4, 4, params(2, 1)},  // pix2pixHD's discriminator input: data gradient per phase, gathered w
      {1, 20, 22, 75, 24, 3, 3, params(1, 1)},  // gathered w rows wider than 64 channels (wgmma's data gradient)
      {1, 12, 13, 20, 72, 3, 3, params(1, 2, 2)},
      // Cin padded (a spatial filter, at most a quarter of zeros): pix2pixHD's local enhancer 7x7 36 -> 32 and
      // its discriminators' 4x4 s2 39 -> 64 (split-K weight gradient), both channel counts padded (30 -> 32, 3 -> 8)
      {1, 23, 21, 36, 32, 7, 7, params(1, 3)},
      {1, 70, 66, 39, 64, 4, 4, params(2, 2)},
      {2, 13, 12, 30, 3, 3, 3, params(1, 1)},
      // Cout not a multiple of the channel vector: padded with zero filters (pix2pixHD's final 7x7 32 -> 3, with
      // bias; a stride-2 3-channel output; split-K weight gradient over 2960 pixels; Cin not whole vectors either)
      {1, 21, 19, 32, 3, 7, 7, params(1, 3)},
      {2, 15, 14, 16, 3, 3, 3, params(2, 1)},
      {2, 40, 37, 32, 5, 3, 3, params(1, 1)},
      {1, 17, 16, 6, 3, 3, 3, params(1, 1)},
      // depthwise
      {2, 12, 11, 24, 24, 3, 3, params(1, 1, 1, 24)},
      {1, 13, 14, 7, 7, 3, 3, params(2, 1, 1, 7)},
      {1, 15, 12, 16, 16, 5, 5, params(1, 4, 2, 16)},
      {4, 32, 33, 8, 8, 3, 3, params(1, 1, 1, 8)},  // split-K weight gradient
      // depthwise, tiled kernels (3/5/7, stride 1/2, 2 or 4 channels per thread, strips past the row's end,
      // more than 32 channel vectors: two channel blocks)
      {2, 17, 19, 6, 6, 5, 5, params(2, 2, 1, 6)},
      {1, 23, 21, 12, 12, 7, 7, params(1, 3, 1, 12)},
      {2, 14, 15, 10, 10, 7, 7, params(2, 3, 1, 10)},
      {1, 9, 10, 4, 4, 3, 3, params(2, 0, 1, 4)},
      {1, 16, 13, 14, 14, 7, 7, params(2, 0, 1, 14)},
      {1, 11, 9, 200, 200, 5, 5, params(2, 2, 1, 200)},
      {3, 21, 22, 42, 42, 3, 3, params(1, 1, 1, 42)},
      {2, 13, 18, 42, 42, 5, 5, params(1, 2, 1, 42)},
  };
}

}  // namespace

// Runs body once per tensor-core kernel family: the mma.sync kernels with each 128 x 128 tile variant (warps of
// 64 x 32, of 64 x 64), then the wgmma kernels where the build and the device have them, with each tile shape
// (128 x 128, 128 x 256, 256 x 128; the forward's and data gradient's weights by the bulk tensor copy, the forward's x
// by the im2col copy where it applies), once with the forward's x by cp.async, and once with the weights by cp.async
// (16-bit types; f32 runs its TF32 kernels again); the defaults after.
template <typename F>
void for_each_igemm_kernel(F&& body) {
  ops::cuda::conv::set_igemm_wgmma(false);
  for (int v : {0, 1}) {
    SCOPED_TRACE(engine::str("mma.sync, 128 x 128 tile variant ", v));
    ops::cuda::conv::set_igemm_wide_variant(v);
    body();
  }
  ops::cuda::conv::set_igemm_wide_variant(-1);
  ops::cuda::conv::set_igemm_wgmma(true);
  if (ops::cuda::conv::igemm_wgmma_available()) {
    using ops::cuda::conv::WgShape;
    for (WgShape s : {WgShape::m128n128, WgShape::m128n256, WgShape::m256n128}) {
      SCOPED_TRACE(engine::str("wgmma, tile shape ", int(s)));
      ops::cuda::conv::set_igemm_wgmma_shape(s);
      body();
    }
    {
      SCOPED_TRACE("wgmma, tile by shape, x by cp.async (no im2col bulk copies)");
      ops::cuda::conv::set_igemm_im2col(false);
      body();
      ops::cuda::conv::set_igemm_im2col(true);
    }
    {
      SCOPED_TRACE("wgmma, 128 x 128 tiles, weights by cp.async");
      ops::cuda::conv::set_igemm_wgmma_shape(WgShape::m128n128);
      ops::cuda::conv::set_igemm_tma(false);
      body();
      ops::cuda::conv::set_igemm_tma(true);
    }
    ops::cuda::conv::set_igemm_wgmma_shape(WgShape::by_shape);
  }
}

// A build for sm_90a (the Makefile's default) on a compute capability 9.0 device runs the wgmma kernels: the
// sweeps above would otherwise test the mma.sync kernels twice and say nothing.
TEST(ConvCuda, WgmmaKernelsOnHopper) {
  testutil::cuda_device();
#if defined(ENGINE_WGMMA)
  if (engine::cuda::compute_capability() == 90)
    EXPECT_TRUE(ops::cuda::conv::igemm_wgmma_available());
  else
    EXPECT_FALSE(ops::cuda::conv::igemm_wgmma_available());
#else
  EXPECT_FALSE(ops::cuda::conv::igemm_wgmma_available());
#endif
}

TEST(ConvCuda, SweepMatchesCpu) {
  for (const Case& c : sweep()) check_case(c, DType::f32);
  for_each_igemm_kernel([] {
    for (DType t : {DType::bf16, DType::f16})
      for (const Case& c : sweep()) check_case(c, t);
  });
}

// f32 3x3 stride-1 layers of >= 64 channels run Winograd's F(2x2, 3x3) (conv_params.h's conv2d_winograd): odd and
// even sizes (partial tiles), padding 0 .. 2 d (the data gradient's 2 d - p from 2 d to 0), dilations 1-3 (interleaved
// tile grids), channels not multiples of 8, a padded Cin (66: the padded geometry's Winograd), and the batch cut into
// chunks of 700 tiles by a smaller workspace (chunks that cut images and straddle two; the weight gradient's chunks
// accumulate), and a weight gradient whose tiles are cut into pieces (the last case: 3 x 31^2 = 2883 tiles, 2 pieces
// of 1442 rows, one row of zeros; in chunks of 700 tiles, 2 pieces of 350). check_case also runs the direct SIMT
// kernels on each. Not under TF32 (its tensor-core kernels are faster): "igemm_tf32" there.
TEST(ConvCuda, WinogradMatchesCpu) {
  const std::vector<Case> cases = {
      {2, 13, 11, 64, 68, 3, 3, params(1, 1)},   {1, 10, 9, 72, 64, 3, 3, params(1, 0), false},
      {1, 9, 12, 64, 64, 3, 3, params(1, 2)},    {1, 17, 15, 64, 76, 3, 3, params(1, 2, 2)},
      {2, 14, 13, 68, 64, 3, 3, params(1, 3, 3)}, {1, 8, 11, 66, 64, 3, 3, params(1, 1)},
      {3, 7, 6, 128, 96, 3, 3, params(1, 1, 2)},  {3, 62, 62, 64, 64, 3, 3, params(1, 1)},
  };
  ASSERT_EQ(ops::conv2d_winograd(geometry(cases.back()), ConvPass::weight, 4, false).splits, 2);
  for (const Case& c : cases) {
    const ops::ConvGeometry g = geometry(c);
    for (ConvPass pass : {ConvPass::forward, ConvPass::data, ConvPass::weight}) {
      const std::string path = ops::cuda::conv2d_path(pass, g, DType::f32);
      EXPECT_EQ(path, c.cin % 4 ? "winograd_cin_padded" : "winograd") << describe(g);
    }
    check_case(c, DType::f32);
  }
  {
    Tf32Scope tf32(true);
    EXPECT_EQ(std::string(ops::cuda::conv2d_path(ConvPass::forward, geometry(cases[0]), DType::f32)), "igemm_tf32");
  }
  // Chunks that cut images: a workspace of the filters and 700 of an image's 961 tiles (the chunks straddle images; the
  // weight gradient's 2 pieces of 350 rows, its last chunk 83 tiles in 84 rows).
  const Case c = cases.back();
  const ops::ConvGeometry g = geometry(c);
  const auto dev = testutil::cuda_device();
  const Shape xs{g.n, g.h, g.w, g.cin}, ws{g.cout, g.kh, g.kw, g.cin}, ys{g.n, g.ho, g.wo, g.cout};
  Tensor x = random(xs, DType::f32), w = random(ws, DType::f32), dy = random(ys, DType::f32);
  Tensor y = Tensor::empty(ys), dx = Tensor::empty(xs), dw = Tensor::empty(ws);
  ops::cpu::conv2d_forward(x, w, Tensor(), y, g);
  ops::cpu::conv2d_backward_data(dy, w, dx, g);
  ops::cpu::conv2d_backward_weight(x, dy, dw, Tensor(), g);
  Tensor xg = ops::to_device(x, dev), wg = ops::to_device(w, dev), dyg = ops::to_device(dy, dev);
  Tensor yg = poisoned(ys, DType::f32), dxg = poisoned(xs, DType::f32), dwg = poisoned(ws, DType::f32);
  auto part_image = [&](ConvPass pass) {
    const ops::WinogradPlan plan = ops::conv2d_winograd(g, pass, 4, false);
    EXPECT_EQ(plan.chunk, g.n * plan.tiles) << "the test's batch fits one chunk as the op plans it";
    EXPECT_GT(plan.tiles, 700);
    return poisoned({ops::winograd_elems(g, plan, 700)}, DType::f32);
  };
  ops::cuda::conv2d_forward(xg, wg, Tensor(), yg, g, Tensor(), part_image(ConvPass::forward));
  ops::cuda::conv2d_backward_data(dyg, wg, dxg, g, Tensor(), part_image(ConvPass::data));
  ops::cuda::conv2d_backward_weight(xg, dyg, dwg, Tensor(), g, Tensor(), part_image(ConvPass::weight));
  expect_close_named("conv2d_forward (Winograd, chunks of 700 tiles)", g, DType::f32, yg, y);
  expect_close_named("conv2d_backward_data (Winograd, chunks of 700 tiles)", g, DType::f32, dxg, dx);
  expect_close_named("conv2d_backward_weight (Winograd, chunks of 700 tiles)", g, DType::f32, dwg, dw);
}

// The sweep in f32 with TF32 allowed: every geometry whose channels fit the implicit GEMM (Cin/g and Cout/g
// multiples of 4; Cout/g only, forward and weight gradient) runs on TF32 tensor cores, forward, data and
// weight gradients, within kTf32Tolerance of the f32 cpu reference; both 128 x 128 tile variants.
TEST(ConvCuda, Tf32SweepMatchesCpu) {
  Tf32Scope tf32(true);
  int tf32_passes = 0;
  for (const Case& c : sweep())
    for (ConvPass p : {ConvPass::forward, ConvPass::data, ConvPass::weight})
      tf32_passes += std::string(ops::cuda::conv2d_path(p, geometry(c), DType::f32)).find("tf32") != std::string::npos;
  EXPECT_GE(tf32_passes, 40) << "the sweep should run the TF32 implicit GEMMs on most geometries";
  for_each_igemm_kernel([] {
    for (const Case& c : sweep()) check_case(c, DType::f32);
  });
  check_case({2, 11, 10, 12, 20, 3, 3, params(1, 1)}, DType::f32);      // channels % 4, not % 8: whole chunks
  check_case({1, 10, 9, 8, 24, 3, 3, params(2, 1, 1, 2)}, DType::f32);  // 4 channels per group
  check_case({4, 64, 66, 72, 72, 3, 3, params(1, 1)}, DType::f32);      // 128 x 128 tiles, stride 1
  check_case({4, 128, 132, 72, 72, 3, 3, params(2, 1)}, DType::f32);    // stride 2 (per-phase data gradient)
}

// TF32 really runs (the error is that of 10-bit operands, not fp32's), and switching it off gives true fp32
// again on the same geometries: the direct simt path (Winograd off here; WinogradMatchesCpu tests that path), within
// 1e-5 of the cpu reference.
TEST(ConvCuda, Tf32OffIsTrueFp32) {
  const auto dev = testutil::cuda_device();
  WinogradScope direct(false);
  for (const Case& c : {Case{2, 20, 19, 136, 200, 3, 3, params(1, 1)}, Case{1, 17, 21, 72, 136, 3, 3, params(2, 1)}}) {
    const ops::ConvGeometry g = geometry(c);
    const Shape xs{g.n, g.h, g.w, g.cin}, ws{g.cout, g.kh, g.kw, g.cin_per_group()}, ys{g.n, g.ho, g.wo, g.cout};
    Tensor x = random(xs, DType::f32), w = random(ws, DType::f32), dy = random(ys, DType::f32);
    Tensor y = Tensor::empty(ys, DType::f32), dx = Tensor::empty(xs, DType::f32), dw = Tensor::empty(ws, DType::f32);
    ops::cpu::conv2d_forward(x, w, Tensor(), y, g);
    ops::cpu::conv2d_backward_data(dy, w, dx, g);
    ops::cpu::conv2d_backward_weight(x, dy, dw, Tensor(), g);
    Tensor xg = ops::to_device(x, dev), wg = ops::to_device(w, dev), dyg = ops::to_device(dy, dev);
    const int64_t splits = ops::conv2d_weight_grad_splits(g);
    for (bool on : {true, false}) {
      Tf32Scope tf32(on);
      Tensor yg = poisoned(ys, DType::f32), dxg = poisoned(xs, DType::f32), dwg = poisoned(ws, DType::f32);
      Tensor wsg = splits > 1 ? poisoned({splits, g.cout, g.kh, g.kw, g.cin_per_group()}, DType::f32) : Tensor();
      ops::cuda::conv2d_forward(xg, wg, Tensor(), yg, g);
      ops::cuda::conv2d_backward_data(dyg, wg, dxg, g);
      ops::cuda::conv2d_backward_weight(xg, dyg, dwg, wsg, g);
      const std::pair<ConvPass, std::pair<const Tensor*, const Tensor*>> passes[] = {
          {ConvPass::forward, {&yg, &y}}, {ConvPass::data, {&dxg, &dx}}, {ConvPass::weight, {&dwg, &dw}}};
      for (const auto& [pass, t] : passes) {
        const std::string path = ops::cuda::conv2d_path(pass, g, DType::f32);
        const double err = scaled_error(*t.first, *t.second);
        const std::string what =
            engine::str(describe(g), " pass ", int(pass), " path ", path, ": max error / max |cpu| = ", err);
        if (on) {
          EXPECT_EQ(path, "igemm_tf32") << what;
          EXPECT_TRUE(err > 1e-5 && err <= kTf32Tolerance)
              << what << ": expected TF32's error, in (1e-5, " << kTf32Tolerance << "]";
        } else {
          EXPECT_EQ(path, "simt") << what;
          EXPECT_TRUE(err <= 1e-5) << what << " > 1e-5 (TF32 off must be true fp32)";
        }
      }
    }
  }
}

// A TF32 training step (forward, data and weight gradients through the op, split-K workspace included)
// allocates on the GPU exactly what meta predicts: TF32 changes kernels, never allocations.
TEST(ConvCuda, Tf32LedgerMatchesMeta) {
  Tf32Scope tf32(true);
  testutil::expect_cuda_ledger_matches_meta([] {
    ops::Conv2dParams p = params(1, 1);
    Tensor x = ops::rand({2, 40, 37, 32}, -1, 1, DType::f32).set_requires_grad(true);
    Tensor w = ops::rand({48, 3, 3, 32}, -0.2, 0.2, DType::f32).set_requires_grad(true);
    Tensor b = ops::rand({48}, -1, 1, DType::f32).set_requires_grad(true);
    Tensor y = ops::conv2d(x, w, b, p);
    Tensor w2 = ops::rand({16, 3, 3, 3}, -0.2, 0.2, DType::f32).set_requires_grad(true);  // gathering: Cin 3
    Tensor x2 = ops::rand({1, 31, 29, 3}, -1, 1, DType::f32).set_requires_grad(true);
    Tensor y2 = ops::conv2d(x2, w2, Tensor(), params(2, 1));
    graph::backward(ops::add(ops::sum(ops::mul(y, y)), ops::sum(y2)));
  });
}

// Shapes large enough for the 128 x 128 tensor-core tiles (Cout/g and Cin/g > 64 and >= 264 tiles), stride 1
// and 2, bf16, and for wgmma's 128 x 256 ones; the first in f32.
TEST(ConvCuda, WideTilesMatchCpu) {
  for_each_igemm_kernel([] {
    for (const Case& c : {Case{4, 64, 66, 72, 72, 3, 3, params(1, 1)}, Case{4, 128, 132, 72, 72, 3, 3, params(2, 1)}})
      check_case(c, DType::bf16);
    // wgmma's 128 x 256 tiles (Cout/g, Cin/g or the filter length > 128), a partial one past Cout 256, 19+ K-slices
    check_case({4, 48, 60, 136, 264, 3, 3, params(1, 1)}, DType::bf16);
    check_case({2, 40, 44, 72, 272, 3, 3, params(1, 1, 1, 2)}, DType::f16);  // two groups of 136 channels
    // The data gradient's weight tiles by the bulk tensor copy (Cout/g a multiple of 64): two K-slices per tap and
    // Cin past a 64-channel panel; per stride phase; grouped.
    check_case({2, 30, 28, 136, 128, 3, 3, params(1, 1)}, DType::bf16);
    check_case({2, 33, 30, 72, 192, 3, 3, params(2, 1)}, DType::f16);
    check_case({1, 20, 22, 144, 256, 3, 3, params(1, 1, 1, 2)}, DType::bf16);
  });
  check_case({4, 64, 66, 72, 72, 3, 3, params(1, 1)}, DType::f32);
}

// The Hopper kernels whose activation tiles come by the im2col bulk tensor copy: the forward and weight gradient (x;
// one group, Cin a multiple of 64, Cout > 64) and the data gradient per stride phase (dy; one group, Cout a multiple of
// 64, Cin > 64): tiles across images and past the last one, partial tiles past Cout, stride 2, dilation, no padding,
// 5x5 and 7x7 filters, several 64-channel blocks per tap, split-K pixel ranges; each of the three tile shapes
// (for_each_igemm_kernel). They must run where the build and the device have wgmma.
TEST(ConvCuda, Im2colKernelsMatchCpu) {
  const std::vector<Case> cases = {
      {3, 9, 7, 64, 256, 3, 3, params(1, 1)},       // 189 pixels: a tile spans three images and runs past them
      {2, 20, 19, 128, 200, 3, 3, params(1, 1)},    // Cout 200: a partial 256-wide tile
      {1, 17, 21, 64, 136, 3, 3, params(2, 1)},     // stride 2
      {1, 19, 20, 64, 136, 3, 3, params(1, 6, 6)},  // dilation 6 (DeepLab's ASPP-like)
      {1, 11, 13, 64, 136, 3, 3, params(2, 0)},     // no padding
      {1, 15, 14, 128, 144, 5, 5, params(1, 2)},    // 5x5
      {2, 23, 25, 192, 128, 7, 7, params(2, 3)},    // 7x7 stride 2, three channel blocks per tap
      {4, 48, 60, 128, 264, 3, 3, params(1, 1)},    // wide: 128 x 256 tiles by shape
      // the data gradient's (stride 1, Cout a multiple of 64, Cin > 64): dy's im2col copy with padding span - p
      {3, 9, 7, 136, 128, 3, 3, params(1, 1)},      // Cin past a 128-wide tile; dx tiles across images
      {1, 19, 20, 72, 192, 3, 3, params(1, 6, 6)},  // dilated
      {2, 15, 14, 200, 64, 5, 5, params(1, 2)},     // 5x5, one 64-channel block per tap
      {1, 11, 13, 128, 128, 3, 3, params(1, 0)},    // no padding: dy's box reaches 2 pixels out
      {1, 10, 12, 128, 192, 3, 3, params(1, 2)},    // padding past the filter's reach
      // ... per stride phase (up to four phases per launch, each its own dy map, the most taps first)
      {1, 17, 21, 136, 64, 3, 3, params(2, 1)},     // phases of one and of two taps per dimension
      {2, 23, 25, 72, 128, 7, 7, params(2, 3)},     // 7x7 stride 2
      {1, 20, 19, 136, 128, 4, 4, params(2, 1)},    // an even filter (pix2pixHD's discriminators)
      {2, 13, 11, 72, 64, 3, 3, params(3, 1)},      // stride 3: nine phases of unequal sizes, three launches
      {1, 15, 14, 72, 192, 5, 5, params(2, 2, 3)},  // dilation 3, stride 2
      {1, 16, 15, 72, 64, 3, 3, params(2, 2, 2)},   // phases without taps: the cp.async kernel instead
  };
  const int64_t before = ops::cuda::conv::igemm_im2col_launches();
  for_each_igemm_kernel([&] {
    for (const Case& c : cases) check_case(c, DType::bf16);
    check_case(cases[0], DType::f16);
  });
  if (ops::cuda::conv::igemm_wgmma_available()) {
    EXPECT_GT(ops::cuda::conv::igemm_im2col_launches(), before) << "the im2col kernels never ran";
  }
}

// f64 on the geometries whose paths take it (generic, depthwise, gemm).
TEST(ConvCuda, Float64MatchesCpu) {
  const std::vector<Case> cases = {{2, 7, 9, 16, 24, 1, 1, params(1, 0)},
                                   {2, 9, 8, 5, 6, 3, 3, params(2, 1, 2)},
                                   {1, 9, 10, 12, 6, 3, 3, params(2, 1, 1, 3)},
                                   {1, 13, 14, 7, 7, 3, 3, params(2, 1, 1, 7)}};
  for (const Case& c : cases) check_case(c, DType::f64);
}

// Every path is taken where conv.h says: the sweep above then covers each.
TEST(ConvCuda, PathChoice) {
  auto path = [](const Case& c, DType t) {
    return std::string(ops::cuda::conv2d_path(ConvPass::forward, geometry(c), t));
  };
  EXPECT_EQ(path({2, 7, 9, 16, 24, 1, 1, params(1, 0)}, DType::bf16), "gemm");
  EXPECT_EQ(path({2, 12, 11, 24, 24, 3, 3, params(1, 1, 1, 24)}, DType::bf16), "depthwise");
  EXPECT_EQ(path({2, 13, 11, 16, 24, 3, 3, params(1, 1)}, DType::bf16), "igemm");
  EXPECT_EQ(path({2, 13, 11, 16, 24, 3, 3, params(1, 1)}, DType::f32), "simt");
  EXPECT_EQ(path({2, 13, 11, 6, 24, 3, 3, params(1, 1)}, DType::f32), "simt_cin_padded");
  EXPECT_EQ(path({2, 13, 11, 16, 24, 3, 3, params(1, 1)}, DType::f64), "generic");
  const Case stem{1, 31, 29, 3, 16, 7, 7, params(2, 3)};
  EXPECT_EQ(path(stem, DType::bf16), "igemm_gather");
  EXPECT_EQ(std::string(ops::cuda::conv2d_path(ConvPass::data, geometry(stem), DType::bf16)), "igemm_gather");
  const Case wide_filter{1, 31, 29, 3, 16, 9, 9, params(1, 4)};  // 81 taps: more than the phase table holds
  EXPECT_EQ(std::string(ops::cuda::conv2d_path(ConvPass::data, geometry(wide_filter), DType::bf16)), "generic");
  EXPECT_EQ(std::string(ops::cuda::conv2d_path(ConvPass::forward, geometry(wide_filter), DType::bf16)), "igemm_gather");
  // Cout not a multiple of 8 (one group): padded with zero filters, then the paths above.
  EXPECT_EQ(path({2, 9, 8, 5, 6, 3, 3, params(1, 1)}, DType::bf16), "igemm_gather_cout_padded");
  EXPECT_EQ(path({1, 64, 32, 32, 3, 7, 7, params(1, 3)}, DType::bf16), "igemm_cout_padded");
  EXPECT_EQ(path({1, 64, 32, 32, 3, 7, 7, params(1, 3)}, DType::f32), "simt_cout_padded");
  // Cin padded where the zeros add at most a quarter and the filter is spatial, in f32 always (its SIMT kernels do
  // not gather); f32 pads Cout once Cin is whole.
  EXPECT_EQ(path({1, 64, 32, 30, 3, 7, 7, params(1, 3)}, DType::f32), "simt_cin_cout_padded");
  EXPECT_EQ(path({1, 64, 32, 39, 64, 4, 4, params(2, 1)}, DType::bf16), "igemm_cin_padded");
  EXPECT_EQ(path({1, 64, 32, 39, 64, 4, 4, params(2, 1)}, DType::f32), "simt_cin_padded");
  EXPECT_EQ(path({1, 64, 32, 36, 32, 7, 7, params(1, 3)}, DType::bf16), "igemm_cin_padded");
  EXPECT_EQ(path({1, 64, 32, 36, 32, 7, 7, params(1, 3)}, DType::f32), "simt");          // 36: whole f32 vectors
  EXPECT_EQ(path({1, 64, 32, 6, 24, 3, 3, params(1, 1)}, DType::bf16), "igemm_gather");  // 6 -> 8: a third more
  EXPECT_EQ(path({1, 64, 32, 6, 24, 3, 3, params(1, 1)}, DType::f32), "simt_cin_padded");
  EXPECT_EQ(path(stem, DType::f32), "simt_cin_padded");                                   // 3 -> 4
  EXPECT_EQ(path({1, 64, 32, 39, 64, 1, 1, params(2, 0)}, DType::bf16), "igemm_gather");  // 1x1: not padded
  EXPECT_EQ(path({1, 9, 10, 12, 6, 3, 3, params(2, 1, 1, 3)}, DType::bf16), "generic");   // groups: not padded
  {
    Tf32Scope tf32(true);
    EXPECT_EQ(path({2, 13, 11, 16, 24, 3, 3, params(1, 1)}, DType::f32), "igemm_tf32");
    EXPECT_EQ(path({2, 13, 11, 12, 20, 3, 3, params(1, 1)}, DType::f32), "igemm_tf32");  // multiples of 4
    // f32 pads Cin whether or not TF32 is on (the padding is memory the meta device accounts without knowing).
    EXPECT_EQ(path(stem, DType::f32), "igemm_tf32_cin_padded");
    EXPECT_EQ(std::string(ops::cuda::conv2d_path(ConvPass::data, geometry(stem), DType::f32)), "igemm_tf32_cin_padded");
    EXPECT_EQ(path({2, 13, 11, 6, 24, 3, 3, params(1, 1)}, DType::f32), "igemm_tf32_cin_padded");
    EXPECT_EQ(path({2, 13, 11, 16, 6, 3, 3, params(1, 1)}, DType::f32), "igemm_tf32_cout_padded");
    EXPECT_EQ(path({2, 12, 11, 24, 24, 3, 3, params(1, 1, 1, 24)}, DType::f32), "depthwise");  // CUDA cores
    EXPECT_EQ(path({2, 7, 9, 16, 24, 1, 1, params(1, 0)}, DType::f32), "gemm");                // cuBLASLt FAST_TF32
    EXPECT_EQ(path({2, 13, 11, 16, 24, 3, 3, params(1, 1)}, DType::bf16), "igemm");
  }
  EXPECT_EQ(path({2, 13, 11, 16, 24, 3, 3, params(1, 1)}, DType::f32), "simt");  // TF32 off again
}

// The split-K weight gradient is deterministic: the same bits twice.
TEST(ConvCuda, WeightGradientIsDeterministic) {
  for (const Case& c : {Case{2, 40, 37, 32, 48, 3, 3, params(1, 1)}, Case{4, 32, 33, 8, 8, 3, 3, params(1, 1, 1, 8)}}) {
    const ops::ConvGeometry g = geometry(c);
    const auto dev = testutil::cuda_device();
    const int64_t splits = ops::conv2d_weight_grad_splits(g);
    ASSERT_GT(splits, 1) << describe(g);
    Tensor x = ops::to_device(random({g.n, g.h, g.w, g.cin}, DType::bf16), dev);
    Tensor dy = ops::to_device(random({g.n, g.ho, g.wo, g.cout}, DType::bf16), dev);
    Tensor ws = poisoned({splits, g.cout, g.kh, g.kw, g.cin_per_group()}, DType::f32);
    Tensor a = poisoned({g.cout, g.kh, g.kw, g.cin_per_group()}, DType::bf16), b = poisoned(a.shape(), DType::bf16);
    ops::cuda::conv2d_backward_weight(x, dy, a, ws, g);
    ops::cuda::conv2d_backward_weight(x, dy, b, ws, g);
    testutil::expect_equal("conv2d_backward_weight twice " + describe(g), a, b);
  }
}
