// norm_test.cpp: layer_norm against the textbook formula, its saved statistics, the fused backward op
// against the closed-form gradients, gradients and second derivatives (of layer_norm and of
// layer_norm_backward itself) against finite differences, errors, meta allocations; dropout_add_layer_norm
// against the three ops it fuses.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/rng.h"
#include "graph/autograd.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/norm.h"
#include "ops/reduce.h"
#include "ops/view.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::rand_input;

namespace {

// Per row of C values: mean, 1/sqrt(biased variance + eps), from the definitions.
struct RowStats {
  std::vector<double> mean, rstd;
};
RowStats row_stats(const std::vector<double>& x, int64_t C, double eps) {
  RowStats s;
  for (size_t r = 0; r < x.size() / size_t(C); r++) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; c++) m += x[r * C + c] / double(C);
    for (int64_t c = 0; c < C; c++) v += (x[r * C + c] - m) * (x[r * C + c] - m) / double(C);
    s.mean.push_back(m);
    s.rstd.push_back(1 / std::sqrt(v + eps));
  }
  return s;
}

// y = (x - mean) / sqrt(var + eps) * w + b, row by row.
std::vector<double> layer_norm_formula(const std::vector<double>& x, const std::vector<double>& w,
                                       const std::vector<double>& b, int64_t C, double eps) {
  RowStats s = row_stats(x, C, eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    size_t r = i / size_t(C), c = i % size_t(C);
    y[i] = (x[i] - s.mean[r]) * s.rstd[r] * (w.empty() ? 1.0 : w[c]) + (b.empty() ? 0.0 : b[c]);
  }
  return y;
}

// The saved statistics as layer_norm_backward expects them ([rows], f64 here), computed with plain ops
// and detached: the op treats them as constants (its rule recomputes them from x).
std::pair<Tensor, Tensor> stats_tensors(const Tensor& x, double eps) {
  graph::NoGrad ng;
  Tensor xd = x.detach();
  Tensor mu = ops::mean(xd, {-1}, true);
  Tensor xc = ops::sub(xd, mu);
  Tensor rstd = ops::rsqrt(ops::add(ops::mean(ops::mul(xc, xc), {-1}, true), eps));
  return {ops::contiguous(ops::reshape(mu, {-1})), ops::contiguous(ops::reshape(rstd, {-1}))};
}

}  // namespace

TEST(LayerNorm, MatchesFormula) {
  const double eps = 1e-5;
  Tensor x = ops::rand({2, 3, 6}, -2, 2, DType::f64);
  Tensor w = ops::rand({6}, 0.5, 1.5, DType::f64), b = ops::rand({6}, -1, 1, DType::f64);
  std::vector<double> want = layer_norm_formula(x.to_double(), w.to_double(), b.to_double(), 6, eps);
  std::vector<double> got = ops::layer_norm(x, w, b, eps).to_double();
  for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got[i], want[i], 1e-13);
  std::vector<double> plain = layer_norm_formula(x.to_double(), {}, {}, 6, eps);
  std::vector<double> got_plain = ops::layer_norm(x, Tensor(), Tensor(), eps).to_double();
  for (size_t i = 0; i < plain.size(); i++) EXPECT_NEAR(got_plain[i], plain[i], 1e-13);
  // A non-contiguous x with the same values.
  Tensor xt = ops::transpose(ops::contiguous(ops::transpose(x, 0, 1)), 0, 1);
  ASSERT_FALSE(xt.is_contiguous());
  std::vector<double> got_t = ops::layer_norm(xt, w, b, eps).to_double();
  for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got_t[i], want[i], 1e-13);
  // f32 and bf16 storage: statistics in f32, so within the storage precision of the formula.
  for (DType t : {DType::f32, DType::bf16}) {
    Tensor xs = ops::to(x, t), ws = ops::to(w, t), bs = ops::to(b, t);
    std::vector<double> ref = layer_norm_formula(xs.to_double(), ws.to_double(), bs.to_double(), 6, eps);
    std::vector<double> y = ops::layer_norm(xs, ws, bs, eps).to_double();
    double tol = t == DType::f32 ? 1e-5 : 2e-2;
    for (size_t i = 0; i < ref.size(); i++) EXPECT_NEAR(y[i], ref[i], tol * std::max(1.0, std::fabs(ref[i])));
  }
}

TEST(LayerNorm, SavesInputAndRowStatistics) {
  Tensor x = ops::rand({4, 5}, -1, 1).set_requires_grad(true);
  Tensor w = ops::rand({5}).set_requires_grad(true), b = ops::rand({5}).set_requires_grad(true);
  Tensor y = ops::layer_norm(x, w, b, 1e-5);
  auto& saved = y.grad_fn()->saved_tensors;
  ASSERT_EQ(saved.size(), 4u);  // x, mean, rstd, weight (not y, not bias)
  EXPECT_TRUE(saved[0].data.same_storage(x));
  for (int k : {1, 2}) {
    EXPECT_EQ(saved[k].data.shape(), (Shape{4}));
    EXPECT_EQ(saved[k].data.dtype(), DType::f32);
  }
  RowStats s = row_stats(x.to_double(), 5, 1e-5);
  std::vector<double> mean = saved[1].data.to_double(), rstd = saved[2].data.to_double();
  for (size_t r = 0; r < 4; r++) {
    EXPECT_NEAR(mean[r], s.mean[r], 1e-6);
    EXPECT_NEAR(rstd[r], s.rstd[r], 1e-4 * s.rstd[r]);
  }
  Tensor x64 = rand_input({2, 3});
  EXPECT_EQ(ops::layer_norm(x64, Tensor(), Tensor()).grad_fn()->saved_tensors[1].data.dtype(), DType::f64);
}

TEST(LayerNorm, BackwardOpMatchesClosedForm) {
  const double eps = 1e-5;
  const int64_t C = 5;
  Tensor x = ops::rand({3, C}, -2, 2, DType::f64), w = ops::rand({C}, 0.5, 1.5, DType::f64);
  Tensor g = ops::rand({3, C}, -1, 1, DType::f64);
  auto [mean, rstd] = stats_tensors(x, eps);
  ops::LayerNormGrads r = ops::layer_norm_backward(g, x, w, mean, rstd, eps, {true, true, true});
  std::vector<double> xv = x.to_double(), wv = w.to_double(), gv = g.to_double();
  RowStats s = row_stats(xv, C, eps);
  std::vector<double> dx = r.dx.to_double(), dw = r.dweight.to_double(), db = r.dbias.to_double();
  std::vector<double> dw_want(C, 0.0), db_want(C, 0.0);
  for (int64_t row = 0; row < 3; row++) {
    // dx = rstd * (a - mean(a) - xhat * mean(a * xhat)),  a = g * w
    double ma = 0, max = 0;
    for (int64_t c = 0; c < C; c++) {
      double xhat = (xv[row * C + c] - s.mean[row]) * s.rstd[row];
      ma += gv[row * C + c] * wv[c] / C;
      max += gv[row * C + c] * wv[c] * xhat / C;
      dw_want[c] += gv[row * C + c] * xhat;
      db_want[c] += gv[row * C + c];
    }
    for (int64_t c = 0; c < C; c++) {
      double xhat = (xv[row * C + c] - s.mean[row]) * s.rstd[row];
      EXPECT_NEAR(dx[row * C + c], s.rstd[row] * (gv[row * C + c] * wv[c] - ma - xhat * max), 1e-12);
    }
  }
  for (int64_t c = 0; c < C; c++) {
    EXPECT_NEAR(dw[c], dw_want[c], 1e-12);
    EXPECT_NEAR(db[c], db_want[c], 1e-12);
  }
  // Only what is asked for is computed (and allocated).
  ops::LayerNormGrads only_dx = ops::layer_norm_backward(g, x, w, mean, rstd, eps, {true, false, false});
  EXPECT_TRUE(only_dx.dx.defined());
  EXPECT_FALSE(only_dx.dweight.defined());
  EXPECT_FALSE(only_dx.dbias.defined());
}

TEST(LayerNorm, GradAndDoubleBackward) {
  Tensor x = rand_input({3, 5}, -2, 2), w = rand_input({5}, 0.5, 1.5), b = rand_input({5});
  testutil::Fn full = [](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], in[1], in[2], 1e-5); };
  testutil::expect_gradcheck(full, {x, w, b});
  testutil::expect_double_backward(full, {x, w, b});
  testutil::Fn plain = [](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], Tensor(), Tensor(), 1e-5); };
  testutil::expect_gradcheck(plain, {x});
  testutil::expect_double_backward(plain, {x});
  Tensor x3 = rand_input({2, 2, 4}, -2, 2), w3 = rand_input({4}, 0.5, 1.5);
  testutil::Fn no_bias = [](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], in[1], Tensor(), 1e-5); };
  testutil::expect_gradcheck(no_bias, {x3, w3});
  testutil::expect_double_backward(no_bias, {x3, w3});
}

TEST(LayerNorm, BackwardOpIsDifferentiable) {
  // layer_norm_backward as a function of (g, x, w), each output separately: checks its own rule (first
  // derivatives) and that rule's rule (second derivatives), with the statistics recomputed from x.
  const double eps = 1e-5;
  Tensor g = rand_input({2, 4}), x = rand_input({2, 4}, -2, 2), w = rand_input({4}, 0.5, 1.5);
  for (int k = 0; k < 3; k++) {
    SCOPED_TRACE(k);
    testutil::Fn f = [k, eps](const std::vector<Tensor>& in) {
      auto [mean, rstd] = stats_tensors(in[1], eps);
      ops::LayerNormGrads r = ops::layer_norm_backward(in[0], in[1], in[2], mean, rstd, eps, {true, true, true});
      return k == 0 ? r.dx : k == 1 ? r.dweight : r.dbias;
    };
    testutil::expect_gradcheck(f, {g, x, w});
    testutil::expect_double_backward(f, {g, x, w});
  }
}

TEST(LayerNorm, Errors) {
  Tensor x = ops::zeros({2, 6});
  try {
    ops::layer_norm(x, ops::ones({5}), Tensor());
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("layer_norm"), std::string::npos);
    EXPECT_NE(msg.find("weight"), std::string::npos);
    EXPECT_NE(msg.find("[2, 6]"), std::string::npos);
    EXPECT_NE(msg.find("[5]"), std::string::npos);
  }
  EXPECT_THROW(ops::layer_norm(x, Tensor(), ops::zeros({6}, DType::f64)), engine::Error);
  EXPECT_THROW(ops::layer_norm(ops::scalar(1.0), Tensor(), Tensor()), engine::Error);
}

TEST(LayerNorm, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor x = ops::rand({2, 3, 8}).set_requires_grad(true);
    Tensor w = ops::ones({8}).set_requires_grad(true), b = ops::zeros({8}).set_requires_grad(true);
    graph::backward(ops::sum(ops::mul(ops::layer_norm(x, w, b, 1e-5), x)));
  });
}

// dropout_add_layer_norm against the three ops it fuses: the same output, gradients and generator offset, bit for
// bit (the same dropout draw, the same roundings), with and without dropout, in f32 and bf16; its own gradients
// and second derivatives (without dropout) against finite differences; meta allocates as the cpu.
TEST(DropoutAddLayerNorm, IsTheThreeOpsBitForBit) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (auto [p, training] : {std::pair<double, bool>{0.3, true}, {0.3, false}, {0.0, true}}) {
      SCOPED_TRACE(engine::str(engine::dtype_name(dt), " p ", p, training ? " training" : " eval"));
      auto inputs = [dt] {
        engine::manual_seed(7);
        return std::vector<Tensor>{ops::to(ops::rand({3, 5, 40}, -2, 2), dt).set_requires_grad(true),
                                   ops::to(ops::rand({3, 5, 40}, -2, 2), dt).set_requires_grad(true),
                                   ops::to(ops::rand({40}, 0.5, 1.5), dt).set_requires_grad(true),
                                   ops::to(ops::rand({40}), dt).set_requires_grad(true)};
      };
      auto run = [&](bool fused) {
        std::vector<Tensor> in = inputs();
        Tensor out = fused ? ops::dropout_add_layer_norm(in[0], in[1], in[2], in[3], p, training, 1e-5)
                           : ops::layer_norm(ops::add(ops::dropout(in[0], p, training), in[1]), in[2], in[3], 1e-5);
        const uint64_t offset = engine::generator().offset;
        Tensor g = ops::to(ops::rand(out.shape(), -1, 1), dt);
        std::vector<Tensor> grads = graph::grad({out}, in, {g});
        grads.insert(grads.begin(), out);
        return std::make_pair(grads, offset);
      };
      auto [want, want_offset] = run(false);
      auto [got, got_offset] = run(true);
      EXPECT_EQ(got_offset, want_offset);
      const char* names[] = {"out", "dy", "dresidual", "dweight", "dbias"};
      for (size_t i = 0; i < want.size(); i++)
        EXPECT_EQ(ops::to(got[i], DType::f64).to_double(), ops::to(want[i], DType::f64).to_double()) << names[i];
    }
  }
}

TEST(DropoutAddLayerNorm, GradAndDoubleBackwardWithoutDropout) {
  Tensor y = rand_input({3, 6}, -2, 2), r = rand_input({3, 6}, -2, 2), w = rand_input({6}, 0.5, 1.5),
         b = rand_input({6});
  testutil::Fn f = [](const std::vector<Tensor>& in) {
    return ops::dropout_add_layer_norm(in[0], in[1], in[2], in[3], 0.5, false, 1e-5);
  };
  testutil::expect_gradcheck(f, {y, r, w, b});
  testutil::expect_double_backward(f, {y, r, w, b});
}

TEST(DropoutAddLayerNorm, ErrorsNameTheArgument) {
  try {
    ops::dropout_add_layer_norm(ops::zeros({2, 6}), ops::zeros({2, 5}), Tensor(), Tensor(), 0.1, true);
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("residual"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 5]"), std::string::npos) << msg;
  }
  EXPECT_THROW(ops::dropout_add_layer_norm(ops::zeros({2, 6}), ops::zeros({2, 6}), Tensor(), Tensor(), 1.5, true),
               engine::Error);
}

TEST(DropoutAddLayerNorm, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor y = ops::rand({2, 3, 8}).set_requires_grad(true), r = ops::rand({2, 3, 8}).set_requires_grad(true);
    Tensor w = ops::ones({8}).set_requires_grad(true), b = ops::zeros({8}).set_requires_grad(true);
    graph::backward(ops::sum(ops::mul(ops::dropout_add_layer_norm(y, r, w, b, 0.2, true), y)));
  });
}

// weight_norm against the composition of ops it replaces (its definition: v * g / sqrt(sum(v * v)) over every
// dimension but dim): values and both gradients, f64 to rounding and f32 / bf16 within their rounding, for each
// dim of a 3-d v and for a 1-d v; its gradients and second derivatives against finite differences; errors; meta.
namespace {

Tensor weight_norm_composition(const Tensor& v, const Tensor& g, int64_t dim) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < v.dim(); d++)
    if (d != (dim + v.dim()) % v.dim()) dims.push_back(d);
  Tensor squares = ops::mul(v, v);  // a 1-d v: each element its own channel (ops::sum over {} would sum all)
  return ops::mul(v, ops::div(g, ops::sqrt(dims.empty() ? squares : ops::sum(squares, dims, true))));
}

Shape channel_shape(const Shape& v, int64_t dim) {
  Shape s(v.size(), 1);
  const size_t d = size_t((dim + int64_t(v.size())) % int64_t(v.size()));
  s[d] = v[d];
  return s;
}

}  // namespace

TEST(WeightNorm, IsTheCompositionOfOps) {
  const std::vector<std::pair<Shape, int64_t>> cases = {{{3, 4, 5}, 0}, {{3, 4, 5}, 1}, {{3, 4, 5}, 2}, {{3, 4, 5}, -1},
                                                        {{7}, 0},       {{6, 9}, 0},    {{6, 9}, 1}};
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (const auto& [shape, dim] : cases) {
      SCOPED_TRACE(engine::str(engine::dtype_name(dt), " v ", engine::shape_str(shape), " dim ", dim));
      engine::manual_seed(11);
      Tensor v64 = ops::rand(shape, -2, 2, DType::f64),
             g64 = ops::rand(channel_shape(shape, dim), 0.5, 1.5, DType::f64);
      Tensor up64 = ops::rand(shape, -1, 1, DType::f64);
      // The reference in f64 from the same (rounded) inputs.
      Tensor v = ops::to(v64, dt).set_requires_grad(true), g = ops::to(g64, dt).set_requires_grad(true);
      Tensor up = ops::to(up64, dt);
      Tensor vr = ops::to(v.detach(), DType::f64).set_requires_grad(true);
      Tensor gr = ops::to(g.detach(), DType::f64).set_requires_grad(true);
      Tensor want = weight_norm_composition(vr, gr, dim);
      std::vector<Tensor> want_grads = graph::grad({want}, {vr, gr}, {ops::to(up, DType::f64)});
      Tensor got = ops::weight_norm(v, g, dim);
      EXPECT_EQ(got.dtype(), dt);
      EXPECT_EQ(got.shape(), shape);
      std::vector<Tensor> got_grads = graph::grad({got}, {v, g}, {up});
      // f64: rounding only; f32 / bf16: the output's rounding and the float sums' (relative to the largest value).
      const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-5 : 2e-2;
      auto expect_close = [&](const Tensor& a, const Tensor& b, const char* what) {
        std::vector<double> x = ops::to(a, DType::f64).to_double(), y = b.to_double();
        double scale = 1;  // inputs are of order 1 (a 1-d v's dv is 0 but for the float sums' cancellation)
        for (double e : y) scale = std::max(scale, std::abs(e));
        for (size_t i = 0; i < y.size(); i++) ASSERT_NEAR(x[i], y[i], tol * scale) << what << " at " << i;
      };
      expect_close(got, want, "w");
      expect_close(got_grads[0], want_grads[0], "dv");
      expect_close(got_grads[1], want_grads[1], "dg");
    }
  }
}

TEST(WeightNorm, GradAndDoubleBackward) {
  for (int64_t dim : {0, 1, 2}) {
    SCOPED_TRACE(dim);
    Tensor v = rand_input({2, 3, 4}, -2, 2), g = rand_input(channel_shape({2, 3, 4}, dim), 0.5, 1.5);
    testutil::Fn f = [dim](const std::vector<Tensor>& in) { return ops::weight_norm(in[0], in[1], dim); };
    testutil::expect_gradcheck(f, {v, g});
    testutil::expect_double_backward(f, {v, g});
  }
}

TEST(WeightNorm, ErrorsNameTheArgument) {
  try {
    ops::weight_norm(ops::ones({3, 4, 5}), ops::ones({1, 4, 1}), 2);
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    const std::string msg = e.what();
    for (const char* part : {"weight_norm", "g [1, 4, 1]", "[1, 1, 5]", "[3, 4, 5]", "dimension but 2"})
      EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
  EXPECT_THROW(ops::weight_norm(ops::ones({3, 4}), ops::ones({3, 1}), 2), engine::Error);  // no dimension 2
  EXPECT_THROW(ops::weight_norm(ops::ones({3, 4}), ops::ones({3, 1}, DType::f64), 0), engine::Error);
  EXPECT_THROW(ops::weight_norm(ops::ones({3, 4}, DType::i64), ops::ones({3, 1}, DType::i64), 0), engine::Error);
}

TEST(WeightNorm, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    // The one-pass layouts, columns (dim last) and rows (dim 0): no workspace; a middle dim: the split sums'.
    Tensor v = ops::rand({2, 2048, 24}).set_requires_grad(true), g = ops::ones({1, 1, 24}).set_requires_grad(true);
    Tensor w = ops::weight_norm(v, g, 2);
    graph::backward(ops::sum(ops::mul(w, w)));
    Tensor v0 = ops::rand({8, 20000}).set_requires_grad(true), g0 = ops::ones({8, 1}).set_requires_grad(true);
    graph::backward(ops::sum(ops::weight_norm(v0, g0, 0)));
    ASSERT_TRUE(ops::weight_norm_one_pass(v.shape(), 2) && ops::weight_norm_one_pass(v0.shape(), 0));
    Tensor v1 = ops::rand({64, 4, 256}).set_requires_grad(true), g1 = ops::ones({1, 4, 1}).set_requires_grad(true);
    ASSERT_FALSE(ops::weight_norm_one_pass(v1.shape(), 1));
    ASSERT_TRUE(ops::sum_workspace(v1, {true, false, true}, 4).defined());  // the split path allocates
    graph::backward(ops::sum(ops::weight_norm(v1, g1, 1)));
  });
}
