// batch_norm_test.cpp: batch_norm against naive per-channel loops (training: batch statistics and the
// running statistics' update with the unbiased variance; evaluation: running statistics), what it saves,
// the fused backward op against the closed-form gradients, gradients and second derivatives (of batch_norm
// and of batch_norm_backward itself) against finite differences, errors, meta allocations.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "graph/autograd.h"
#include "ops/batch_norm.h"
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

// Per channel c of x [M, C] (row-major values): mean and biased variance over the M rows.
struct ChannelStats {
  std::vector<double> mean, var;
};
ChannelStats channel_stats(const std::vector<double>& x, int64_t C) {
  const int64_t M = int64_t(x.size()) / C;
  ChannelStats s{std::vector<double>(C, 0.0), std::vector<double>(C, 0.0)};
  for (int64_t c = 0; c < C; c++) {
    for (int64_t r = 0; r < M; r++) s.mean[c] += x[r * C + c] / double(M);
    for (int64_t r = 0; r < M; r++) s.var[c] += (x[r * C + c] - s.mean[c]) * (x[r * C + c] - s.mean[c]) / double(M);
  }
  return s;
}

// y = (x - mean) / sqrt(var + eps) * w + b per channel.
std::vector<double> normalize(const std::vector<double>& x, const std::vector<double>& mean,
                              const std::vector<double>& var, const std::vector<double>& w,
                              const std::vector<double>& b, int64_t C, double eps) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    size_t c = i % size_t(C);
    y[i] = (x[i] - mean[c]) / std::sqrt(var[c] + eps) * (w.empty() ? 1.0 : w[c]) + (b.empty() ? 0.0 : b[c]);
  }
  return y;
}

// The batch statistics of x [3, 2, C] as batch_norm saves them (mean, invstd [C]), constants (no graph).
std::pair<Tensor, Tensor> batch_stats_of(const Tensor& x, double eps) {
  graph::NoGrad ng;
  Tensor xd = x.detach();
  Tensor mu = ops::mean(xd, {0, 1}, false);
  Tensor xc = ops::sub(xd, mu);
  return {ops::contiguous(mu), ops::contiguous(ops::rsqrt(ops::add(ops::mean(ops::mul(xc, xc), {0, 1}, false), eps)))};
}

void expect_all_near(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); i++)
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << what << " element " << i;
}

}  // namespace

TEST(BatchNorm, TrainingMatchesLoopsAndUpdatesRunningStats) {
  const double eps = 1e-5, momentum = 0.1;
  const int64_t C = 3;
  Tensor x = ops::rand({2, 4, 5, C}, -2, 3, DType::f64);  // NHWC
  Tensor w = ops::rand({C}, 0.5, 1.5, DType::f64), b = ops::rand({C}, -1, 1, DType::f64);
  Tensor rm = ops::rand({C}, -1, 1, DType::f64), rv = ops::rand({C}, 0.5, 2, DType::f64);
  std::vector<double> rm0 = rm.to_double(), rv0 = rv.to_double();
  ChannelStats s = channel_stats(x.to_double(), C);
  Tensor y = ops::batch_norm(x, w, b, rm, rv, true, momentum, eps);
  expect_all_near(y.to_double(), normalize(x.to_double(), s.mean, s.var, w.to_double(), b.to_double(), C, eps), 1e-12,
                  "y");
  const double M = 40;
  std::vector<double> rm1 = rm.to_double(), rv1 = rv.to_double();
  for (int64_t c = 0; c < C; c++) {
    EXPECT_NEAR(rm1[c], 0.9 * rm0[c] + 0.1 * s.mean[c], 1e-13);
    EXPECT_NEAR(rv1[c], 0.9 * rv0[c] + 0.1 * s.var[c] * M / (M - 1), 1e-13);  // unbiased
  }
  // No running statistics: batch statistics, nothing to update; affine off.
  Tensor plain = ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, momentum, eps);
  expect_all_near(plain.to_double(), normalize(x.to_double(), s.mean, s.var, {}, {}, C, eps), 1e-12, "plain");
  // Evaluation without running statistics uses the batch's too (PyTorch's track_running_stats=False).
  Tensor untracked = ops::batch_norm(x, w, Tensor(), Tensor(), Tensor(), false, momentum, eps);
  expect_all_near(untracked.to_double(), normalize(x.to_double(), s.mean, s.var, w.to_double(), {}, C, eps), 1e-12,
                  "untracked");
  // A non-contiguous x with the same values.
  Tensor xt = ops::transpose(ops::contiguous(ops::transpose(x, 1, 2)), 1, 2);
  ASSERT_FALSE(xt.is_contiguous());
  expect_all_near(ops::batch_norm(xt, w, b, Tensor(), Tensor(), true, momentum, eps).to_double(),
                  y.to_double(), 1e-12, "strided");
}

TEST(BatchNorm, EvaluationUsesRunningStatsAndLeavesThem) {
  const double eps = 1e-3;
  const int64_t C = 4;
  Tensor x = ops::rand({3, 2, 2, C}, -2, 2, DType::f64);
  Tensor w = ops::rand({C}, 0.5, 1.5, DType::f64), b = ops::rand({C}, -1, 1, DType::f64);
  Tensor rm = ops::rand({C}, -1, 1, DType::f64), rv = ops::rand({C}, 0.5, 2, DType::f64);
  std::vector<double> rm0 = rm.to_double(), rv0 = rv.to_double();
  Tensor y = ops::batch_norm(x, w, b, rm, rv, false, 0.1, eps);  // "frozen": evaluation with affine
  expect_all_near(y.to_double(), normalize(x.to_double(), rm0, rv0, w.to_double(), b.to_double(), C, eps), 1e-13, "y");
  EXPECT_EQ(rm.to_double(), rm0);
  EXPECT_EQ(rv.to_double(), rv0);
}

TEST(BatchNorm, LowPrecisionStorageAndManyChunks) {
  // 3000 rows: 12 row chunks combined pairwise; a large offset checks that no variance is lost to cancellation.
  const int64_t C = 5;
  Tensor x64 = ops::add(ops::rand({3000, C}, -1, 1, DType::f64), 100.0);
  for (DType t : {DType::f32, DType::bf16}) {
    Tensor x = ops::to(x64, t);
    Tensor rm = ops::zeros({C}), rv = ops::ones({C});
    std::vector<double> xv = x.to_double();
    ChannelStats s = channel_stats(xv, C);
    Tensor y = ops::batch_norm(x, Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5);
    expect_all_near(y.to_double(), normalize(xv, s.mean, s.var, {}, {}, C, 1e-5), t == DType::f32 ? 1e-4 : 3e-2,
                    engine::dtype_name(t));
    std::vector<double> rvv = rv.to_double();
    for (int64_t c = 0; c < C; c++) EXPECT_NEAR(rvv[c], 0.9 + 0.1 * s.var[c] * 3000 / 2999, 1e-5);
  }
}

TEST(BatchNorm, SavesInputMeanAndInvstd) {
  Tensor x = ops::rand({4, 3, 5}, -1, 1).set_requires_grad(true);
  Tensor w = ops::rand({5}).set_requires_grad(true), b = ops::rand({5}).set_requires_grad(true);
  Tensor y = ops::batch_norm(x, w, b, Tensor(), Tensor(), true);
  auto& saved = y.grad_fn()->saved_tensors;
  ASSERT_EQ(saved.size(), 4u);  // x, mean, invstd, weight (not y, not bias)
  EXPECT_TRUE(saved[0].data.same_storage(x));
  ChannelStats s = channel_stats(x.to_double(), 5);
  std::vector<double> mean = saved[1].data.to_double(), invstd = saved[2].data.to_double();
  for (int64_t c = 0; c < 5; c++) {
    EXPECT_EQ(saved[1].data.dtype(), DType::f32);
    EXPECT_NEAR(mean[c], s.mean[c], 1e-6);
    EXPECT_NEAR(invstd[c], 1 / std::sqrt(s.var[c] + 1e-5), 1e-4 * invstd[c]);
  }
  // A fused activation saves the bias besides (its mask is recomputed from x), still not y.
  Tensor y2 = ops::batch_norm(x, w, b, Tensor(), Tensor(), true, 0.1, 1e-5, ops::NormActivation::relu());
  auto& saved2 = y2.grad_fn()->saved_tensors;
  ASSERT_EQ(saved2.size(), 5u);
  EXPECT_TRUE(saved2[0].data.same_storage(x));
  EXPECT_TRUE(saved2[4].data.same_storage(b));
}

TEST(BatchNorm, BackwardOpMatchesClosedForm) {
  const int64_t C = 3, M = 8;
  Tensor x = ops::rand({2, 4, C}, -2, 2, DType::f64), w = ops::rand({C}, 0.5, 1.5, DType::f64);
  Tensor g = ops::rand({2, 4, C}, -1, 1, DType::f64);
  std::vector<double> xv = x.to_double(), wv = w.to_double(), gv = g.to_double();
  ChannelStats s = channel_stats(xv, C);
  std::vector<double> invstd(C);
  for (int64_t c = 0; c < C; c++) invstd[c] = 1 / std::sqrt(s.var[c] + 1e-5);
  Tensor mean_t = ops::from_vector(s.mean, {C}, DType::f64), invstd_t = ops::from_vector(invstd, {C}, DType::f64);
  for (bool batch_stats : {true, false}) {
    SCOPED_TRACE(batch_stats);
    ops::BatchNormGrads r = ops::batch_norm_backward(g, x, w, mean_t, invstd_t, batch_stats, 1e-5, {true, true, true});
    std::vector<double> dx = r.dx.to_double(), dw = r.dweight.to_double(), db = r.dbias.to_double();
    for (int64_t c = 0; c < C; c++) {
      double sg = 0, sgx = 0;
      for (int64_t m = 0; m < M; m++) {
        sg += gv[m * C + c];
        sgx += gv[m * C + c] * (xv[m * C + c] - s.mean[c]) * invstd[c];
      }
      EXPECT_NEAR(db[c], sg, 1e-12);
      EXPECT_NEAR(dw[c], sgx, 1e-12);
      for (int64_t m = 0; m < M; m++) {
        double xhat = (xv[m * C + c] - s.mean[c]) * invstd[c];
        double want = batch_stats ? invstd[c] * wv[c] * (gv[m * C + c] - sg / M - xhat * sgx / M)
                                  : invstd[c] * wv[c] * gv[m * C + c];
        EXPECT_NEAR(dx[m * C + c], want, 1e-12);
      }
    }
  }
  ops::BatchNormGrads only_dx = ops::batch_norm_backward(g, x, w, mean_t, invstd_t, true, 1e-5, {true, false, false});
  EXPECT_TRUE(only_dx.dx.defined());
  EXPECT_FALSE(only_dx.dweight.defined());
  EXPECT_FALSE(only_dx.dbias.defined());
}

TEST(BatchNorm, GradAndDoubleBackward) {
  Tensor x = rand_input({2, 3, 2, 3}, -2, 2), w = rand_input({3}, 0.5, 1.5), b = rand_input({3});
  testutil::Fn train = [](const std::vector<Tensor>& in) {
    return ops::batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), true, 0.1, 1e-5);
  };
  testutil::expect_gradcheck(train, {x, w, b});
  testutil::expect_double_backward(train, {x, w, b});
  testutil::Fn plain = [](const std::vector<Tensor>& in) {
    return ops::batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
  };
  testutil::expect_gradcheck(plain, {x});
  testutil::expect_double_backward(plain, {x});
  Tensor rm = ops::rand({3}, -0.5, 0.5, DType::f64), rv = ops::rand({3}, 0.5, 1.5, DType::f64);
  testutil::Fn eval = [rm, rv](const std::vector<Tensor>& in) {
    return ops::batch_norm(in[0], in[1], in[2], rm, rv, false, 0.1, 1e-5);
  };
  testutil::expect_gradcheck(eval, {x, w, b});
  testutil::expect_double_backward(eval, {x, w, b});
  // Training with running statistics (updated on every call, which does not change the output).
  Tensor rm2 = ops::zeros({3}, DType::f64), rv2 = ops::ones({3}, DType::f64);
  testutil::Fn tracked = [rm2, rv2](const std::vector<Tensor>& in) {
    return ops::batch_norm(in[0], in[1], Tensor(), rm2, rv2, true, 0.1, 1e-5);
  };
  testutil::expect_gradcheck(tracked, {x, w});
}

// A fused activation (NormActivation) is the composition batch_norm -> relu / leaky_relu: the same outputs and the
// same gradients of x, weight and bias (f64: to rounding), training and evaluation.
TEST(BatchNorm, FusedActivationEqualsTheComposition) {
  Tensor x = rand_input({2, 3, 2, 4}, -2, 2), w = rand_input({4}, -1.5, 1.5), b = rand_input({4}, -0.5, 0.5);
  Tensor r = rand_input({2, 3, 2, 4});
  Tensor rm = ops::rand({4}, -0.5, 0.5, DType::f64), rv = ops::rand({4}, 0.5, 1.5, DType::f64);
  for (double slope : {0.0, 0.1}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(engine::str("slope ", slope, training ? " training" : " evaluation"));
      auto run = [&](bool fused) {
        std::vector<Tensor> in = {x.detach().set_requires_grad(true), w.detach().set_requires_grad(true),
                                  b.detach().set_requires_grad(true)};
        Tensor y;
        if (fused) {
          y = ops::batch_norm(in[0], in[1], in[2], training ? Tensor() : rm, training ? Tensor() : rv, training, 0.1,
                              1e-5, ops::NormActivation::leaky_relu(slope));
        } else {
          y = ops::batch_norm(in[0], in[1], in[2], training ? Tensor() : rm, training ? Tensor() : rv, training, 0.1,
                              1e-5);
          y = slope == 0.0 ? ops::relu(y) : ops::leaky_relu(y, slope);
        }
        graph::backward(ops::sum(ops::mul(y, r)));
        return std::vector<Tensor>{y, in[0].grad(), in[1].grad(), in[2].grad()};
      };
      const std::vector<Tensor> fused = run(true), composed = run(false);
      const char* names[] = {"y", "dx", "dweight", "dbias"};
      for (size_t i = 0; i < fused.size(); i++)
        expect_all_near(fused[i].to_double(), composed[i].to_double(), 1e-12, names[i]);
    }
  }
}

TEST(BatchNorm, FusedActivationGradAndDoubleBackward) {
  Tensor x = rand_input({2, 3, 2, 3}, -2, 2), w = rand_input({3}, 0.5, 1.5), b = rand_input({3});
  for (double slope : {0.0, 0.1}) {
    SCOPED_TRACE(engine::str("slope ", slope));
    testutil::Fn train = [slope](const std::vector<Tensor>& in) {
      return ops::batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), true, 0.1, 1e-5,
                             ops::NormActivation::leaky_relu(slope));
    };
    testutil::expect_gradcheck(train, {x, w, b});
    testutil::expect_double_backward(train, {x, w, b});
    Tensor rm = ops::rand({3}, -0.5, 0.5, DType::f64), rv = ops::rand({3}, 0.5, 1.5, DType::f64);
    testutil::Fn eval = [rm, rv, slope](const std::vector<Tensor>& in) {
      return ops::batch_norm(in[0], in[1], in[2], rm, rv, false, 0.1, 1e-5, ops::NormActivation::leaky_relu(slope));
    };
    testutil::expect_gradcheck(eval, {x, w, b});
    testutil::expect_double_backward(eval, {x, w, b});
  }
}

// The same with a fused leaky ReLU and a bias: the rule multiplies g by the mask as a recorded op, so its results
// stay differentiable in g (gradcheck of the rule, then its own derivative).
TEST(BatchNorm, FusedActivationBackwardOpIsDifferentiable) {
  const double eps = 1e-5;
  Tensor g = rand_input({3, 2, 2}), x = rand_input({3, 2, 2}, -2, 2), w = rand_input({2}, 0.5, 1.5);
  Tensor b = rand_input({2}, -0.3, 0.3);
  for (int k = 0; k < 3; k++) {
    testutil::Fn f = [k, eps, b](const std::vector<Tensor>& in) {
      const auto [mean, invstd] = batch_stats_of(in[1], eps);
      ops::BatchNormGrads r = ops::batch_norm_backward(in[0], in[1], in[2], mean, invstd, true, eps,
                                                       {true, true, true}, b, ops::NormActivation::leaky_relu(0.1));
      return k == 0 ? r.dx : k == 1 ? r.dweight : r.dbias;
    };
    testutil::expect_gradcheck(f, {g, x, w});
    testutil::expect_double_backward(f, {g, x, w});
  }
}

// A residual (the end of a residual block): batch_norm(x, .., act, residual) is the composition
// act(batch_norm(x) + residual), with the same outputs and gradients of x, weight, bias and the residual (f64: to
// rounding), with ReLU, leaky ReLU and no activation, training and evaluation.
TEST(BatchNorm, ResidualEqualsTheComposition) {
  Tensor x = rand_input({2, 3, 2, 4}, -2, 2), w = rand_input({4}, -1.5, 1.5), b = rand_input({4}, -0.5, 0.5);
  Tensor res = rand_input({2, 3, 2, 4}, -1, 1), r = rand_input({2, 3, 2, 4});
  Tensor rm = ops::rand({4}, -0.5, 0.5, DType::f64), rv = ops::rand({4}, 0.5, 1.5, DType::f64);
  for (double slope : {0.0, 0.1, 1.0}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(engine::str("slope ", slope, training ? " training" : " evaluation"));
      auto run = [&](bool fused) {
        std::vector<Tensor> in = {x.detach().set_requires_grad(true), w.detach().set_requires_grad(true),
                                  b.detach().set_requires_grad(true), res.detach().set_requires_grad(true)};
        Tensor y;
        if (fused) {
          y = ops::batch_norm(in[0], in[1], in[2], training ? Tensor() : rm, training ? Tensor() : rv, training, 0.1,
                              1e-5, ops::NormActivation::leaky_relu(slope), in[3]);
        } else {
          y = ops::batch_norm(in[0], in[1], in[2], training ? Tensor() : rm, training ? Tensor() : rv, training, 0.1,
                              1e-5);
          y = ops::add(y, in[3]);
          if (slope != 1.0) y = slope == 0.0 ? ops::relu(y) : ops::leaky_relu(y, slope);
        }
        graph::backward(ops::sum(ops::mul(y, r)));
        return std::vector<Tensor>{y, in[0].grad(), in[1].grad(), in[2].grad(), in[3].grad()};
      };
      const std::vector<Tensor> fused = run(true), composed = run(false);
      const char* names[] = {"y", "dx", "dweight", "dbias", "dresidual"};
      for (size_t i = 0; i < fused.size(); i++)
        expect_all_near(fused[i].to_double(), composed[i].to_double(), 1e-12, names[i]);
    }
  }
}

TEST(BatchNorm, ResidualGradAndDoubleBackward) {
  Tensor x = rand_input({2, 3, 2, 3}, -2, 2), w = rand_input({3}, 0.5, 1.5), b = rand_input({3});
  Tensor res = rand_input({2, 3, 2, 3}, -1, 1);
  for (double slope : {0.0, 0.1, 1.0}) {
    SCOPED_TRACE(engine::str("slope ", slope));
    testutil::Fn train = [slope](const std::vector<Tensor>& in) {
      return ops::batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), true, 0.1, 1e-5,
                             ops::NormActivation::leaky_relu(slope), in[3]);
    };
    testutil::expect_gradcheck(train, {x, w, b, res});
    testutil::expect_double_backward(train, {x, w, b, res});
  }
}

// The backward op with the activation's derivative read from y (a residual): every output, dresidual included,
// differentiable in g, x and weight (gradcheck of the op, then of its rule).
TEST(BatchNorm, ResidualBackwardOpIsDifferentiable) {
  const double eps = 1e-5;
  Tensor g = rand_input({3, 2, 2}), x = rand_input({3, 2, 2}, -2, 2), w = rand_input({2}, 0.5, 1.5);
  // The forward's output: its zeros and positives set the mask (ReLU and leaky ReLU alike keep the sign).
  Tensor y = ops::leaky_relu(rand_input({3, 2, 2}, -1, 1), 0.1);
  for (int k = 0; k < 4; k++) {
    SCOPED_TRACE(engine::str("output ", k));
    testutil::Fn f = [k, eps, y](const std::vector<Tensor>& in) {
      const auto [mean, invstd] = batch_stats_of(in[1], eps);
      ops::BatchNormGrads r =
          ops::batch_norm_backward(in[0], in[1], in[2], mean, invstd, true, eps, {true, true, true, true}, Tensor(),
                                   ops::NormActivation::leaky_relu(0.1), y);
      return k == 0 ? r.dx : k == 1 ? r.dweight : k == 2 ? r.dbias : r.dresidual;
    };
    testutil::expect_gradcheck(f, {g, x, w});
    testutil::expect_double_backward(f, {g, x, w});
  }
}

TEST(BatchNorm, BackwardOpIsDifferentiable) {
  // batch_norm_backward as a function of (g, x, w), each output separately, both kinds of statistics.
  const double eps = 1e-5;
  Tensor g = rand_input({3, 2, 2}), x = rand_input({3, 2, 2}, -2, 2), w = rand_input({2}, 0.5, 1.5);
  for (bool batch_stats : {true, false}) {
    for (int k = 0; k < 3; k++) {
      SCOPED_TRACE(engine::str("batch_stats ", batch_stats, " output ", k));
      testutil::Fn f = [k, eps, batch_stats](const std::vector<Tensor>& in) {
        // The statistics as the forward saves them; constants of the op (its rule recomputes them from x with
        // batch statistics; with running ones they are fixed numbers).
        auto [mean, invstd] = batch_stats_of(in[1], eps);
        if (!batch_stats) {
          mean = ops::full({2}, 0.25, DType::f64);
          invstd = ops::full({2}, 1.5, DType::f64);
        }
        ops::BatchNormGrads r = ops::batch_norm_backward(in[0], in[1], in[2], mean, invstd, batch_stats, eps,
                                                         {true, true, true});
        return k == 0 ? r.dx : k == 1 ? r.dweight : r.dbias;
      };
      testutil::expect_gradcheck(f, {g, x, w});
      testutil::expect_double_backward(f, {g, x, w});
    }
  }
}

TEST(BatchNorm, Errors) {
  Tensor x = ops::zeros({2, 4, 6});
  try {
    ops::batch_norm(x, ops::ones({5}), Tensor(), Tensor(), Tensor(), true);
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("batch_norm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 4, 6]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[5]"), std::string::npos) << msg;
  }
  EXPECT_THROW(ops::batch_norm(x, Tensor(), Tensor(), ops::zeros({6}), Tensor(), true), engine::Error);
  EXPECT_THROW(ops::batch_norm(x, Tensor(), Tensor(), ops::zeros({6}, DType::f64), ops::ones({6}, DType::f64), true),
               engine::Error);  // running statistics in f32 for f32 x
  EXPECT_THROW(ops::batch_norm(x, Tensor(), Tensor(), ops::zeros({5}), ops::ones({5}), false), engine::Error);
  EXPECT_THROW(ops::batch_norm(ops::zeros({6}), Tensor(), Tensor(), Tensor(), Tensor(), true), engine::Error);
  try {
    ops::batch_norm(ops::zeros({1, 1, 1, 6}), Tensor(), Tensor(), Tensor(), Tensor(), true);
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1 value per channel"), std::string::npos) << e.what();
  }
  Tensor rm = ops::zeros({6}), rv = ops::ones({6});
  rm.set_requires_grad(true);
  EXPECT_THROW(ops::batch_norm(x, Tensor(), Tensor(), rm, rv, true), engine::Error);
  try {  // a residual of another shape
    ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, {}, ops::zeros({2, 4, 5}));
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("residual [2, 4, 5] must have x's shape [2, 4, 6]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, {},
                               ops::zeros({2, 4, 6}, DType::f64)),
               engine::Error);  // another dtype
  try {                         // a negative slope after a residual: the mask could not be read from y's sign
    ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, ops::NormActivation::leaky_relu(-0.5),
                    ops::zeros({2, 4, 6}));
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("negative slope >= 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(
      ops::batch_norm_backward(x, x, Tensor(), ops::zeros({6}), ops::ones({6}), true, 1e-5, {true, false, false, true}),
      engine::Error);  // dresidual without y
}

TEST(BatchNorm, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor x = ops::rand({2, 5, 7, 8}).set_requires_grad(true);
    Tensor w = ops::ones({8}).set_requires_grad(true), b = ops::zeros({8}).set_requires_grad(true);
    Tensor rm = ops::zeros({8}), rv = ops::ones({8});
    Tensor y = ops::batch_norm(x, w, b, rm, rv, true);
    Tensor z = ops::batch_norm(y, w, Tensor(), rm, rv, false);
    Tensor u = ops::batch_norm(z, w, b, rm, rv, true, 0.1, 1e-5, ops::NormActivation::relu(), x);  // a residual
    graph::backward(ops::sum(ops::mul(u, x)));
  });
}

// Instance norm: batch norm of each sample on its own (ops/batch_norm.h).
TEST(InstanceNorm, MatchesLoopsPerSampleAndChannel) {
  const double eps = 1e-5;
  const int64_t N = 3, C = 6;
  Tensor x = ops::rand({N, 5, 4, C}, -2, 3, DType::f64);
  Tensor y = ops::instance_norm(x, eps);
  ASSERT_EQ(y.shape(), x.shape());
  const std::vector<double> xv = x.to_double(), yv = y.to_double();
  const size_t per = xv.size() / size_t(N);
  for (int64_t n = 0; n < N; n++) {
    std::vector<double> xs(xv.begin() + n * per, xv.begin() + (n + 1) * per);
    ChannelStats s = channel_stats(xs, C);
    std::vector<double> want = normalize(xs, s.mean, s.var, {}, {}, C, eps);
    std::vector<double> got(yv.begin() + n * per, yv.begin() + (n + 1) * per);
    expect_all_near(got, want, 1e-12, "instance_norm");
  }
  // f32 storage, many row chunks per sample (S = 40000 rows: 157 chunks), against the f64 result.
  Tensor big = ops::rand({2, 200, 200, 3}, -1, 2, DType::f64);
  Tensor y32 = ops::to(ops::instance_norm(ops::to(big, DType::f32)), DType::f64), y64 = ops::instance_norm(big);
  expect_all_near(y32.to_double(), y64.to_double(), 1e-5, "instance_norm f32, many chunks");
}

TEST(InstanceNorm, SavesInputMeanAndInvstd) {
  Tensor x = rand_input({2, 4, 4, 8}, -2, 2).set_requires_grad(true);
  Tensor y = ops::instance_norm(x);
  ASSERT_TRUE(y.grad_fn());
  ASSERT_EQ(y.grad_fn()->saved_tensors.size(), 3u);
  EXPECT_EQ(y.grad_fn()->saved(1).shape(), (Shape{2, 8}));
  EXPECT_EQ(y.grad_fn()->saved(2).shape(), (Shape{2, 8}));
}

TEST(InstanceNorm, GradAndDoubleBackward) {
  Tensor x = rand_input({2, 3, 2, 3}, -2, 2);
  testutil::Fn f = [](const std::vector<Tensor>& in) { return ops::instance_norm(in[0], 1e-5); };
  testutil::expect_gradcheck(f, {x});
  testutil::expect_double_backward(f, {x});
}

TEST(InstanceNorm, BackwardOpIsDifferentiable) {
  const double eps = 1e-5;
  Tensor g = rand_input({2, 3, 2, 2}), x = rand_input({2, 3, 2, 2}, -2, 2);
  testutil::Fn f = [eps](const std::vector<Tensor>& in) {
    Tensor mean, invstd;
    {  // the statistics as the forward saves them: constants of the op (its rule recomputes them from x)
      graph::NoGrad ng;
      Tensor xd = in[1].detach();
      Tensor mu = ops::mean(xd, {1, 2}, false), xc = ops::sub(xd, ops::mean(xd, {1, 2}, true));
      mean = ops::contiguous(mu);
      invstd = ops::contiguous(ops::rsqrt(ops::add(ops::mean(ops::mul(xc, xc), {1, 2}, false), eps)));
    }
    return ops::instance_norm_backward(in[0], in[1], mean, invstd, eps);
  };
  testutil::expect_gradcheck(f, {g, x});
  testutil::expect_double_backward(f, {g, x});
}

TEST(InstanceNorm, Errors) {
  try {
    ops::instance_norm(ops::zeros({4, 6}));
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[N, ..., C]"), std::string::npos) << e.what();
  }
  try {
    ops::instance_norm(ops::zeros({2, 1, 1, 6}));
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1 value per sample"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::instance_norm(ops::zeros({2, 3, 3, 6}), -1.0), engine::Error);
  Tensor x = ops::zeros({2, 3, 3, 6});
  EXPECT_THROW(ops::instance_norm_backward(x, x, ops::zeros({2, 5}), ops::ones({2, 6}), 1e-5), engine::Error);
}

TEST(InstanceNorm, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor x = ops::rand({2, 5, 7, 8}).set_requires_grad(true);
    Tensor y = ops::instance_norm(ops::instance_norm(x));
    graph::backward(ops::sum(ops::mul(y, x)));
  });
}
