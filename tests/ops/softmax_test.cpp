// softmax_test.cpp: softmax / log_softmax against the textbook formulas, stability for large inputs, the
// fused backward ops and their own rules (gradients and second derivatives against finite differences),
// what is saved, errors, meta allocations.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/softmax.h"
#include "ops/view.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::rand_input;

namespace {

// softmax along dim 1 of a [R, N, S] tensor given as row-major values: exp(x_k) / sum_j exp(x_j), computed
// straight from the definition (inputs are small enough not to overflow).
std::vector<double> softmax_formula(const std::vector<double>& x, int64_t R, int64_t N, int64_t S, bool log) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < R; r++)
    for (int64_t s = 0; s < S; s++) {
      double z = 0;
      for (int64_t k = 0; k < N; k++) z += std::exp(x[(r * N + k) * S + s]);
      for (int64_t k = 0; k < N; k++) {
        size_t i = size_t((r * N + k) * S + s);
        y[i] = log ? x[i] - std::log(z) : std::exp(x[i]) / z;
      }
    }
  return y;
}

}  // namespace

TEST(Softmax, MatchesFormulaAlongAnyDimension) {
  Tensor x = ops::rand({2, 5, 3}, -3, 3, DType::f64);
  std::vector<double> xv = x.to_double();
  for (bool log : {false, true}) {
    SCOPED_TRACE(log ? "log_softmax" : "softmax");
    std::vector<double> want = softmax_formula(xv, 2, 5, 3, log);
    std::vector<double> got = (log ? ops::log_softmax(x, 1) : ops::softmax(x, -2)).to_double();
    for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got[i], want[i], 1e-14);
    // Last dimension, through a transposed (non-contiguous) view of the same values.
    Tensor xt = ops::transpose(x, 1, 2);  // [2, 3, 5], softmax over the original dim 1
    std::vector<double> gt = (log ? ops::log_softmax(xt, -1) : ops::softmax(xt, -1)).to_double();
    for (int64_t r = 0; r < 2; r++)
      for (int64_t s = 0; s < 3; s++)
        for (int64_t k = 0; k < 5; k++)
          EXPECT_NEAR(gt[size_t((r * 3 + s) * 5 + k)], want[size_t((r * 5 + k) * 3 + s)], 1e-14);
  }
  // f32 agrees with the f64 formula to float precision.
  std::vector<double> f32 = ops::softmax(ops::to(x, DType::f32), 1).to_double();
  std::vector<double> want = softmax_formula(ops::to(ops::to(x, DType::f32), DType::f64).to_double(), 2, 5, 3, false);
  for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(f32[i], want[i], 1e-6);
}

TEST(Softmax, StableForLargeInputs) {
  // exp(1000) overflows; subtracting the row max keeps the result exact.
  Tensor x = ops::from_vector(std::vector<double>{1000, 1001, 1002, -1000, -1001, -1002}, {2, 3}, DType::f32);
  std::vector<double> y = ops::softmax(x, 1).to_double(), ly = ops::log_softmax(x, 1).to_double();
  double z = 1 + std::exp(-1.0) + std::exp(-2.0);
  std::vector<double> want = {std::exp(-2.0) / z, std::exp(-1.0) / z, 1 / z,
                              1 / z,              std::exp(-1.0) / z, std::exp(-2.0) / z};
  for (size_t i = 0; i < want.size(); i++) {
    EXPECT_NEAR(y[i], want[i], 1e-6);
    EXPECT_NEAR(ly[i], std::log(want[i]), 1e-5);
  }
}

TEST(Softmax, BackwardOpsMatchFormulas) {
  Tensor g = ops::rand({3, 4}, -1, 1, DType::f64);
  Tensor y = ops::softmax(ops::rand({3, 4}, -1, 1, DType::f64), 1);
  std::vector<double> gv = g.to_double(), yv = y.to_double();
  std::vector<double> sb = ops::softmax_backward(g, y, 1).to_double();
  Tensor ly = ops::log(y);
  std::vector<double> lyv = ly.to_double(), lb = ops::log_softmax_backward(g, ly, 1).to_double();
  for (int r = 0; r < 3; r++) {
    double gy = 0, gs = 0;
    for (int k = 0; k < 4; k++) {
      gy += gv[r * 4 + k] * yv[r * 4 + k];
      gs += gv[r * 4 + k];
    }
    for (int k = 0; k < 4; k++) {
      int i = r * 4 + k;
      EXPECT_NEAR(sb[i], yv[i] * (gv[i] - gy), 1e-14);
      EXPECT_NEAR(lb[i], gv[i] - std::exp(lyv[i]) * gs, 1e-14);
    }
  }
}

TEST(Softmax, SavesOnlyItsOutput) {
  Tensor x = rand_input({2, 3});
  Tensor y = ops::softmax(x, 1);
  ASSERT_TRUE(y.grad_fn());
  ASSERT_EQ(y.grad_fn()->saved_tensors.size(), 1u);
  EXPECT_TRUE(y.grad_fn()->saved_tensors[0].is_output);
  Tensor ly = ops::log_softmax(x, 1);
  ASSERT_EQ(ly.grad_fn()->saved_tensors.size(), 1u);
  EXPECT_TRUE(ly.grad_fn()->saved_tensors[0].is_output);
}

TEST(Softmax, GradAndDoubleBackward) {
  for (int64_t dim : {0, 1, -1}) {
    SCOPED_TRACE(dim);
    Tensor x = rand_input({3, 4, 2}, -2, 2);
    testutil::Fn sm = [dim](const std::vector<Tensor>& in) { return ops::softmax(in[0], dim); };
    testutil::Fn lsm = [dim](const std::vector<Tensor>& in) { return ops::log_softmax(in[0], dim); };
    testutil::expect_gradcheck(sm, {x});
    testutil::expect_double_backward(sm, {x});
    testutil::expect_gradcheck(lsm, {x});
    testutil::expect_double_backward(lsm, {x});
  }
}

TEST(Softmax, BackwardOpsGradAndDoubleBackward) {
  // The fused backward ops as functions of both their inputs (g and y), including their own rules' rules.
  Tensor g = rand_input({3, 4}), y = rand_input({3, 4}, 0.1, 0.9);
  testutil::Fn sb = [](const std::vector<Tensor>& in) { return ops::softmax_backward(in[0], in[1], 1); };
  testutil::Fn lb = [](const std::vector<Tensor>& in) { return ops::log_softmax_backward(in[0], in[1], 1); };
  testutil::expect_gradcheck(sb, {g, y});
  testutil::expect_double_backward(sb, {g, y});
  testutil::expect_gradcheck(lb, {g, y});
  testutil::expect_double_backward(lb, {g, y});
}

TEST(Softmax, Errors) {
  try {
    ops::softmax(ops::zeros({2, 3}), 2);
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("softmax"), std::string::npos);
  }
  try {
    ops::softmax_backward(ops::zeros({2, 3}), ops::zeros({3, 2}), 1);
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos);
    EXPECT_NE(msg.find("[3, 2]"), std::string::npos);
  }
  EXPECT_THROW(ops::softmax(ops::zeros({3}, DType::i64), 0), engine::Error);
}

TEST(Softmax, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor x = ops::rand({2, 3, 5}).set_requires_grad(true);
    Tensor y = ops::mul(ops::softmax(x, -1), ops::log_softmax(x, 1));
    graph::backward(ops::sum(y));
  });
}
