// resample_test.cpp: nearest and bilinear upsampling and 2-D padding against naive loops written here from
// PyTorch's formulas, hand-computed PyTorch outputs (bilinear 2x2 -> 4x4 both ways, ReflectionPad2d), gradients
// and second derivatives against finite differences (of the ops and of their backward ops), errors, meta.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/resample.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::rand_input;

namespace {

// One axis of PyTorch's bilinear map in double: (i0, i1, w0, w1) of output o.
struct Tap {
  int64_t i0, i1;
  double w0, w1;
};
Tap bilinear_tap(int64_t o, int64_t in, int64_t out, bool align_corners, double scale) {
  if (in == out) return {o, o, 1, 0};
  double src;
  if (align_corners) {
    src = out > 1 ? double(in - 1) / double(out - 1) * double(o) : 0.0;
  } else {
    double s = scale > 0 ? 1 / scale : double(in) / double(out);
    src = std::max(0.0, s * (o + 0.5) - 0.5);
  }
  int64_t i0 = std::min<int64_t>(int64_t(std::floor(src)), in - 1);
  double w1 = std::min(1.0, std::max(0.0, src - double(i0)));
  return {i0, std::min(i0 + 1, in - 1), 1 - w1, w1};
}
int64_t nearest_src(int64_t o, int64_t in, int64_t out, double scale) {
  float s = scale > 0 ? float(1 / scale) : float(in) / float(out);
  return std::min<int64_t>(int64_t(std::floor(float(o) * s)), in - 1);
}

std::vector<double> naive_upsample(const std::vector<double>& x, const Shape& xs, int64_t Ho, int64_t Wo, bool bilinear,
                                   bool align_corners, double sh = 0, double sw = 0) {
  const int64_t N = xs[0], H = xs[1], W = xs[2], C = xs[3];
  std::vector<double> y;
  auto at = [&](int64_t n, int64_t h, int64_t w, int64_t c) { return x[((n * H + h) * W + w) * C + c]; };
  for (int64_t n = 0; n < N; n++)
    for (int64_t oh = 0; oh < Ho; oh++)
      for (int64_t ow = 0; ow < Wo; ow++)
        for (int64_t c = 0; c < C; c++) {
          if (!bilinear) {
            y.push_back(at(n, nearest_src(oh, H, Ho, sh), nearest_src(ow, W, Wo, sw), c));
            continue;
          }
          Tap th = bilinear_tap(oh, H, Ho, align_corners, sh), tw = bilinear_tap(ow, W, Wo, align_corners, sw);
          y.push_back(th.w0 * (tw.w0 * at(n, th.i0, tw.i0, c) + tw.w1 * at(n, th.i0, tw.i1, c)) +
                      th.w1 * (tw.w0 * at(n, th.i1, tw.i0, c) + tw.w1 * at(n, th.i1, tw.i1, c)));
        }
  return y;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

ops::Pad2dParams pads(int64_t l, int64_t r, int64_t t, int64_t b, ops::PadMode mode, double value = 0) {
  ops::Pad2dParams p;
  p.left = l, p.right = r, p.top = t, p.bottom = b, p.mode = mode, p.value = value;
  return p;
}

}  // namespace

TEST(Resample, BilinearTwoByTwoToFourByFourByHand) {
  Tensor x = ops::from_vector(std::vector<double>{1, 2, 3, 4}, {1, 2, 2, 1}, DType::f64);
  // PyTorch: F.interpolate([[1, 2], [3, 4]], scale_factor=2, mode='bilinear', align_corners=False).
  std::vector<double> want = {1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0};
  expect_near_all(ops::upsample_bilinear2d(x, 4, 4, false).to_double(), want, 1e-15);
  expect_near_all(ops::upsample_bilinear2d_scale(x, 2, 2, false).to_double(), want, 1e-15);
  // align_corners=True: the corners stay, thirds in between.
  std::vector<double> corners = {1,       4.0 / 3, 5.0 / 3, 2,        5.0 / 3, 2,        7.0 / 3,  8.0 / 3,
                                 7.0 / 3, 8.0 / 3, 3,       10.0 / 3, 3,       10.0 / 3, 11.0 / 3, 4};
  expect_near_all(ops::upsample_bilinear2d(x, 4, 4, true).to_double(), corners, 1e-15);
  // Nearest, 2x: each pixel four times.
  std::vector<double> nearest = {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4};
  EXPECT_EQ(ops::upsample_nearest2d(x, 4, 4).to_double(), nearest);
  EXPECT_EQ(ops::upsample_nearest2d_scale(x, 2, 2).to_double(), nearest);
}

TEST(Resample, UpsampleMatchesLoops) {
  const Shape xs = {2, 5, 3, 2};
  Tensor x = ops::rand(xs, -2, 2, DType::f64);
  std::vector<double> xv = x.to_double();
  struct Size {
    int64_t h, w;
  } sizes[] = {{10, 6}, {9, 7}, {4, 2}, {5, 3}, {1, 1}, {17, 13}};
  for (Size s : sizes) {
    SCOPED_TRACE(engine::str(s.h, "x", s.w));
    expect_near_all(ops::upsample_nearest2d(x, s.h, s.w).to_double(), naive_upsample(xv, xs, s.h, s.w, false, false),
                    0);
    for (bool ac : {false, true})
      expect_near_all(ops::upsample_bilinear2d(x, s.h, s.w, ac).to_double(), naive_upsample(xv, xs, s.h, s.w, true, ac),
                      1e-14);
  }
  // Scale factors: out = floor(in * scale), indices through 1 / scale (not in / out).
  Tensor ys = ops::upsample_bilinear2d_scale(x, 1.5, 2.5, false);
  EXPECT_EQ(ys.shape(), (Shape{2, 7, 7, 2}));
  expect_near_all(ys.to_double(), naive_upsample(xv, xs, 7, 7, true, false, 1.5, 2.5), 1e-14);
  Tensor yn = ops::upsample_nearest2d_scale(x, 1.7, 3);
  EXPECT_EQ(yn.shape(), (Shape{2, 8, 9, 2}));
  expect_near_all(yn.to_double(), naive_upsample(xv, xs, 8, 9, false, false, 1.7, 3), 0);
  // f32 and bf16 storage within their precision of the f64 map.
  for (DType t : {DType::f32, DType::bf16}) {
    Tensor xt = ops::to(x, t);
    expect_near_all(ops::upsample_bilinear2d(xt, 9, 7, false).to_double(),
                    naive_upsample(xt.to_double(), xs, 9, 7, true, false),
                    t == DType::f32 ? 1e-5 : 2e-2);  // float weights
  }
}

TEST(Resample, PadMatchesLoopsAndReflectionPad2d) {
  // ReflectionPad2d((2, 2, 1, 0)) on the row [1, 2, 3]... as an image [1, 1, 3, 1] with left 2, right 2:
  Tensor row = ops::from_vector(std::vector<double>{1, 2, 3}, {1, 1, 3, 1}, DType::f64);
  EXPECT_EQ(ops::pad2d(row, pads(2, 2, 0, 0, ops::PadMode::reflect)).to_double(),
            (std::vector<double>{3, 2, 1, 2, 3, 2, 1}));
  EXPECT_EQ(ops::pad2d(row, pads(1, 2, 0, 0, ops::PadMode::constant, -5)).to_double(),
            (std::vector<double>{-5, 1, 2, 3, -5, -5}));
  const Shape xs = {2, 4, 5, 3};
  Tensor x = ops::rand(xs, -1, 1, DType::f64);
  std::vector<double> xv = x.to_double();
  for (auto mode : {ops::PadMode::constant, ops::PadMode::reflect}) {
    ops::Pad2dParams p = pads(3, 1, 2, 3, mode, 0.5);
    Tensor y = ops::pad2d(x, p);
    ASSERT_EQ(y.shape(), (Shape{2, 9, 9, 3}));
    auto reflect = [](int64_t i, int64_t n) { return i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i); };
    std::vector<double> want;
    for (int64_t n = 0; n < 2; n++)
      for (int64_t oh = 0; oh < 9; oh++)
        for (int64_t ow = 0; ow < 9; ow++)
          for (int64_t c = 0; c < 3; c++) {
            int64_t ih = oh - 2, iw = ow - 3;
            bool inside = ih >= 0 && ih < 4 && iw >= 0 && iw < 5;
            if (mode == ops::PadMode::constant && !inside) {
              want.push_back(0.5);
              continue;
            }
            want.push_back(xv[((n * 4 + reflect(ih, 4)) * 5 + reflect(iw, 5)) * 3 + c]);
          }
    EXPECT_EQ(y.to_double(), want);
  }
}

// Negative constant padding crops, as torch.nn.ZeroPad2d((-1, 1, -1, 1)): row/column 0 go, a zero row/column
// comes at the end (NASNet's factorized reduction, its shifted path).
TEST(Resample, NegativePaddingCropsLikeZeroPad2d) {
  Tensor x = ops::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {1, 2, 3, 1}, DType::f64);  // rows 123 / 456
  Tensor y = ops::pad2d(x, pads(-1, 1, -1, 1, ops::PadMode::constant));
  EXPECT_EQ(y.shape(), (Shape{1, 2, 3, 1}));
  EXPECT_EQ(y.to_double(), (std::vector<double>{5, 6, 0, 0, 0, 0}));
  EXPECT_EQ(ops::pad2d(x, pads(-2, 0, 0, 0, ops::PadMode::constant)).to_double(), (std::vector<double>{3, 6}));
}

TEST(Resample, GradAndDoubleBackward) {
  Tensor x = rand_input({1, 3, 4, 2});
  std::vector<testutil::Fn> fns = {
      [](const std::vector<Tensor>& in) { return ops::upsample_nearest2d(in[0], 7, 9); },
      [](const std::vector<Tensor>& in) { return ops::upsample_nearest2d(in[0], 2, 3); },
      [](const std::vector<Tensor>& in) { return ops::upsample_bilinear2d(in[0], 7, 9, false); },
      [](const std::vector<Tensor>& in) { return ops::upsample_bilinear2d(in[0], 7, 9, true); },
      [](const std::vector<Tensor>& in) { return ops::upsample_bilinear2d(in[0], 2, 3, false); },
      [](const std::vector<Tensor>& in) { return ops::upsample_bilinear2d_scale(in[0], 1.5, 2.5, false); },
      [](const std::vector<Tensor>& in) { return ops::pad2d(in[0], pads(2, 1, 1, 2, ops::PadMode::constant, 3)); },
      [](const std::vector<Tensor>& in) { return ops::pad2d(in[0], pads(3, 2, 2, 1, ops::PadMode::reflect)); },
      [](const std::vector<Tensor>& in) { return ops::pad2d(in[0], pads(-1, 1, -1, 1, ops::PadMode::constant)); },
  };
  for (size_t k = 0; k < fns.size(); k++) {
    SCOPED_TRACE(k);
    testutil::expect_gradcheck(fns[k], {x});
    testutil::expect_double_backward(fns[k], {x});
  }
}

TEST(Resample, BackwardOpsAreDifferentiable) {
  const Shape xs = {1, 3, 4, 2};
  ops::UpsampleParams up;
  up.mode = ops::UpsampleMode::bilinear;
  up.out_h = 5, up.out_w = 9;
  Tensor g = rand_input({1, 5, 9, 2});
  testutil::Fn upb = [&](const std::vector<Tensor>& in) { return ops::upsample2d_backward(in[0], xs, up); };
  testutil::expect_gradcheck(upb, {g});
  testutil::expect_double_backward(upb, {g});
  ops::Pad2dParams p = pads(3, 1, 2, 2, ops::PadMode::reflect);
  Tensor gp = rand_input({1, 7, 8, 2});
  testutil::Fn padb = [&](const std::vector<Tensor>& in) { return ops::pad2d_backward(in[0], xs, p); };
  testutil::expect_gradcheck(padb, {gp});
  testutil::expect_double_backward(padb, {gp});
}

TEST(Resample, Errors) {
  Tensor x = ops::zeros({1, 3, 4, 2});
  try {
    ops::pad2d(x, pads(0, 0, 3, 0, ops::PadMode::reflect));
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("pad2d"), std::string::npos) << msg;
    EXPECT_NE(msg.find("less than"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[1, 3, 4, 2]"), std::string::npos) << msg;
  }
  EXPECT_THROW(ops::pad2d(x, pads(-1, 0, 0, 0, ops::PadMode::reflect)), engine::Error);
  EXPECT_THROW(ops::pad2d(x, pads(-5, 0, 0, 0, ops::PadMode::constant)), engine::Error) << "crops all 4 columns";
  EXPECT_THROW(ops::pad2d(x, pads(0, 0, -2, -1, ops::PadMode::constant)), engine::Error) << "crops all 3 rows";
  EXPECT_THROW(ops::upsample_nearest2d(ops::zeros({3, 4, 2}), 6, 8), engine::Error);
  EXPECT_THROW(ops::upsample_bilinear2d(x, 0, 8, false), engine::Error);
  EXPECT_THROW(ops::upsample_nearest2d_scale(x, -2, 2), engine::Error);
  ops::UpsampleParams bad;
  bad.out_h = bad.out_w = 4;
  bad.align_corners = true;  // nearest
  EXPECT_THROW(ops::upsample2d(x, bad), engine::Error);
  EXPECT_THROW(ops::upsample2d_backward(ops::zeros({1, 5, 5, 2}), {1, 3, 4, 2}, ops::UpsampleParams{}), engine::Error);
}

TEST(Resample, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor x = ops::rand({2, 5, 6, 3}).set_requires_grad(true);
    Tensor a = ops::pad2d(x, pads(1, 1, 2, 2, ops::PadMode::reflect));
    Tensor b = ops::upsample_bilinear2d(a, 17, 16, false);
    Tensor c = ops::upsample_nearest2d_scale(b, 2, 2);
    graph::backward(ops::sum(ops::mul(c, c)));
  });
}
