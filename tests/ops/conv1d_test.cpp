// conv1d_test.cpp: conv1d and glu against independent naive loops, gradients and second derivatives (of the
// ops and of their gradient ops) against finite differences, padding cases (encoder, causal decoder, wider
// than the kernel), strided inputs, reduced precision against f64, shape errors, meta allocations.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/counters.h"
#include "graph/autograd.h"
#include "ops/conv1d.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/view.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::rand_input;

namespace {

// y[b, t, o] = bias[o] + sum_{k, i} x[b, t + k - pl, i] w[k, i, o], rows outside [0, T) being zero.
std::vector<double> naive_conv1d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t pl, int64_t pr) {
  const int64_t B = x.size(0), T = x.size(1), Cin = x.size(2), K = w.size(0), Cout = w.size(2);
  const int64_t To = T + pl + pr - K + 1;
  std::vector<double> xv = x.to_double(), wv = w.to_double(),
                      bv = bias.defined() ? bias.to_double() : std::vector<double>();
  std::vector<double> y(size_t(B * To * Cout), 0.0);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < To; t++)
      for (int64_t o = 0; o < Cout; o++) {
        double acc = bias.defined() ? bv[size_t(o)] : 0.0;
        for (int64_t k = 0; k < K; k++) {
          int64_t s = t + k - pl;
          if (s < 0 || s >= T) continue;
          for (int64_t i = 0; i < Cin; i++)
            acc += xv[size_t((b * T + s) * Cin + i)] * wv[size_t((k * Cin + i) * Cout + o)];
        }
        y[size_t((b * To + t) * Cout + o)] = acc;
      }
  return y;
}

struct Padding {
  const char* name;
  int64_t K, pl, pr;
};
const Padding kPaddings[] = {
    {"encoder K=3 (1, 1)", 3, 1, 1}, {"decoder K=3 causal (2, 0)", 3, 2, 0}, {"K=1 (0, 0)", 1, 0, 0},
    {"K=2 (0, 0) shrinks", 2, 0, 0}, {"pad wider than kernel (3, 2)", 2, 3, 2},
};

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < got.size(); i++) worst = std::max(worst, std::abs(got[i] - want[i]));
  EXPECT_LE(worst, tol) << what << ": max error " << worst;
}

}  // namespace

TEST(Conv1d, ValuesMatchNaiveLoop) {
  for (const Padding& p : kPaddings) {
    SCOPED_TRACE(p.name);
    Tensor x = rand_input({2, 5, 3}, -1, 1, false), w = rand_input({p.K, 3, 4}, -1, 1, false);
    Tensor b = rand_input({4}, -1, 1, false);
    Tensor y = ops::conv1d(x, w, b, p.pl, p.pr);
    EXPECT_EQ(y.shape(), (Shape{2, 5 + p.pl + p.pr - p.K + 1, 4}));
    expect_near_all(y.to_double(), naive_conv1d(x, w, b, p.pl, p.pr), 1e-13, "with bias");
    expect_near_all(ops::conv1d(x, w, Tensor(), p.pl, p.pr).to_double(), naive_conv1d(x, w, Tensor(), p.pl, p.pr),
                    1e-13, "without bias");
  }
}

TEST(Conv1d, CausalOutputIgnoresTheFuture) {
  Tensor x = rand_input({1, 6, 2}, -1, 1, false), w = rand_input({3, 2, 2}, -1, 1, false);
  std::vector<double> y0 = ops::conv1d(x, w, Tensor(), 2, 0).to_double();
  std::vector<double> xv = x.to_double();
  for (size_t i = 8; i < xv.size(); i++) xv[i] += 5.0;  // change rows t >= 4
  Tensor x2 = ops::from_vector(xv, x.shape(), DType::f64);
  std::vector<double> y1 = ops::conv1d(x2, w, Tensor(), 2, 0).to_double();
  for (size_t i = 0; i < 8; i++) EXPECT_EQ(y0[i], y1[i]) << "row " << i / 2 << " saw a later input";
  EXPECT_NE(y0[8], y1[8]);
}

TEST(Conv1d, StridedInputMatchesContiguous) {
  Tensor base = rand_input({3, 2, 5}, -1, 1, false);  // x = transpose: [2, 5, 3], not contiguous
  Tensor x = ops::transpose(base, 0, 2);
  x = ops::transpose(x, 0, 1);  // [2, 5, 3]
  ASSERT_FALSE(x.is_contiguous());
  Tensor w = rand_input({3, 3, 2}, -1, 1, false);
  expect_near_all(ops::conv1d(x, w, Tensor(), 1, 1).to_double(), naive_conv1d(ops::contiguous(x), w, Tensor(), 1, 1),
                  1e-13, "strided x");
}

TEST(Conv1d, ReducedPrecisionCloseToF64) {
  Tensor x = rand_input({2, 7, 16}, -1, 1, false), w = rand_input({3, 16, 8}, -1, 1, false),
         b = rand_input({8}, -1, 1, false);
  std::vector<double> want = naive_conv1d(x, w, b, 2, 0);
  for (auto [dt, tol] : {std::pair{DType::f32, 1e-5}, std::pair{DType::bf16, 0.15}, std::pair{DType::f16, 2e-2}}) {
    SCOPED_TRACE(engine::dtype_name(dt));
    Tensor y = ops::conv1d(ops::to(x, dt), ops::to(w, dt), ops::to(b, dt), 2, 0);
    EXPECT_EQ(y.dtype(), dt);
    expect_near_all(y.to_double(), want, tol, engine::dtype_name(dt));
  }
}

TEST(Conv1d, GradAndDoubleBackward) {
  for (const Padding& p : kPaddings) {
    SCOPED_TRACE(p.name);
    Tensor x = rand_input({2, 4, 3}), w = rand_input({p.K, 3, 2}), b = rand_input({2});
    auto f = [&](const std::vector<Tensor>& in) { return ops::conv1d(in[0], in[1], in[2], p.pl, p.pr); };
    testutil::expect_gradcheck(f, {x, w, b});
    // conv1d is bilinear: its second derivatives run the rules of conv1d_backward_input/_weight.
    auto g = [&](const std::vector<Tensor>& in) {
      Tensor y = ops::conv1d(in[0], in[1], in[2], p.pl, p.pr);
      return ops::mul(y, y);
    };
    testutil::expect_double_backward(g, {x, w, b});
  }
}

TEST(Conv1d, GradientOpsGradAndDoubleBackward) {
  const int64_t K = 3, pl = 2, pr = 1;
  Tensor g = rand_input({2, 5, 2}), w = rand_input({K, 3, 2}), x = rand_input({2, 5 - pl - pr + K - 1, 3});
  auto fin = [&](const std::vector<Tensor>& in) {
    Tensor dx = ops::conv1d_backward_input(in[0], in[1], pl, pr);
    return ops::mul(dx, dx);
  };
  auto fw = [&](const std::vector<Tensor>& in) {
    Tensor dw = ops::conv1d_backward_weight(in[0], in[1], K, pl, pr);
    return ops::mul(dw, dw);
  };
  testutil::expect_gradcheck(fin, {g, w});
  testutil::expect_double_backward(fin, {g, w});
  testutil::expect_gradcheck(fw, {g, x});
  testutil::expect_double_backward(fw, {g, x});
}

TEST(Conv1d, ShapeErrorsNameTheOpAndShapes) {
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const engine::Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("conv1d"), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  };
  Tensor x = ops::zeros({2, 5, 3}), w = ops::zeros({3, 3, 4});
  expect_error([&] { ops::conv1d(x, ops::zeros({3, 2, 4}), Tensor(), 1, 1); }, "[3, 2, 4]");
  expect_error([&] { ops::conv1d(ops::zeros({5, 3}), w, Tensor(), 1, 1); }, "[5, 3]");
  expect_error([&] { ops::conv1d(x, w, ops::zeros({3}), 1, 1); }, "bias");
  expect_error([&] { ops::conv1d(x, w, Tensor(), -1, 1); }, "-1");
  expect_error([&] { ops::conv1d(ops::zeros({2, 1, 3}), w, Tensor(), 0, 0); }, "no output");
  expect_error([&] { ops::conv1d_backward_weight(ops::zeros({2, 4, 4}), x, 3, 1, 1); }, "[2, 4, 4]");
}

TEST(Conv1d, FlopsCountOnlyRealInputRows) {
  // B 2, T 4, K 3, causal (2, 0): taps reach 2, 3 and 4 output rows: 9 (row, tap) pairs of 2 * Cin * Cout.
  Tensor x = rand_input({2, 4, 3}, -1, 1, false), w = rand_input({3, 3, 5}, -1, 1, false);
  engine::counters().reset();
  ops::conv1d(x, w, Tensor(), 2, 0);
  ops::conv1d_backward_input(ops::conv1d(x, w, Tensor(), 2, 0), w, 2, 0);
  EXPECT_DOUBLE_EQ(engine::counters().by_op["conv1d"].flops, 2 * (2.0 * 2 * 9 * 3 * 5));
  EXPECT_DOUBLE_EQ(engine::counters().by_op["conv1d_backward_input"].flops, 2.0 * 2 * 9 * 3 * 5);
}

TEST(Conv1d, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor x = ops::rand({2, 6, 4}).set_requires_grad(true);
    Tensor w = ops::rand({3, 4, 6}).set_requires_grad(true), b = ops::zeros({6}).set_requires_grad(true);
    Tensor y = ops::glu(ops::conv1d(ops::transpose(ops::transpose(x, 0, 1), 0, 1), w, b, 2, 0), -1);
    graph::backward(ops::sum(ops::mul(y, y)));
  });
}

// ---------------------------------------------------------------------------------------------------
// GLU

TEST(Glu, ValuesMatchClosedForm) {
  Tensor x = rand_input({2, 4, 3}, -2, 2, false);
  std::vector<double> xv = x.to_double();
  // dim 1: a = x[:, 0:2, :], b = x[:, 2:4, :]
  std::vector<double> y = ops::glu(x, 1).to_double();
  ASSERT_EQ(y.size(), 12u);
  for (int64_t o = 0; o < 2; o++)
    for (int64_t h = 0; h < 2; h++)
      for (int64_t i = 0; i < 3; i++) {
        double a = xv[size_t((o * 4 + h) * 3 + i)], b = xv[size_t((o * 4 + h + 2) * 3 + i)];
        EXPECT_NEAR(y[size_t((o * 2 + h) * 3 + i)], a / (1 + std::exp(-b)), 1e-15);
      }
  Tensor z = rand_input({3, 6}, -2, 2, false);
  std::vector<double> zv = z.to_double(), zy = ops::glu(z, -1).to_double();
  for (int64_t r = 0; r < 3; r++)
    for (int64_t c = 0; c < 3; c++)
      EXPECT_NEAR(zy[size_t(r * 3 + c)], zv[size_t(r * 6 + c)] / (1 + std::exp(-zv[size_t(r * 6 + c + 3)])), 1e-15);
}

TEST(Glu, GradAndDoubleBackward) {
  for (int64_t dim : {0, 1, -1}) {
    SCOPED_TRACE(dim);
    Tensor x = rand_input({4, 2, 6}, -2, 2);
    auto f = [dim](const std::vector<Tensor>& in) { return ops::glu(in[0], dim); };
    testutil::expect_gradcheck(f, {x});
    testutil::expect_double_backward(f, {x});
  }
  // glu_backward as a function of (g, x): its own rule, checked to second order.
  Tensor g = rand_input({3, 2}), x = rand_input({3, 4}, -2, 2);
  auto fb = [](const std::vector<Tensor>& in) { return ops::glu_backward(in[0], in[1], -1); };
  testutil::expect_gradcheck(fb, {g, x});
  testutil::expect_double_backward(fb, {g, x});
}

TEST(Glu, ErrorsAndMeta) {
  try {
    ops::glu(ops::zeros({2, 5}), -1);
    ADD_FAILURE() << "expected an error";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("glu"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[2, 5]"), std::string::npos);
  }
  EXPECT_THROW(ops::glu_backward(ops::zeros({2, 3}), ops::zeros({2, 4}), -1), engine::Error);
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor x = ops::rand({3, 8}).set_requires_grad(true);
    Tensor y = ops::glu(x, 1);
    Tensor gx = graph::grad({ops::sum(ops::mul(y, y))}, {x}, {}, true)[0];
    graph::backward(ops::sum(gx));
  });
}
