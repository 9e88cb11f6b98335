// elementwise_test.cpp: values against closed forms, gradients and second derivatives against finite
// differences, broadcasting rules and errors.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "tests/util/gradcheck_util.h"

using engine::DType;
using engine::Tensor;
using testutil::rand_input;

TEST(Elementwise, BinaryBroadcastValues) {
  Tensor a = ops::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = ops::from_vector(std::vector<double>{10, 20, 30}, {3});
  std::vector<double> s = ops::add(a, b).to_double();
  EXPECT_EQ(s, (std::vector<double>{11, 22, 33, 14, 25, 36}));
  Tensor c = ops::from_vector(std::vector<double>{2, 4}, {2, 1});
  EXPECT_EQ(ops::div(a, c).to_double(), (std::vector<double>{0.5, 1, 1.5, 1, 1.25, 1.5}));
  EXPECT_EQ(ops::sub(a, c).shape(), (engine::Shape{2, 3}));
}

TEST(Elementwise, BroadcastErrorNamesShapes) {
  Tensor a = ops::zeros({2, 3});
  Tensor b = ops::zeros({4});
  try {
    ops::add(a, b);
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("add"), std::string::npos);
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos);
    EXPECT_NE(msg.find("[4]"), std::string::npos);
  }
}

TEST(Elementwise, UnaryValuesMatchLibm) {
  std::vector<double> xs = {-2.5, -0.7, -0.1, 0.3, 1.2, 3.0};
  Tensor x = ops::from_vector(xs, {6}, DType::f64);
  auto g = ops::gelu(x).to_double();
  auto gt = ops::gelu_tanh(x).to_double();
  auto lr = ops::leaky_relu(x, 0.2).to_double();
  auto sg = ops::sigmoid(x).to_double();
  for (size_t i = 0; i < xs.size(); i++) {
    double v = xs[i];
    EXPECT_NEAR(g[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-15);
    EXPECT_NEAR(gt[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-15);
    EXPECT_NEAR(lr[i], v > 0 ? v : 0.2 * v, 1e-15);
    EXPECT_NEAR(sg[i], 1 / (1 + std::exp(-v)), 1e-15);
  }
}

TEST(Elementwise, Bf16RoundsToNearestEven) {
  Tensor x = ops::from_vector(std::vector<double>{1.0 + 1.0 / 256, 1.0 + 3.0 / 256, 3.14159}, {3}, DType::f32);
  std::vector<double> r = ops::to(x, DType::bf16).to_double();
  EXPECT_EQ(r[0], 1.0);            // tie -> even (1.0)
  EXPECT_EQ(r[1], 1.0 + 4.0 / 256); // tie -> even (1 + 2/128)
  EXPECT_NEAR(r[2], 3.140625, 1e-9);
  std::vector<double> h = ops::to(x, DType::f16).to_double();
  EXPECT_NEAR(h[2], 3.140625, 1e-9);
}

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  double low, high;
};

TEST(Elementwise, UnaryGradAndDoubleBackward) {
  std::vector<UnaryCase> cases = {
      {"exp", [](const Tensor& x) { return ops::exp(x); }, -1, 1},
      {"log", [](const Tensor& x) { return ops::log(x); }, 0.5, 2},
      {"sqrt", [](const Tensor& x) { return ops::sqrt(x); }, 0.5, 2},
      {"rsqrt", [](const Tensor& x) { return ops::rsqrt(x); }, 0.5, 2},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); }, -2, 2},
      {"sigmoid", [](const Tensor& x) { return ops::sigmoid(x); }, -2, 2},
      {"relu", [](const Tensor& x) { return ops::relu(x); }, -2, 2},
      {"leaky_relu", [](const Tensor& x) { return ops::leaky_relu(x, 0.2); }, -2, 2},
      {"gelu", [](const Tensor& x) { return ops::gelu(x); }, -2, 2},
      {"gelu_tanh", [](const Tensor& x) { return ops::gelu_tanh(x); }, -2, 2},
      {"pow", [](const Tensor& x) { return ops::pow(x, 2.5); }, 0.5, 2},
      {"erf", [](const Tensor& x) { return ops::erf(x); }, -2, 2},
      {"softplus", [](const Tensor& x) { return ops::softplus(x); }, -3, 3},
      {"affine", [](const Tensor& x) { return ops::add(ops::mul(x, -1.5), 0.25); }, -2, 2},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = rand_input({3, 4}, c.low, c.high);
    testutil::Fn f = [&](const std::vector<Tensor>& in) { return c.f(in[0]); };
    testutil::expect_gradcheck(f, {x});
    testutil::expect_double_backward(f, {x});
  }
}

TEST(Elementwise, BinaryGradWithBroadcastAndDoubleBackward) {
  Tensor a = rand_input({2, 3, 4});
  Tensor b = rand_input({3, 1}, 0.5, 1.5);
  for (auto op : {ops::BinaryOp::add, ops::BinaryOp::sub, ops::BinaryOp::mul, ops::BinaryOp::div,
                  ops::BinaryOp::maximum, ops::BinaryOp::minimum}) {
    SCOPED_TRACE(int(op));
    testutil::Fn f = [op](const std::vector<Tensor>& in) { return ops::binary(op, in[0], in[1]); };
    testutil::expect_gradcheck(f, {a, b});
    testutil::expect_double_backward(f, {a, b});
  }
}

TEST(Elementwise, CastAndCloneGradients) {
  Tensor x = rand_input({5});
  testutil::Fn f = [](const std::vector<Tensor>& in) {
    return ops::to(ops::mul(ops::to(in[0], DType::f32), ops::to(in[0], DType::f32)), DType::f64);
  };
  // Through f32 the finite differences lose precision: looser tolerance, same check.
  testutil::expect_gradcheck(f, {x}, 1e-3, 1e-4, 1e-3);
  testutil::Fn g = [](const std::vector<Tensor>& in) { return ops::clone(ops::broadcast_to(in[0], {3, 5})); };
  testutil::expect_gradcheck(g, {x});
}

TEST(Elementwise, InPlaceRefusesTensorsThatNeedGrad) {
  Tensor x = rand_input({3});
  EXPECT_THROW(ops::add_(x, x), engine::Error);
  graph::NoGrad ng;
  Tensor y = ops::ones({3}, DType::f64);
  ops::add_(y, x, 2.0);
  std::vector<double> xv = x.to_double(), yv = y.to_double();
  for (int i = 0; i < 3; i++) EXPECT_DOUBLE_EQ(yv[i], 1 + 2 * xv[i]);
}

// softplus = log(1 + exp(x)) without overflow at large |x| (StyleGAN's logistic losses see scores of any size).
TEST(Elementwise, SoftplusIsStableAtLargeMagnitudes) {
  Tensor x = ops::from_vector(std::vector<double>{-800, -30, -1, 0, 1, 30, 800}, {7}, DType::f64);
  const std::vector<double> y = ops::softplus(x).to_double(), xs = x.to_double();
  for (size_t i = 0; i < xs.size(); i++) {
    const double want = xs[i] > 0 ? xs[i] + std::log1p(std::exp(-xs[i])) : std::log1p(std::exp(xs[i]));
    EXPECT_NEAR(y[i], want, 1e-12 * std::max(1.0, std::fabs(want))) << xs[i];
    EXPECT_TRUE(std::isfinite(y[i]));
  }
  EXPECT_NEAR(y[3], std::log(2.0), 1e-15);
  Tensor f32 = ops::softplus(ops::from_vector(std::vector<double>{-200, 200}, {2}, DType::f32));
  EXPECT_EQ(f32.to_double()[1], 200.0);
  EXPECT_GE(f32.to_double()[0], 0.0);
}
