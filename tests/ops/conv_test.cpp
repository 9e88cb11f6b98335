// conv_test.cpp: conv2d against a naive 7-loop NHWC convolution written here (a sweep of kernel sizes,
// strides, dilations, paddings, groups and bias), conv_transpose2d against PyTorch's definition (a case by hand
// and naive scatter loops), gradients and second derivatives against finite differences in f64, the meta
// device's ledger equal to the cpu's (workspace included), and shape errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/counters.h"
#include "engine/device.h"
#include "graph/autograd.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using ops::Conv2dParams;
using ops::ConvPass;
using testutil::rand_input;

namespace {

// y[n, oh, ow, co] = bias[co] + sum over (kh, kw, c) of x[n, ih, iw, gi*Cin/g + c] * w[co, kh, kw, c],
// ih = oh*stride - pad + kh*dilation, gi = co / (Cout/g); taps outside the image count as zeros.
std::vector<double> naive_conv2d(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w,
                                 const Shape& ws, const std::vector<double>& bias, const Conv2dParams& p,
                                 int64_t Ho, int64_t Wo) {
  const int64_t N = xs[0], H = xs[1], W = xs[2], Cin = xs[3], Cout = ws[0], KH = ws[1], KW = ws[2], Cpg = ws[3];
  const int64_t cout_pg = Cout / p.groups;
  std::vector<double> y(size_t(N * Ho * Wo * Cout), 0.0);
  for (int64_t n = 0; n < N; n++)
    for (int64_t oh = 0; oh < Ho; oh++)
      for (int64_t ow = 0; ow < Wo; ow++)
        for (int64_t co = 0; co < Cout; co++) {
          double acc = bias.empty() ? 0.0 : bias[size_t(co)];
          const int64_t gi = co / cout_pg;
          for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++)
              for (int64_t c = 0; c < Cpg; c++) {
                const int64_t ih = oh * p.stride_h - p.pad_h + kh * p.dilation_h;
                const int64_t iw = ow * p.stride_w - p.pad_w + kw * p.dilation_w;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += x[size_t(((n * H + ih) * W + iw) * Cin + gi * Cpg + c)] *
                       w[size_t(((co * KH + kh) * KW + kw) * Cpg + c)];
              }
          y[size_t(((n * Ho + oh) * Wo + ow) * Cout + co)] = acc;
        }
  return y;
}

// PyTorch's ConvTranspose2d by scattering: every input element x[n, ih, iw, ci] adds x * w[ci, kh, kw, co]
// into y[n, ih*stride - pad + kh*dilation, iw*stride - pad + kw*dilation, gi*Cout/g + co] (gi = ci's group).
std::vector<double> naive_conv_transpose2d(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w,
                                           const Shape& ws, const std::vector<double>& bias, const Conv2dParams& p,
                                           int64_t Ho, int64_t Wo) {
  const int64_t N = xs[0], H = xs[1], W = xs[2], Cin = xs[3], KH = ws[1], KW = ws[2], cout_pg = ws[3];
  const int64_t Cout = cout_pg * p.groups, cin_pg = Cin / p.groups;
  std::vector<double> y(size_t(N * Ho * Wo * Cout), 0.0);
  for (int64_t n = 0; n < N; n++)
    for (int64_t oh = 0; oh < Ho; oh++)
      for (int64_t ow = 0; ow < Wo; ow++)
        for (int64_t co = 0; co < Cout; co++)
          y[size_t(((n * Ho + oh) * Wo + ow) * Cout + co)] = bias.empty() ? 0 : bias[size_t(co)];
  for (int64_t n = 0; n < N; n++)
    for (int64_t ih = 0; ih < H; ih++)
      for (int64_t iw = 0; iw < W; iw++)
        for (int64_t ci = 0; ci < Cin; ci++)
          for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++)
              for (int64_t co = 0; co < cout_pg; co++) {
                const int64_t oh = ih * p.stride_h - p.pad_h + kh * p.dilation_h;
                const int64_t ow = iw * p.stride_w - p.pad_w + kw * p.dilation_w;
                if (oh < 0 || oh >= Ho || ow < 0 || ow >= Wo) continue;
                const int64_t oc = (ci / cin_pg) * cout_pg + co;
                y[size_t(((n * Ho + oh) * Wo + ow) * Cout + oc)] +=
                    x[size_t(((n * H + ih) * W + iw) * Cin + ci)] *
                    w[size_t(((ci * KH + kh) * KW + kw) * cout_pg + co)];
              }
  return y;
}

Conv2dParams params(int64_t stride, int64_t pad, int64_t dilation, int64_t groups) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.dilation_h = p.dilation_w = dilation;
  p.groups = groups;
  return p;
}

void expect_values_near(const std::vector<double>& got, const std::vector<double>& want, double tol,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); i++)
    if (std::abs(got[i] - want[i]) > tol * (1 + std::abs(want[i]))) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
      return;
    }
}

std::string expect_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const engine::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an engine::Error";
  return "";
}

}  // namespace

TEST(Conv, Conv2dMatchesNaiveLoopsOverSweep) {
  int cases = 0;
  for (int64_t k : {1, 3, 5, 7})
    for (int64_t stride : {1, 2})
      for (int64_t dilation : {1, 2, 3})
        for (int64_t pad : {0, 1, 2, 3})
          for (int groups_kind = 0; groups_kind < 3; groups_kind++) {  // 1, 2, depthwise (multiplier 2)
            const int64_t cin = 4, groups = groups_kind == 0 ? 1 : groups_kind == 1 ? 2 : cin;
            const int64_t cout = groups_kind == 2 ? 8 : 6;
            const bool with_bias = (cases % 2) == 0;
            // Odd, non-square images a little larger than the dilated kernel.
            const int64_t H = dilation * (k - 1) + 5, W = dilation * (k - 1) + 4;
            const Shape xs{2, H, W, cin}, ws{cout, k, k, cin / groups};
            Tensor x = rand_input(xs, -1, 1, false), w = rand_input(ws, -1, 1, false);
            Tensor b = with_bias ? rand_input({cout}, -1, 1, false) : Tensor();
            Conv2dParams p = params(stride, pad, dilation, groups);
            Tensor y = ops::conv2d(x, w, b, p);
            const int64_t Ho = (H + 2 * pad - dilation * (k - 1) - 1) / stride + 1;
            const int64_t Wo = (W + 2 * pad - dilation * (k - 1) - 1) / stride + 1;
            ASSERT_EQ(y.shape(), (Shape{2, Ho, Wo, cout}));
            std::string what = "k " + std::to_string(k) + " stride " + std::to_string(stride) + " dilation " +
                               std::to_string(dilation) + " pad " + std::to_string(pad) + " groups " +
                               std::to_string(groups) + (with_bias ? " bias" : "");
            expect_values_near(y.to_double(),
                               naive_conv2d(x.to_double(), xs, w.to_double(), ws,
                                            with_bias ? b.to_double() : std::vector<double>{}, p, Ho, Wo),
                               1e-12, what);
            cases++;
          }
  EXPECT_EQ(cases, 4 * 2 * 3 * 4 * 3);
}

TEST(Conv, Conv2dAsymmetricParamsAndLowPrecision) {
  // Different stride / padding / dilation along H and W, in f32 and bf16 (through the float path).
  Conv2dParams p;
  p.stride_h = 2, p.stride_w = 1, p.pad_h = 1, p.pad_w = 2, p.dilation_h = 1, p.dilation_w = 2;
  const Shape xs{3, 9, 7, 3}, ws{5, 3, 2, 3};
  Tensor x = rand_input(xs, -1, 1, false), w = rand_input(ws, -1, 1, false), b = rand_input({5}, -1, 1, false);
  const int64_t Ho = (9 + 2 - 2 - 1) / 2 + 1, Wo = (7 + 4 - 2 - 1) / 1 + 1;
  std::vector<double> want = naive_conv2d(x.to_double(), xs, w.to_double(), ws, b.to_double(), p, Ho, Wo);
  expect_values_near(ops::conv2d(x, w, b, p).to_double(), want, 1e-12, "f64");
  Tensor y32 = ops::conv2d(ops::to(x, DType::f32), ops::to(w, DType::f32), ops::to(b, DType::f32), p);
  EXPECT_EQ(y32.dtype(), DType::f32);
  expect_values_near(y32.to_double(), want, 1e-5, "f32");
  Tensor y16 = ops::conv2d(ops::to(x, DType::bf16), ops::to(w, DType::bf16), ops::to(b, DType::bf16), p);
  expect_values_near(y16.to_double(), want, 6e-2, "bf16");
}

TEST(Conv, ConvTranspose2dByHand) {
  // x = [[1, 2], [3, 4]], w = [[1, 0], [0, 1]] (1 channel): y[i + kh, j + kw] += x[i, j] * w[kh, kw].
  Tensor x = ops::from_vector(std::vector<double>{1, 2, 3, 4}, {1, 2, 2, 1}, DType::f64);
  Tensor w = ops::from_vector(std::vector<double>{1, 0, 0, 1}, {1, 2, 2, 1}, DType::f64);
  Tensor y = ops::conv_transpose2d(x, w, Tensor());
  EXPECT_EQ(y.shape(), (Shape{1, 3, 3, 1}));
  EXPECT_EQ(y.to_double(), (std::vector<double>{1, 2, 0, 3, 5, 2, 0, 3, 4}));
  // Stride 2 with a 2x2 kernel of ones spreads each input over its own 2x2 block; bias 10.
  Tensor ones = ops::ones({1, 2, 2, 1}, DType::f64);
  Tensor y2 = ops::conv_transpose2d(x, ones, ops::full({1}, 10, DType::f64), params(2, 0, 1, 1));
  EXPECT_EQ(y2.to_double(), (std::vector<double>{11, 11, 12, 12, 11, 11, 12, 12, 13, 13, 14, 14, 13, 13, 14, 14}));
  // output_padding 1 adds a last row and column that only the bias reaches.
  Tensor y3 = ops::conv_transpose2d(x, ones, Tensor(), params(2, 0, 1, 1), 1, 1);
  EXPECT_EQ(y3.shape(), (Shape{1, 5, 5, 1}));
  EXPECT_EQ(y3.to_double()[24], 0.0);
}

TEST(Conv, ConvTranspose2dMatchesNaiveScatter) {
  for (int64_t stride : {1, 2, 3})
    for (int64_t pad : {0, 1})
      for (int64_t dilation : {1, 2})
        for (int64_t out_pad : {0, 1})
          for (int64_t groups : {1, 2}) {
            if (out_pad >= stride && out_pad >= dilation) continue;
            const int64_t k = 3, H = 4, W = 5, cin = 4, cout_pg = 3;
            const Shape xs{2, H, W, cin}, ws{cin, k, k, cout_pg};
            Tensor x = rand_input(xs, -1, 1, false), w = rand_input(ws, -1, 1, false);
            Tensor b = rand_input({cout_pg * groups}, -1, 1, false);
            Conv2dParams p = params(stride, pad, dilation, groups);
            Tensor y = ops::conv_transpose2d(x, w, b, p, out_pad, out_pad);
            const int64_t Ho = (H - 1) * stride - 2 * pad + dilation * (k - 1) + out_pad + 1;
            const int64_t Wo = (W - 1) * stride - 2 * pad + dilation * (k - 1) + out_pad + 1;
            ASSERT_EQ(y.shape(), (Shape{2, Ho, Wo, cout_pg * groups}));
            expect_values_near(y.to_double(), naive_conv_transpose2d(x.to_double(), xs, w.to_double(), ws,
                                                                     b.to_double(), p, Ho, Wo),
                               1e-12, "stride " + std::to_string(stride) + " pad " + std::to_string(pad) +
                                          " dilation " + std::to_string(dilation) + " output_padding " +
                                          std::to_string(out_pad) + " groups " + std::to_string(groups));
          }
}

TEST(Conv, Conv2dGradcheckAndDoubleBackward) {
  struct Case { Shape xs, ws; Conv2dParams p; };
  std::vector<Case> cases = {
      {{2, 5, 4, 2}, {3, 3, 3, 2}, params(1, 1, 1, 1)},
      {{1, 7, 6, 4}, {4, 3, 2, 2}, params(2, 1, 2, 2)},   // stride 2, dilation 2, groups 2, non-square kernel
      {{1, 5, 5, 3}, {6, 3, 3, 1}, params(1, 2, 1, 3)},   // depthwise, multiplier 2
      {{2, 3, 4, 3}, {2, 1, 1, 3}, params(1, 0, 1, 1)},   // 1x1
  };
  for (const Case& c : cases) {
    Tensor x = rand_input(c.xs), w = rand_input(c.ws), b = rand_input({c.ws[0]});
    Conv2dParams p = c.p;
    auto f = [p](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1], in[2], p); };
    testutil::expect_gradcheck(f, {x, w, b});
    testutil::expect_double_backward(f, {x, w, b});
  }
}

TEST(Conv, ConvTranspose2dGradcheckAndDoubleBackward) {
  Tensor x = rand_input({1, 3, 4, 4}), w = rand_input({4, 3, 3, 2}), b = rand_input({4});
  Conv2dParams p = params(2, 1, 1, 2);
  auto f = [p](const std::vector<Tensor>& in) { return ops::conv_transpose2d(in[0], in[1], in[2], p, 1, 0); };
  testutil::expect_gradcheck(f, {x, w, b});
  testutil::expect_double_backward(f, {x, w, b});
}

TEST(Conv, BackwardKernelsGradcheck) {
  // The two backward kernels as ops of their own (their rules are what the third derivative runs).
  ops::ConvGeometry g = ops::conv2d_geometry("test", {1, 5, 4, 2}, {4, 3, 3, 1}, params(2, 1, 1, 2));
  Tensor dy = rand_input({g.n, g.ho, g.wo, g.cout}), w = rand_input({4, 3, 3, 1}), x = rand_input({1, 5, 4, 2});
  auto data = [g](const std::vector<Tensor>& in) { return ops::conv2d_backward_data(in[0], in[1], g); };
  auto weight = [g](const std::vector<Tensor>& in) { return ops::conv2d_backward_weight(in[0], in[1], g); };
  testutil::expect_gradcheck(data, {dy, w});
  testutil::expect_gradcheck(weight, {x, dy});
  testutil::expect_double_backward(data, {dy, w});
  testutil::expect_double_backward(weight, {x, dy});
}

TEST(Conv, WeightGradientPiecesFillWholeWavesOf132) {
  // conv_params.h's rule: at most 264 tiles of 128 x 128 in the workspace, each piece >= 1024 pixels, and the most
  // pieces within 5% of the least time in waves of 132 blocks. By hand: Darknet's 128 -> 256 3x3 at 152^2 x 8 has
  // 2 x 9 tiles; 14 pieces make 252 blocks, two waves (15, the old rule's, made 270: a third wave of 6 blocks).
  auto splits = [](int64_t n, int64_t h, int64_t cin, int64_t cout, int64_t k, int64_t stride) {
    const Conv2dParams p = params(stride, k / 2, 1, 1);
    return ops::conv2d_weight_grad_splits(ops::conv2d_geometry("test", {n, h, h, cin}, {cout, k, k, cin}, p));
  };
  EXPECT_EQ(splits(8, 152, 128, 256, 3, 1), 14);
  EXPECT_EQ(splits(8, 152, 256, 512, 3, 2), 3) << "4 x 18 tiles: 3 pieces, 216 blocks in two waves (4: 288, three)";
  EXPECT_EQ(splits(8, 76, 128, 256, 3, 2), 7) << "38^2 x 8 pixels allow 11 pieces; 7 make one wave of 126 blocks";
  EXPECT_EQ(splits(8, 416, 8, 32, 3, 1), 256) << "one tile (a stem): the most pieces, 256, two waves less 8 blocks";
  EXPECT_EQ(splits(8, 32, 1024, 256, 1, 1), 1) << "1x1: one cuBLASLt GEMM, no workspace";
  EXPECT_EQ(splits(8, 19, 512, 1024, 3, 1), 1) << "8 x 36 tiles fill two waves and more alone";
  EXPECT_EQ(splits(1, 16, 128, 128, 3, 1), 1) << "256 pixels: no piece of 1024";
}

namespace {
ops::ConvGeometry geometry_of_64() {
  return ops::conv2d_geometry("test", {2, 32, 32, 64}, {64, 3, 3, 64}, params(1, 1, 1, 1));
}
}  // namespace

TEST(Conv, WinogradPlanCoversTheOutputInChunksUnderItsBudget) {
  unsetenv("ENGINE_CONV_WINOGRAD");  // on by default
  // conv_params.h's conv2d_winograd, checked by hand. Darknet's 128 -> 256 3x3 at 152^2 x 8: 76^2 = 5776 tiles per
  // image, 16 * 5776 * 384 * 4 bytes = 142 MB per image with the 2 MB of filters: one image under 256 MiB.
  auto geometry = [](int64_t n, int64_t h, int64_t cin, int64_t cout, int64_t pad, int64_t dil) {
    return ops::conv2d_geometry("test", {n, h, h, cin}, {cout, 3, 3, cin}, params(1, pad, dil, 1));
  };
  const ops::ConvGeometry dk = geometry(8, 152, 128, 256, 1, 1);
  const ops::WinogradPlan darknet = ops::conv2d_winograd(dk, ConvPass::forward, 4, false);
  EXPECT_EQ(darknet.tiles, 76 * 76);
  EXPECT_EQ(darknet.chunk, 76 * 76) << "one image a chunk";
  EXPECT_EQ(darknet.splits, 1) << "the forward's GEMMs are not cut";
  EXPECT_EQ(darknet.elems, 16 * 128 * 256 + 16 * 5776 * 384);
  // Its weight gradient: 16 GEMMs of one 128 x 256 output (2 tiles of 128 x 128: 32 blocks) want 9 pieces for two
  // waves of 132 SMs, but a piece takes >= 1024 of the image's 5776 tiles: 5 pieces, 5780 rows (4 of zeros).
  const ops::WinogradPlan darknet_w = ops::conv2d_winograd(dk, ConvPass::weight, 4, false);
  EXPECT_EQ(darknet_w.chunk, 5776);
  EXPECT_EQ(darknet_w.splits, 5);
  EXPECT_EQ(darknet_w.elems, 16 * 5 * 128 * 256 + 16 * 5780 * 384);
  // Odd sizes round the tiles up; dilation 2 tiles each of the two interleaved grids: 33 -> 17 per grid, 9 pairs.
  EXPECT_EQ(ops::conv2d_winograd(geometry(2, 19, 64, 64, 1, 1), ConvPass::forward, 4, false).tiles, 10 * 10);
  EXPECT_EQ(ops::winograd_tiles(33, 2), 2 * 9);
  EXPECT_EQ(ops::winograd_tiles(5, 2), 2 * 2) << "grids of 3 and 2 outputs: 2 and 1 pairs, 2 per grid";
  // The data gradient tiles dx's grid (padding 0: Ho = 17, H = 19).
  EXPECT_EQ(ops::conv2d_winograd(geometry(1, 19, 64, 64, 0, 1), ConvPass::data, 4, false).tiles, 10 * 10);
  EXPECT_EQ(ops::conv2d_winograd(geometry(1, 19, 64, 64, 0, 1), ConvPass::forward, 4, false).tiles, 9 * 9);
  // deeplabv3's 64-channel 3x3 at 129^2 x 8: 65^2 tiles, 34.6 MB per image: the 8 images in two chunks of 4 (not
  // 7 and 1). Its weight gradient's 16 GEMMs of one 64 x 64 output want 17 pieces (17 x 16 = 272 blocks), planned
  // with the whole batch's 33800 tiles; a chunk's 16900 tiles allow 16 of >= 1024: rows 16912 (12 of zeros).
  const ops::WinogradPlan layer1 = ops::conv2d_winograd(geometry(8, 129, 64, 64, 1, 1), ConvPass::weight, 4, false);
  EXPECT_EQ(layer1.chunk, 4 * 65 * 65);
  EXPECT_EQ(layer1.splits, 16);
  EXPECT_EQ(ops::winograd_rows(4 * 65 * 65, 16), 16912);
  EXPECT_EQ(layer1.elems, 16 * 16 * 64 * 64 + 16 * 16912 * 128);
  EXPECT_LE(layer1.elems * 4, ops::kWinogradBytes);
  EXPECT_EQ(ops::conv2d_winograd(geometry(8, 129, 64, 64, 1, 1), ConvPass::forward, 4, false).splits, 1);
  // The budget holds for every pass of every plan, and the chunks cover the batch's tiles: 64 -> 64 at 360^2 has 180^2
  // tiles, 16 * 32400 * 128 * 4 bytes = 253 MiB with the filters' 256 KiB: one image a chunk. At 362^2 (181^2 =
  // 32761 tiles) one image alone is over 256 MiB: room for (2^26 - 16 * 64 * 64) / (16 * 128) = 32736 tiles, so two
  // parts of 16381; pix2pixHD's (and its VGG loss's) 64-channel layer at 2048 x 1024 has 2^19 tiles (4 GiB): 17 parts
  // of 30841 (its weight gradient's 17 pieces leave room for 32208 tiles: 17 parts too, 1815 rows a piece).
  for (int64_t h : {8, 33, 129, 152, 360, 362, 1024})
    for (int64_t c : {64, 128, 256, 512})
      for (ConvPass pass : {ConvPass::forward, ConvPass::data, ConvPass::weight}) {
        const ops::WinogradPlan plan = ops::conv2d_winograd(geometry(3, h, c, c, 1, 1), pass, 4, false);
        EXPECT_LE(plan.elems * 4, ops::kWinogradBytes) << h << "^2, " << c << " channels";
        EXPECT_GE(plan.chunk, std::min<int64_t>(3 * plan.tiles, ops::kWinogradLeastTiles)) << h << "^2, " << c;
        EXPECT_EQ(plan.chunk > 0, plan.elems > 0) << h << "^2, " << c << " channels";
      }
  EXPECT_EQ(ops::conv2d_winograd(geometry(1, 360, 64, 64, 1, 1), ConvPass::forward, 4, false).chunk, 180 * 180);
  EXPECT_EQ(ops::conv2d_winograd(geometry(1, 362, 64, 64, 1, 1), ConvPass::forward, 4, false).chunk, 16381);
  const ops::ConvGeometry hd = ops::conv2d_geometry("test", {1, 1024, 2048, 64}, {64, 3, 3, 64}, params(1, 1, 1, 1));
  for (ConvPass pass : {ConvPass::forward, ConvPass::data}) {
    const ops::WinogradPlan plan = ops::conv2d_winograd(hd, pass, 4, false);
    EXPECT_EQ(plan.tiles, 512 * 1024);
    EXPECT_EQ(plan.chunk, 30841);
    EXPECT_EQ(plan.elems, 16 * 64 * 64 + 16 * 128 * 30841);
  }
  const ops::WinogradPlan hd_w = ops::conv2d_winograd(hd, ConvPass::weight, 4, false);
  EXPECT_EQ(hd_w.splits, 17);
  EXPECT_EQ(hd_w.chunk, 30841);
  EXPECT_EQ(hd_w.elems, 16 * 17 * 64 * 64 + 16 * 128 * 1815 * 17);
  EXPECT_LE(hd_w.elems * 4, ops::kWinogradBytes);
  // Filters that nearly fill the budget: 2048 -> 2048's are 256 MiB alone: the direct kernels.
  EXPECT_EQ(ops::conv2d_winograd(geometry(1, 64, 2048, 2048, 1, 1), ConvPass::forward, 4, false).chunk, 0);
  // Not: TF32, 16-bit types, fewer than 64 channels, stride 2, a 5x5 filter, groups, padding past 2 d.
  const ops::ConvGeometry g = geometry_of_64();
  EXPECT_GT(ops::conv2d_winograd(g, ConvPass::forward, 4, false).chunk, 0);
  EXPECT_EQ(ops::conv2d_winograd(g, ConvPass::forward, 4, true).chunk, 0);
  EXPECT_EQ(ops::conv2d_winograd(g, ConvPass::forward, 2, false).chunk, 0);
  EXPECT_EQ(ops::conv2d_winograd(geometry(2, 32, 32, 64, 1, 1), ConvPass::forward, 4, false).chunk, 0);
  EXPECT_EQ(ops::conv2d_winograd(geometry(2, 32, 64, 64, 3, 1), ConvPass::forward, 4, false).chunk, 0);
  const ops::ConvGeometry s2 = ops::conv2d_geometry("test", {2, 32, 32, 64}, {64, 3, 3, 64}, params(2, 1, 1, 1));
  const ops::ConvGeometry k5 = ops::conv2d_geometry("test", {2, 32, 32, 64}, {64, 5, 5, 64}, params(1, 2, 1, 1));
  const ops::ConvGeometry g2 = ops::conv2d_geometry("test", {2, 32, 32, 128}, {128, 3, 3, 64}, params(1, 1, 1, 2));
  for (const ops::ConvGeometry& other : {s2, k5, g2})
    EXPECT_EQ(ops::conv2d_winograd(other, ConvPass::weight, 4, false).chunk, 0);
  // ENGINE_CONV_WINOGRAD=0 turns it off; another value is an error naming the variable.
  setenv("ENGINE_CONV_WINOGRAD", "0", 1);
  EXPECT_EQ(ops::conv2d_winograd(g, ConvPass::forward, 4, false).chunk, 0);
  setenv("ENGINE_CONV_WINOGRAD", "yes", 1);
  const std::string m = expect_error([&] { ops::conv2d_winograd(g, ConvPass::forward, 4, false); });
  EXPECT_NE(m.find("ENGINE_CONV_WINOGRAD"), std::string::npos) << m;
  unsetenv("ENGINE_CONV_WINOGRAD");
}

TEST(Conv, MetaLedgerEqualsCpu) {
  // 2 * 32 * 32 output pixels: the weight gradient's split workspace (conv_params.h) is allocated too.
  ops::ConvGeometry big = ops::conv2d_geometry("test", {2, 32, 32, 4}, {8, 3, 3, 4}, params(1, 1, 1, 1));
  ASSERT_GT(ops::conv2d_weight_grad_splits(big), 1);
  auto program = [] {
    Tensor x = ops::rand({2, 32, 32, 4}).set_requires_grad(true);
    Tensor w = ops::rand({8, 3, 3, 4}).set_requires_grad(true);
    Tensor b = ops::rand({8}).set_requires_grad(true);
    Tensor wt = ops::rand({8, 2, 2, 3}).set_requires_grad(true);
    Tensor y = ops::relu(ops::conv2d(x, w, b, params(1, 1, 1, 1)));      // [2, 32, 32, 8]
    Tensor z = ops::conv_transpose2d(y, wt, Tensor(), params(2, 0, 1, 1));  // [2, 64, 64, 3]
    Tensor w3 = ops::rand({3, 3, 3, 8}).set_requires_grad(true);
    Tensor u = ops::conv2d(y, w3, Tensor(), params(1, 1, 1, 1));  // [2, 32, 32, 3]: Cout padded to 4 for the GPU
    Tensor x30 = ops::rand({2, 16, 16, 30}).set_requires_grad(true);
    Tensor w30 = ops::rand({8, 3, 3, 30}).set_requires_grad(true);
    Tensor v = ops::conv2d(x30, w30, Tensor(), params(1, 1, 1, 1));  // Cin padded to 32 for the GPU
    Tensor x64 = ops::rand({1, 6, 6, 64}).set_requires_grad(true);
    Tensor w64 = ops::rand({64, 3, 3, 64}).set_requires_grad(true);
    Tensor q = ops::conv2d(x64, w64, Tensor(), params(1, 1, 1, 1));  // Winograd's workspace on the GPU
    graph::backward(ops::add(ops::add(ops::add(ops::sum(ops::mul(z, z)), ops::sum(u)), ops::sum(v)), ops::sum(q)));
  };
  testutil::expect_meta_allocates_like_cpu(program);
  std::string csv[2];
  int k = 0;
  for (auto type : {engine::DeviceType::cpu, engine::DeviceType::meta}) {
    auto device = engine::Device::create(type, size_t(1) << 30);
    {
      engine::DeviceGuard guard(device);
      program();
    }
    csv[k++] = device->ledger().events_csv();
  }
  EXPECT_EQ(csv[0], csv[1]);
  // The workspace block: f32 [2 splits, 8, 3, 3, 4] = 2304 bytes requested.
  EXPECT_NE(csv[0].find(",2304,"), std::string::npos) << csv[0];
  // The GPU's padding of the 3-channel convolution to 4 (conv_params.h's conv2d_padded), f32: the weight
  // [4, 3, 3, 8] and bias [4], then y / dy [2, 32, 32, 4]: (4 * 73 + 2048 * 4) * 4 = 33936 bytes, in each pass.
  size_t at = 0;
  int blocks = 0;
  while ((at = csv[0].find(",33936,", at)) != std::string::npos) blocks++, at++;
  EXPECT_GE(blocks, 3) << "forward, data and weight gradient: " << csv[0];
  // Cin 30 padded to 32: the weight [8, 3, 3, 32] and bias [8], then x / dx [2, 16, 16, 32]:
  // (8 * 289 + 512 * 32) * 4 = 74784 bytes, in each pass.
  at = 0, blocks = 0;
  while ((at = csv[0].find(",74784,", at)) != std::string::npos) blocks++, at++;
  EXPECT_GE(blocks, 3) << "forward, data and weight gradient: " << csv[0];
  // Winograd's workspace for the 64-channel 3x3 (f32, TF32 off): 16 * 64 * 64 filters and 9 tiles of 128 channels,
  // (65536 + 16 * 9 * 128) * 4 = 335872 bytes, in each pass (9 tiles: the weight gradient's GEMMs are not cut).
  at = 0, blocks = 0;
  while ((at = csv[0].find(",335872,", at)) != std::string::npos) blocks++, at++;
  EXPECT_GE(blocks, 3) << "forward, data and weight gradient: " << csv[0];
}

TEST(Conv, ShapeErrorsNameTheSizes) {
  Tensor x = ops::zeros({2, 8, 8, 4}), w = ops::zeros({6, 3, 3, 4});
  std::string m = expect_error([&] { ops::conv2d(ops::zeros({8, 8, 4}), w); });
  EXPECT_NE(m.find("4-D"), std::string::npos) << m;
  m = expect_error([&] { ops::conv2d(x, ops::zeros({6, 3, 3, 3})); });  // channels mismatch
  EXPECT_NE(m.find("[6, 3, 3, 3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 8, 8, 4]"), std::string::npos) << m;
  m = expect_error([&] { ops::conv2d(x, ops::zeros({6, 3, 3, 1}), Tensor(), params(1, 0, 1, 3)); });
  EXPECT_NE(m.find("groups 3 must divide"), std::string::npos) << m;
  m = expect_error([&] { ops::conv2d(x, ops::zeros({6, 3, 3, 3}), Tensor(), params(1, 0, 1, 2)); });
  EXPECT_NE(m.find("per group"), std::string::npos) << m;
  m = expect_error([&] { ops::conv2d(x, ops::zeros({6, 5, 5, 4}), Tensor(), params(1, 0, 2, 1)); });
  EXPECT_NE(m.find("input height 8"), std::string::npos) << m;
  EXPECT_NE(m.find("extent 9"), std::string::npos) << m;
  m = expect_error([&] { ops::conv2d(x, w, ops::zeros({5})); });
  EXPECT_NE(m.find("bias must be [6]"), std::string::npos) << m;
  m = expect_error([&] { ops::conv2d(x, w, Tensor(), params(0, 0, 1, 1)); });
  EXPECT_NE(m.find("stride"), std::string::npos) << m;
  m = expect_error([&] { ops::conv2d(x, ops::zeros({6, 3, 3, 4}, DType::f64)); });
  EXPECT_NE(m.find("conv2d"), std::string::npos) << m;
  m = expect_error([&] { ops::conv_transpose2d(x, ops::zeros({3, 3, 3, 2}), Tensor()); });
  EXPECT_NE(m.find("[Cin, KH, KW, Cout/groups]"), std::string::npos) << m;
  m = expect_error([&] { ops::conv_transpose2d(x, w, Tensor(), params(2, 0, 1, 1), 2, 0); });
  EXPECT_NE(m.find("output_padding 2"), std::string::npos) << m;
}

TEST(Conv, FlopsAreTwicePixelsTimesOutputChannelsTimesTaps) {
  // 2 * N*Ho*Wo * Cout * KH*KW*Cin/g for the forward and for each backward kernel (on meta: counts only).
  auto meta = engine::Device::create(engine::DeviceType::meta, size_t(1) << 30);
  engine::DeviceGuard guard(meta);
  Tensor x = ops::zeros({2, 9, 8, 6}).set_requires_grad(true);
  Tensor w = ops::zeros({4, 3, 3, 3}).set_requires_grad(true);  // groups 2
  engine::counters().reset();
  Tensor y = ops::conv2d(x, w, Tensor(), params(2, 1, 1, 2));   // [2, 5, 4, 4]
  const double flops = 2.0 * (2 * 5 * 4) * 4 * (3 * 3 * 3);
  EXPECT_DOUBLE_EQ(engine::counters().by_op["conv2d"].flops, flops);
  graph::backward(ops::sum(y));
  EXPECT_DOUBLE_EQ(engine::counters().flops - engine::counters().by_op["sum"].flops -
                       engine::counters().by_op["conv2d"].flops, 2 * flops);
}
