// grad_clip_test.cpp: the gradients' norm and its clipping: clip_grad_norm against the norm and the scaled gradients
// computed here, its f64 accumulation, and the clip coefficient computed on the device (clip_coefficient) against the
// host's formula, read by an optimizer's update.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/factory.h"
#include "ops/optim.h"
#include "ops/optimizer.h"

using engine::DType;
using engine::Tensor;
using Vec = std::vector<double>;

TEST(Optim, ClipGradNormScalesWhenAboveMaxNorm) {
  Tensor a = ops::zeros({2, 2}, DType::f64), b = ops::zeros({3}, DType::f64), c = ops::zeros({2}, DType::f64);
  Vec ga = {3, -1, 2, 0.5}, gb = {-4, 1, 1};
  a.set_grad(ops::from_vector(ga, {2, 2}, DType::f64));
  b.set_grad(ops::from_vector(gb, {3}, DType::f64));
  // c has no gradient: skipped.
  double sq = 0;
  for (double x : ga) sq += x * x;
  for (double x : gb) sq += x * x;
  double norm = std::sqrt(sq);  // sqrt(9+1+4+0.25+16+1+1) = sqrt(32.25) = 5.679...

  // Below the limit: returned, nothing changes.
  EXPECT_NEAR(ops::clip_grad_norm({a, b, c}, 10.0), norm, 1e-12);
  EXPECT_EQ(a.grad().to_double(), ga);
  // Above: every grad scaled by max_norm / (norm + 1e-6).
  EXPECT_NEAR(ops::clip_grad_norm({a, b, c}, 2.0), norm, 1e-12);
  double coef = 2.0 / (norm + 1e-6);
  Vec na = a.grad().to_double(), nb = b.grad().to_double();
  for (size_t i = 0; i < ga.size(); i++) EXPECT_NEAR(na[i], ga[i] * coef, 1e-12);
  for (size_t i = 0; i < gb.size(); i++) EXPECT_NEAR(nb[i], gb[i] * coef, 1e-12);
  EXPECT_NEAR(ops::clip_grad_norm({a, b, c}, 100.0), 2.0, 1e-5);  // the new norm is max_norm
  EXPECT_FALSE(c.grad().defined());
  EXPECT_EQ(ops::clip_grad_norm({c}, 1.0), 0.0);
}

// The clip coefficient computed on the device is the host's (grad_norm's norm, then max / (norm + 1e-6)) to the bit,
// and an update that reads it there is the update given that number on the host.
TEST(Optim, ClipCoefficientOnTheDeviceIsTheHostsAndTheUpdateReadsIt) {
  Tensor a = ops::zeros({2, 2}, DType::f64), b = ops::zeros({3}, DType::f64), c = ops::zeros({2}, DType::f64);
  Vec ga = {3, -1, 2, 0.5}, gb = {-4, 1, 1};
  a.set_grad(ops::from_vector(ga, {2, 2}, DType::f64));
  b.set_grad(ops::from_vector(gb, {3}, DType::f64));
  const double norm = ops::grad_norm({a, b, c});
  for (double max_norm : {2.0, 10.0}) {
    const Tensor coef = ops::clip_coefficient({a, b, c}, max_norm);
    ASSERT_EQ(coef.shape(), (engine::Shape{1}));
    EXPECT_EQ(coef.to_double()[0], norm > max_norm ? max_norm / (norm + 1e-6) : 1.0) << max_norm;
  }
  EXPECT_FALSE(ops::clip_coefficient({c}, 1.0).defined()) << "no gradient, no coefficient";
  Tensor bad = ops::zeros({2}, DType::f32);
  bad.set_grad(ops::from_vector(Vec{std::nan(""), 1.0}, {2}));
  EXPECT_EQ(ops::clip_coefficient({bad}, 1.0).to_double()[0], 1.0) << "a NaN norm clips nothing (the host's test)";
  // AdamW through the Optimizer: the factor read from the tensor, or the same number given on the host.
  auto run = [&](bool on_device) {
    Tensor p = ops::from_vector(Vec{0.5, -0.25, 1.0}, {3}, DType::f32), g = ops::from_vector(Vec{3, -4, 12}, {3});
    p.set_grad(g);
    ops::AdamOptions o;
    o.lr = 0.1;
    ops::AdamW opt({{"w", p}}, o);
    const Tensor coef = ops::clip_coefficient({p}, 1.0);
    if (on_device)
      opt.set_grad_scale(1, coef);
    else
      opt.set_grad_scale(coef.to_double()[0]);
    opt.step();
    return p.to_double();
  };
  const Vec host = run(false), device = run(true);
  EXPECT_EQ(host, device);
  EXPECT_NE(host, (Vec{0.5, -0.25, 1.0}));
  // An update that cannot read a device factor says so.
  Tensor w = ops::zeros({2});
  ops::Adafactor ada({{"w", w}}, ops::AdafactorOptions{});
  EXPECT_THROW(ada.set_grad_scale(1, ops::clip_coefficient({a}, 1.0)), engine::Error);
}

TEST(Optim, ClipGradNormF32AccumulatesInF64) {
  // 2^20 elements of 1e-3 in f32: a float running sum would drift; the f64 sum gives sqrt(2^20) * 1e-3.
  Tensor p = ops::zeros({1 << 20});
  p.set_grad(ops::full({1 << 20}, 1e-3));
  double expected = std::sqrt(double(1 << 20)) * double(float(1e-3));
  EXPECT_NEAR(ops::clip_grad_norm({p}, 1e9), expected, 1e-9 * expected);
}
