// pool_test.cpp: max_pool2d, avg_pool2d and global_avg_pool2d against naive loops written here (PyTorch's
// output-size and divisor rules restated, TensorFlow 'SAME' padding), hand-computed spot values, the saved
// indices, NaN propagation, gradients and second derivatives against finite differences (of the ops and of
// their backward ops), errors, meta allocations.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/pool.h"
#include "ops/reduce.h"
#include "ops/view.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using ops::Pool2dParams;
using testutil::rand_input;

namespace {

// PyTorch's pooling_output_shape (with pad_before + pad_after for 2 pad).
int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t pb, int64_t pa, int64_t d, bool ceil_mode) {
  int64_t num = in + pb + pa - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t out = num / s + 1;
  if (ceil_mode && (out - 1) * s >= in + pb) out--;
  return out;
}

struct Naive {
  Shape shape;
  std::vector<double> y;
};

// Window maxima (padding ignored) or averages, from the definitions, over x [N, H, W, C] row-major.
Naive naive_pool(const std::vector<double>& x, const Shape& xs, const Pool2dParams& p, bool is_max) {
  const int64_t N = xs[0], H = xs[1], W = xs[2], C = xs[3];
  const int64_t Ho = out_size(H, p.kernel_h, p.stride_h, p.pad_top, p.pad_bottom, p.dilation_h, p.ceil_mode);
  const int64_t Wo = out_size(W, p.kernel_w, p.stride_w, p.pad_left, p.pad_right, p.dilation_w, p.ceil_mode);
  Naive r{{N, Ho, Wo, C}, {}};
  for (int64_t n = 0; n < N; n++)
    for (int64_t oh = 0; oh < Ho; oh++)
      for (int64_t ow = 0; ow < Wo; ow++)
        for (int64_t c = 0; c < C; c++) {
          double best = -std::numeric_limits<double>::infinity(), sum = 0;
          int64_t inside = 0, padded = 0;
          for (int64_t kh = 0; kh < p.kernel_h; kh++)
            for (int64_t kw = 0; kw < p.kernel_w; kw++) {
              int64_t ih = oh * p.stride_h - p.pad_top + kh * p.dilation_h;
              int64_t iw = ow * p.stride_w - p.pad_left + kw * p.dilation_w;
              // Taps in the padded extent count for count_include_pad; taps past it (ceil_mode) never do.
              if (ih < H + p.pad_bottom && iw < W + p.pad_right) padded++;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              double v = x[((n * H + ih) * W + iw) * C + c];
              best = std::max(best, v);
              sum += v;
              inside++;
            }
          r.y.push_back(is_max ? best : sum / double(p.count_include_pad ? padded : inside));
        }
  return r;
}

void expect_pool_matches(const Shape& xs, const Pool2dParams& p, bool is_max, const char* what) {
  SCOPED_TRACE(what);
  Tensor x = ops::rand(xs, -2, 2, DType::f64);
  Naive want = naive_pool(x.to_double(), xs, p, is_max);
  Tensor y = is_max ? ops::max_pool2d(x, p) : ops::avg_pool2d(x, p);
  ASSERT_EQ(y.shape(), want.shape);
  std::vector<double> got = y.to_double();
  for (size_t i = 0; i < got.size(); i++) EXPECT_NEAR(got[i], want.y[i], 1e-14) << "element " << i;
}

Pool2dParams asym(int64_t k, int64_t s, int64_t top, int64_t bottom, int64_t left, int64_t right) {
  Pool2dParams p = ops::pool2d_params(k, s);
  p.pad_top = top, p.pad_bottom = bottom, p.pad_left = left, p.pad_right = right;
  return p;
}

}  // namespace

TEST(Pool, MaxPoolMatchesLoops) {
  expect_pool_matches({2, 7, 6, 3}, ops::pool2d_params(3, 2, 1), true, "3x3 s2 p1 (ResNet stem)");
  expect_pool_matches({1, 8, 8, 2}, ops::pool2d_params(2), true, "2x2 s2");
  expect_pool_matches({1, 5, 7, 2}, ops::pool2d_params(2, 2, 0, 1, true), true, "2x2 s2 ceil_mode");
  expect_pool_matches({1, 6, 6, 2}, ops::pool2d_params(3, 2, 1, 1, true), true, "3x3 s2 p1 ceil_mode");
  expect_pool_matches({2, 9, 8, 2}, ops::pool2d_params(3, 1, 1, 2), true, "3x3 s1 p1 dilation 2");
  expect_pool_matches({1, 8, 7, 3}, asym(3, 2, 0, 1, 1, 1), true, "asymmetric padding");
  expect_pool_matches({1, 5, 5, 1}, ops::pool2d_params(5, 1, 2), true, "5x5 s1 p2 (SPP)");
}

TEST(Pool, AvgPoolMatchesLoopsBothDivisors) {
  for (bool include : {true, false}) {
    SCOPED_TRACE(include);
    auto with = [include](Pool2dParams p) {
      p.count_include_pad = include;
      return p;
    };
    expect_pool_matches({2, 7, 6, 3}, with(ops::pool2d_params(3, 2, 1)), false, "3x3 s2 p1");
    expect_pool_matches({1, 5, 7, 2}, with(ops::pool2d_params(2, 2, 1, 1, true)), false, "2x2 s2 p1 ceil_mode");
    expect_pool_matches({1, 6, 5, 2}, with(ops::pool2d_params(3, 2, 1, 1, true)), false, "3x3 s2 p1 ceil_mode");
    expect_pool_matches({1, 8, 7, 2}, with(asym(3, 2, 0, 1, 1, 1)), false, "asymmetric padding");
    expect_pool_matches({1, 6, 6, 2}, with(ops::pool2d_params(3, 1, 1)), false, "3x3 s1 p1 (NASNet)");
  }
}

TEST(Pool, HandComputedValues) {
  // x = 1..9 on a 3x3 image, 2x2 windows, stride 2, padding 1: windows {1}, {2,3}, {4,7}, {5,6,8,9}.
  std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  Tensor x = ops::from_vector(v, {1, 3, 3, 1}, DType::f64);
  Pool2dParams p = ops::pool2d_params(2, 2, 1);
  EXPECT_EQ(ops::max_pool2d(x, p).to_double(), (std::vector<double>{1, 3, 7, 9}));
  EXPECT_EQ(ops::avg_pool2d(x, p).to_double(), (std::vector<double>{0.25, 1.25, 2.75, 7}));  // / 4 always
  p.count_include_pad = false;
  EXPECT_EQ(ops::avg_pool2d(x, p).to_double(), (std::vector<double>{1, 2.5, 5.5, 7}));
  // 'SAME' (TensorFlow): 3x3 stride 2 on 8 rows pads 0 on top and 1 at the bottom; on 7 rows 1 and 1.
  Pool2dParams same = ops::same_pool_padding(ops::pool2d_params(3, 2), 8, 7);
  EXPECT_EQ(same.pad_top, 0);
  EXPECT_EQ(same.pad_bottom, 1);
  EXPECT_EQ(same.pad_left, 1);
  EXPECT_EQ(same.pad_right, 1);
  EXPECT_EQ(ops::max_pool2d(ops::zeros({1, 8, 7, 1}), same).shape(), (Shape{1, 4, 4, 1}));  // ceil(in / 2)
}

TEST(Pool, MaxPoolSavesInt32IndicesAndPropagatesNaN) {
  Tensor x = ops::rand({1, 4, 4, 2}, -1, 1).set_requires_grad(true);
  Tensor y = ops::max_pool2d(x, ops::pool2d_params(2));
  auto& saved = y.grad_fn()->saved_tensors;
  ASSERT_EQ(saved.size(), 1u);
  const Tensor& idx = saved[0].data;
  EXPECT_EQ(idx.dtype(), DType::i32);
  EXPECT_EQ(idx.shape(), (Shape{1, 2, 2, 2}));
  std::vector<double> xv = x.to_double(), iv = idx.to_double(), yv = y.to_double();
  for (size_t o = 0; o < iv.size(); o++) EXPECT_EQ(yv[o], xv[size_t(iv[o]) * 2 + o % 2]);  // x at the index
  std::vector<double> nan_in(16, 0.0);
  nan_in[5] = std::nan("");
  std::vector<double> out = ops::max_pool2d(ops::from_vector(nan_in, {1, 4, 4, 1}), ops::pool2d_params(2)).to_double();
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], 0.0);
}

TEST(Pool, GradAndDoubleBackward) {
  Tensor x = rand_input({2, 5, 6, 2});
  for (Pool2dParams p : {ops::pool2d_params(3, 2, 1), ops::pool2d_params(2, 2, 0, 1, true),
                         ops::pool2d_params(3, 1, 1, 2), asym(3, 2, 0, 1, 1, 1)}) {
    SCOPED_TRACE(engine::str("kernel ", p.kernel_h, " stride ", p.stride_h, " dilation ", p.dilation_h));
    testutil::Fn maxf = [p](const std::vector<Tensor>& in) { return ops::max_pool2d(in[0], p); };
    testutil::expect_gradcheck(maxf, {x});
    testutil::expect_double_backward(maxf, {x});
    if (p.dilation_h != 1) continue;
    for (bool include : {true, false}) {
      p.count_include_pad = include;
      testutil::Fn avgf = [p](const std::vector<Tensor>& in) { return ops::avg_pool2d(in[0], p); };
      testutil::expect_gradcheck(avgf, {x});
      testutil::expect_double_backward(avgf, {x});
    }
  }
  testutil::Fn global = [](const std::vector<Tensor>& in) { return ops::global_avg_pool2d(in[0]); };
  testutil::expect_gradcheck(global, {x});
}

TEST(Pool, BackwardOpsAreDifferentiable) {
  // The backward ops as functions of g: their rules (gather at the argmax; avg_pool2d) against finite
  // differences, and those rules' rules.
  const Shape xs = {1, 5, 5, 2};
  Pool2dParams p = ops::pool2d_params(3, 2, 1, 1, true);
  p.count_include_pad = false;
  Tensor x = ops::rand(xs, -1, 1, DType::f64);
  Tensor indices;
  {
    Tensor xr = x.detach().set_requires_grad(true);
    indices = ops::max_pool2d(xr, p).grad_fn()->saved_tensors[0].data;
  }
  Tensor g = rand_input({1, 3, 3, 2});
  testutil::Fn maxb = [&](const std::vector<Tensor>& in) { return ops::max_pool2d_backward(in[0], indices, xs, p); };
  testutil::expect_gradcheck(maxb, {g});
  testutil::expect_double_backward(maxb, {g});
  testutil::Fn avgb = [&](const std::vector<Tensor>& in) { return ops::avg_pool2d_backward(in[0], xs, p); };
  testutil::expect_gradcheck(avgb, {g});
  testutil::expect_double_backward(avgb, {g});
}

TEST(Pool, GlobalAveragePoolIsTheMeanOverPixels) {
  Tensor x = ops::rand({2, 3, 4, 5}, -1, 1, DType::f64);
  std::vector<double> xv = x.to_double(), y = ops::global_avg_pool2d(x).to_double();
  ASSERT_EQ(ops::global_avg_pool2d(x).shape(), (Shape{2, 1, 1, 5}));
  for (int64_t n = 0; n < 2; n++)
    for (int64_t c = 0; c < 5; c++) {
      double s = 0;
      for (int64_t p = 0; p < 12; p++) s += xv[(n * 12 + p) * 5 + c];
      EXPECT_NEAR(y[n * 5 + c], s / 12, 1e-14);
    }
}

TEST(Pool, Errors) {
  Tensor x = ops::zeros({1, 6, 6, 2});
  try {
    ops::max_pool2d(ops::zeros({6, 6, 2}), ops::pool2d_params(2));
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("max_pool2d"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[6, 6, 2]"), std::string::npos) << msg;
  }
  try {
    ops::avg_pool2d(x, ops::pool2d_params(2, 2, 2));
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most half the kernel"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::avg_pool2d(x, ops::pool2d_params(2, 2, 0, 2)), engine::Error);   // dilation
  EXPECT_THROW(ops::max_pool2d(x, ops::pool2d_params(7)), engine::Error);            // window too large
  EXPECT_THROW(ops::max_pool2d(x, ops::pool2d_params(0)), engine::Error);
  EXPECT_THROW(ops::max_pool2d_backward(ops::zeros({1, 2, 2, 2}), ops::zeros({1, 3, 3, 2}, DType::i32),
                                        {1, 6, 6, 2}, ops::pool2d_params(2)),
               engine::Error);
  EXPECT_THROW(ops::global_avg_pool2d(ops::zeros({2, 3})), engine::Error);
}

TEST(Pool, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor x = ops::rand({2, 9, 9, 4}).set_requires_grad(true);
    Tensor a = ops::max_pool2d(x, ops::pool2d_params(3, 2, 1));
    Tensor b = ops::avg_pool2d(a, ops::pool2d_params(2, 2, 0, 1, true));
    graph::backward(ops::sum(ops::mul(ops::global_avg_pool2d(b), 2.0)));
  });
}
