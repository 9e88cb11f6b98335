// matmul_test.cpp: matmul / bmm / linear against naive triple loops, strided operands without copies,
// gradients and second derivatives against finite differences, shape errors, FLOPs, meta allocations.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "engine/allocator.h"
#include "engine/counters.h"
#include "engine/rng.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/view.h"
#include "tests/util/error_util.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::rand_input;

namespace {

using testutil::error_of;

// a [..., M, K] @ b [..., K, N] with NumPy batch broadcasting, as plain loops over the values in row-major
// order. Returns the values; `shape` receives the result's shape.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, Shape& shape) {
  std::vector<double> av = a.to_double(), bv = b.to_double();
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  size_t nd = std::max(ba.size(), bb.size());
  ba.insert(ba.begin(), nd - ba.size(), 1);
  bb.insert(bb.begin(), nd - bb.size(), 1);
  Shape batch(nd);
  for (size_t d = 0; d < nd; d++) batch[d] = std::max(ba[d], bb[d]);
  std::vector<double> out;
  for (int64_t n = 0; n < engine::numel_of(batch); n++) {
    int64_t rest = n, ia = 0, ib = 0, sa = 1, sb = 1;  // flat batch index of a and b
    for (int64_t d = int64_t(nd) - 1; d >= 0; d--) {
      int64_t i = rest % batch[d];
      rest /= batch[d];
      ia += (ba[d] == 1 ? 0 : i) * sa;
      ib += (bb[d] == 1 ? 0 : i) * sb;
      sa *= ba[d];
      sb *= bb[d];
    }
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) s += av[(ia * M + i) * K + k] * bv[(ib * K + k) * N + j];
        out.push_back(s);
      }
  }
  shape = batch;
  shape.push_back(M);
  shape.push_back(N);
  return out;
}

void expect_matches_naive(const Tensor& a, const Tensor& b, double tol) {
  Shape shape;
  std::vector<double> want = naive_matmul(a, b, shape);
  Tensor got = ops::matmul(a, b);
  ASSERT_EQ(got.shape(), shape);
  std::vector<double> g = got.to_double();
  for (size_t i = 0; i < want.size(); i++) ASSERT_NEAR(g[i], want[i], tol) << "element " << i;
}

}  // namespace

TEST(Matmul, TwoDimensionalMatchesNaive) {
  for (DType t : {DType::f64, DType::f32}) {
    Tensor a = ops::rand({5, 7}, -1, 1, t), b = ops::rand({7, 3}, -1, 1, t);
    expect_matches_naive(a, b, t == DType::f64 ? 1e-12 : 1e-5);
  }
}

TEST(Matmul, BatchDimensionsBroadcast) {
  expect_matches_naive(ops::rand({2, 1, 3, 4}, -1, 1, DType::f64), ops::rand({3, 4, 5}, -1, 1, DType::f64), 1e-12);
  expect_matches_naive(ops::rand({4, 6}, -1, 1, DType::f64), ops::rand({2, 6, 3}, -1, 1, DType::f64), 1e-12);
}

TEST(Matmul, StridedOperands) {
  // Transposed views (one unit stride) are mapped without a copy: the op allocates only its output.
  Tensor at = ops::transpose(ops::rand({6, 4}, -1, 1, DType::f64), 0, 1);  // [4, 6], strides [1, 4]
  Tensor bt = ops::transpose(ops::rand({3, 6}, -1, 1, DType::f64), 0, 1);  // [6, 3], strides [1, 6]
  auto& ledger = engine::default_device()->ledger();
  int64_t before = ledger.alloc_count();
  Tensor out = ops::matmul(at, bt);
  EXPECT_EQ(ledger.alloc_count() - before, 1);
  expect_matches_naive(at, bt, 1e-12);
  // No unit stride at all (a step in both dimensions): packed by the kernel, same values.
  Tensor big = ops::rand({8, 12}, -1, 1, DType::f64);
  Tensor stepped = ops::slice(ops::slice(big, 0, 0, 8, 2), 1, 0, 12, 2);  // [4, 6]
  expect_matches_naive(stepped, bt, 1e-12);
  // A batch dimension broadcast by a stride-0 view.
  Tensor bb = ops::broadcast_to(ops::rand({6, 3}, -1, 1, DType::f64), {2, 6, 3});
  expect_matches_naive(ops::rand({2, 4, 6}, -1, 1, DType::f64), bb, 1e-12);
}

TEST(Matmul, VectorOperands) {
  Tensor v = ops::rand({4}, -1, 1, DType::f64), m = ops::rand({4, 3}, -1, 1, DType::f64);
  Tensor bm = ops::rand({2, 5, 4}, -1, 1, DType::f64);
  EXPECT_EQ(ops::matmul(v, v).shape(), Shape{});
  EXPECT_EQ(ops::matmul(v, m).shape(), (Shape{3}));
  EXPECT_EQ(ops::matmul(bm, v).shape(), (Shape{2, 5}));
  std::vector<double> vv = v.to_double();
  double dot = 0;
  for (double x : vv) dot += x * x;
  EXPECT_NEAR(ops::matmul(v, v).item(), dot, 1e-12);
  Shape s;
  std::vector<double> want = naive_matmul(ops::reshape(v, {1, 4}), m, s);
  std::vector<double> got = ops::matmul(v, m).to_double();
  for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got[i], want[i], 1e-12);
}

TEST(Matmul, Bf16AgreesWithF32WithinRounding) {
  Tensor a = ops::rand({8, 16}, -1, 1), b = ops::rand({16, 8}, -1, 1);
  Tensor a16 = ops::to(a, DType::bf16), b16 = ops::to(b, DType::bf16);
  // Reference: the same bf16 values multiplied in f32; the bf16 result differs by its final rounding.
  Tensor ref = ops::matmul(ops::to(a16, DType::f32), ops::to(b16, DType::f32));
  Tensor got = ops::matmul(a16, b16);
  EXPECT_EQ(got.dtype(), DType::bf16);
  std::vector<double> r = ref.to_double(), g = got.to_double();
  for (size_t i = 0; i < r.size(); i++) EXPECT_NEAR(g[i], r[i], 1e-2 * std::max(1.0, std::fabs(r[i])));
}

TEST(Matmul, LinearMatchesNaive) {
  Tensor x = ops::rand({2, 3, 4}, -1, 1, DType::f64);
  Tensor w = ops::rand({5, 4}, -1, 1, DType::f64), b = ops::rand({5}, -1, 1, DType::f64);
  std::vector<double> xv = x.to_double(), wv = w.to_double(), bv = b.to_double();
  auto check = [&](const Tensor& y, bool with_bias) {
    ASSERT_EQ(y.shape(), (Shape{2, 3, 5}));
    std::vector<double> yv = y.to_double();
    for (int r = 0; r < 6; r++)
      for (int o = 0; o < 5; o++) {
        double s = with_bias ? bv[o] : 0.0;
        for (int i = 0; i < 4; i++) s += xv[r * 4 + i] * wv[o * 4 + i];
        EXPECT_NEAR(yv[r * 5 + o], s, 1e-12);
      }
  };
  check(ops::linear(x, w, b), true);
  check(ops::linear(x, w), false);
  // A non-contiguous x (same values) gives the same result.
  Tensor xt = ops::transpose(ops::contiguous(ops::transpose(x, 0, 1)), 0, 1);
  ASSERT_FALSE(xt.is_contiguous());
  check(ops::linear(xt, w, b), true);
  // Contiguous x: the output is the op's only allocation (bias folded into the GEMM, W^T not copied).
  auto& ledger = engine::default_device()->ledger();
  int64_t before = ledger.alloc_count();
  Tensor y = ops::linear(x, w, b);
  EXPECT_EQ(ledger.alloc_count() - before, 1);
}

TEST(Matmul, FlopsAreTwoMNK) {
  engine::counters().reset();
  ops::matmul(ops::zeros({2, 3, 4}), ops::zeros({4, 5}));
  EXPECT_DOUBLE_EQ(engine::counters().by_op["matmul"].flops, 2.0 * 2 * 3 * 5 * 4);
  ops::linear(ops::zeros({6, 4}), ops::zeros({7, 4}), ops::zeros({7}));
  EXPECT_DOUBLE_EQ(engine::counters().by_op["linear"].flops, 2.0 * 6 * 7 * 4);
}

TEST(Matmul, GradAndDoubleBackward) {
  struct Case {
    const char* name;
    Shape a, b;
  };
  std::vector<Case> cases = {{"2d", {3, 4}, {4, 2}},          {"batched broadcast", {2, 1, 2, 3}, {3, 3, 2}},
                             {"matrix x batch", {2, 3}, {2, 3, 2}}, {"vector x matrix", {3}, {3, 2}},
                             {"batch x vector", {2, 2, 3}, {3}},    {"dot", {4}, {4}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor a = rand_input(c.a), b = rand_input(c.b);
    testutil::Fn f = [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); };
    testutil::expect_gradcheck(f, {a, b});
    testutil::expect_double_backward(f, {a, b});
  }
  // Transposed operands go through the same rule.
  Tensor a = rand_input({4, 3}), b = rand_input({2, 4});
  testutil::Fn ft = [](const std::vector<Tensor>& in) {
    return ops::matmul(ops::transpose(in[0], 0, 1), ops::transpose(in[1], 0, 1));
  };
  testutil::expect_gradcheck(ft, {a, b});
  testutil::expect_double_backward(ft, {a, b});
  Tensor p = rand_input({2, 3, 4}), q = rand_input({2, 4, 2});
  testutil::Fn fb = [](const std::vector<Tensor>& in) { return ops::bmm(in[0], in[1]); };
  testutil::expect_gradcheck(fb, {p, q});
}

TEST(Matmul, LinearGradAndDoubleBackward) {
  Tensor x = rand_input({2, 3, 4}), w = rand_input({5, 4}), b = rand_input({5});
  testutil::Fn f = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); };
  testutil::expect_gradcheck(f, {x, w, b});
  testutil::expect_double_backward(f, {x, w, b});
  // Nonlinear in the output so that second derivatives mix x and W.
  testutil::Fn sq = [](const std::vector<Tensor>& in) {
    Tensor y = ops::linear(in[0], in[1]);
    return ops::mul(y, y);
  };
  testutil::expect_gradcheck(sq, {x, w});
  testutil::expect_double_backward(sq, {x, w});
  Tensor v = rand_input({4});  // a single row
  testutil::expect_gradcheck(f, {v, w, b});
}

TEST(Matmul, WideUnalignedLinearRunsPaddedAndStaysExact) {
  // 1025 outputs of bf16: the product runs on W with zero rows up to 1032 (16-byte rows), the result is a view of
  // the first 1025 columns. Its values, gradients and second derivatives are those of the same product written
  // unpadded (matmul + add: the zero terms add nothing).
  auto inputs = [] {
    engine::manual_seed(3);
    return std::vector<Tensor>{ops::rand({2, 3, 16}, -1, 1, DType::bf16).set_requires_grad(true),
                               ops::rand({1025, 16}, -1, 1, DType::bf16).set_requires_grad(true),
                               ops::rand({1025}, -1, 1, DType::bf16).set_requires_grad(true)};
  };
  auto run = [&](bool padded) {
    std::vector<Tensor> in = inputs();
    Tensor y = padded ? ops::linear(in[0], in[1], in[2])
                      : ops::add(ops::matmul(in[0], ops::transpose(in[1], 0, 1)), in[2]);
    if (padded) {
      EXPECT_EQ(y.strides(), (Shape{3 * 1032, 1032, 1}));
    }
    // Second order: the gradient of sum(y^2) wrt x, differentiated again wrt W.
    Tensor gx = graph::grad({ops::sum(ops::mul(y, y))}, {in[0]}, {}, /*create_graph=*/true)[0];
    std::vector<Tensor> out = graph::grad({ops::sum(ops::mul(gx, gx))}, {in[1], in[2]});
    out.insert(out.begin(), {y, gx});
    return out;
  };
  std::vector<Tensor> want = run(false), got = run(true);
  const char* names[] = {"y", "d sum(y^2) / dx", "second order wrt W", "second order wrt b"};
  for (size_t i = 0; i < want.size(); i++) {
    std::vector<double> w = ops::to(want[i], DType::f64).to_double(), g = ops::to(got[i], DType::f64).to_double();
    ASSERT_EQ(w.size(), g.size()) << names[i];
    double scale = 0;
    for (double v : w) scale = std::max(scale, std::fabs(v));
    for (size_t k = 0; k < w.size(); k++) ASSERT_NEAR(g[k], w[k], 1e-2 * scale) << names[i] << " element " << k;
  }
  // Aligned, narrow or 32-bit outputs are not padded.
  Tensor x = ops::rand({2, 16}, -1, 1, DType::bf16);
  EXPECT_TRUE(ops::linear(x, ops::rand({1024, 16}, -1, 1, DType::bf16)).is_contiguous());
  EXPECT_TRUE(ops::linear(x, ops::rand({5, 16}, -1, 1, DType::bf16)).is_contiguous());
  EXPECT_TRUE(ops::linear(ops::rand({2, 16}), ops::rand({1025, 16})).is_contiguous());
}

TEST(Matmul, StackedLinearIsTheLinearsSideBySide) {
  // linear(x, {W1, W2, W3}, {b1, b2, b3}) = [linear(x, W1, b1), linear(x, W2, b2), linear(x, W3, b3)] along the last
  // dimension, in values and in every gradient; each weight's gradient is a view of one product's rows.
  engine::manual_seed(5);
  Tensor x = rand_input({2, 3, 4});
  std::vector<Tensor> ws = {rand_input({5, 4}), rand_input({3, 4}), rand_input({2, 4})};
  std::vector<Tensor> bs = {rand_input({5}), rand_input({3}), rand_input({2})};
  Tensor g = ops::rand({2, 3, 10}, -1, 1, DType::f64);
  Tensor stacked = ops::linear(x, ws, bs);
  ASSERT_EQ(stacked.shape(), (Shape{2, 3, 10}));
  std::vector<Tensor> inputs = {x, ws[0], ws[1], ws[2], bs[0], bs[1], bs[2]};
  std::vector<Tensor> got = graph::grad({stacked}, inputs, {g});
  Tensor separate =
      ops::concat({ops::linear(x, ws[0], bs[0]), ops::linear(x, ws[1], bs[1]), ops::linear(x, ws[2], bs[2])}, -1);
  EXPECT_LT(testutil::max_abs_diff(stacked, separate), 1e-12);
  std::vector<Tensor> want = graph::grad({separate}, inputs, {g});
  for (size_t i = 0; i < inputs.size(); i++) EXPECT_LT(testutil::max_abs_diff(got[i], want[i]), 1e-12) << "input " << i;
  EXPECT_EQ(got[2].data_ptr(), static_cast<const char*>(got[1].data_ptr()) + 5 * 4 * sizeof(double))
      << "W2's gradient: rows 5..7 of the stack's";
  testutil::Fn f = [](const std::vector<Tensor>& in) {
    Tensor y = ops::linear(in[0], {in[1], in[2]}, {in[3], in[4]});
    return ops::mul(y, y);  // nonlinear, so that second derivatives mix x and the weights
  };
  testutil::expect_gradcheck(f, {x, ws[0], ws[1], bs[0], bs[1]});
  testutil::expect_double_backward(f, {x, ws[0], ws[1], bs[0], bs[1]});
}

TEST(Matmul, StackedLinearKeepsNoStack) {
  // The stack of the weights is a temporary: after the forward only the result is new, and the gradients are those of
  // the separate products (here bf16, 3 x 343 = 1029 outputs: stacked and padded to 1032 in one temporary).
  auto meta = engine::Device::create(engine::DeviceType::meta, size_t(1) << 30);
  engine::DeviceGuard guard(meta);
  Tensor x = ops::zeros({6, 16}, DType::bf16).set_requires_grad(true);
  std::vector<Tensor> ws, bs;
  for (int i = 0; i < 3; i++) {
    ws.push_back(ops::zeros({343, 16}, DType::bf16).set_requires_grad(true));
    bs.push_back(ops::zeros({343}, DType::bf16).set_requires_grad(true));
  }
  auto new_bytes = [&](const std::function<Tensor()>& f) {
    const size_t before = meta->ledger().live_bytes();
    Tensor y = f();
    return meta->ledger().live_bytes() - before;
  };
  Tensor wide = ops::zeros({1029, 16}, DType::bf16), wide_bias = ops::zeros({1029}, DType::bf16);
  new_bytes([&] { return ops::linear(x, wide, wide_bias); });  // the GEMM workspace, reserved once
  const size_t one_weight = new_bytes([&] { return ops::linear(x, wide, wide_bias); });
  EXPECT_EQ(new_bytes([&] { return ops::linear(x, ws, bs); }), one_weight) << "only the result stays";
  Tensor y = ops::linear(x, ws, bs);
  EXPECT_EQ(y.shape(), (Shape{6, 1029}));
  EXPECT_EQ(y.strides(), (Shape{1032, 1}));
  graph::backward(ops::sum(y));
  for (const Tensor& w : ws) EXPECT_EQ(w.grad().shape(), (Shape{343, 16}));
  for (const Tensor& b : bs) EXPECT_EQ(b.grad().shape(), (Shape{343}));
}

TEST(Matmul, StackedWeightsKeepTheirGradientsInOneBlock) {
  // After backward each stacked weight's (and bias's) gradient is its rows of the one dW (db) product, not a copy:
  // one block of category grad, named after the weights' common module, freed when the last gradient goes.
  auto meta = engine::Device::create(engine::DeviceType::meta, size_t(1) << 30);
  engine::DeviceGuard guard(meta);
  Tensor x = ops::zeros({6, 16}, DType::bf16);
  std::vector<Tensor> ws, bs;
  for (const char* name : {"attn.query", "attn.key"}) {
    ws.push_back(ops::zeros({32, 16}, DType::bf16).set_requires_grad(true));
    bs.push_back(ops::zeros({32}, DType::bf16).set_requires_grad(true));
    ws.back().storage()->set_owner(std::string(name) + ".weight/param");
    bs.back().storage()->set_owner(std::string(name) + ".bias/param");
  }
  Tensor loss = ops::sum(ops::linear(x, ws, bs));
  graph::backward(loss);
  loss = Tensor();
  for (const std::vector<Tensor>* params : {&ws, &bs}) {
    const Tensor g0 = (*params)[0].grad(), g1 = (*params)[1].grad();
    ASSERT_TRUE(g0.defined() && g1.defined());
    EXPECT_EQ(g0.storage(), g1.storage()) << "one block";
    EXPECT_EQ(g1.offset() - g0.offset(), g0.numel()) << "rows 32..63 of the stack";
    EXPECT_EQ(g0.storage()->category(), engine::Category::grad);
    EXPECT_EQ(g0.storage()->owner(), "attn/grad");
  }
  const size_t stacks = engine::Allocator::round_up(64 * 16 * 2) + engine::Allocator::round_up(64 * 2);
  EXPECT_EQ(meta->ledger().live_bytes(engine::Category::grad), stacks) << "no copies";
  ws[0].set_grad(Tensor());
  bs[0].set_grad(Tensor());
  EXPECT_EQ(meta->ledger().live_bytes(engine::Category::grad), stacks) << "the other gradients still use the blocks";
  ws[1].set_grad(Tensor());
  bs[1].set_grad(Tensor());
  EXPECT_EQ(meta->ledger().live_bytes(engine::Category::grad), 0u);
}

TEST(Matmul, LinearAddsItsDxIntoAPendingGradientInPlace) {
  // h feeds a linear and, after it, a residual-like branch (h * 3): backward runs the branch first, and the linear's
  // rule adds g W into h's pending gradient in place (graph::pending_gradient): the values of the two gradients
  // summed, with no add op and one gradient buffer fewer. f64 against the sum written out, bf16 within rounding.
  for (DType t : {DType::f64, DType::bf16}) {
    SCOPED_TRACE(engine::dtype_name(t));
    engine::manual_seed(3);
    Tensor x = ops::to(ops::randn({2, 3, 8}), t).set_requires_grad(true);
    Tensor w = ops::to(ops::randn({5, 8}), t).set_requires_grad(true);
    Tensor c = ops::to(ops::randn({2, 3, 5}), t), d = ops::to(ops::randn({2, 3, 8}), t);
    Tensor h = ops::mul(x, 2.0);  // not a leaf: its node's buffer collects both gradients
    Tensor y = ops::linear(h, w, Tensor());
    Tensor branch = ops::mul(h, 3.0);  // recorded after the linear: its gradient reaches h first
    Tensor loss = ops::add(ops::sum(ops::mul(y, c)), ops::sum(ops::mul(branch, d)));
    engine::counters().reset();
    graph::backward(loss);
    EXPECT_EQ(engine::counters().by_op["add"].calls, 0) << "h's two gradients summed by a separate add";
    // dx = 2 (c W + 3 d)
    const std::vector<double> cv = c.to_double(), wv = w.to_double(), dv = d.to_double(), gx = x.grad().to_double();
    double worst = 0;
    for (int64_t r = 0; r < 6; r++)
      for (int64_t k = 0; k < 8; k++) {
        double want = 3 * dv[size_t(r * 8 + k)];
        for (int64_t o = 0; o < 5; o++) want += cv[size_t(r * 5 + o)] * wv[size_t(o * 8 + k)];
        worst = std::max(worst, std::fabs(gx[size_t(r * 8 + k)] - 2 * want));
      }
    EXPECT_LE(worst, t == DType::f64 ? 1e-12 : 0.1);
  }
  // Meta takes the in-place path exactly as the cpu does (the condition is the graph's, not the device's).
  testutil::expect_meta_allocates_like_cpu([] {
    engine::manual_seed(4);
    Tensor x = ops::rand({4, 6}).set_requires_grad(true), w = ops::rand({3, 6}).set_requires_grad(true);
    Tensor h = ops::mul(x, 2.0);
    Tensor y = ops::linear(h, w, Tensor());
    Tensor branch = ops::mul(h, h);
    graph::backward(ops::add(ops::sum(y), ops::sum(branch)));
  });
}

TEST(Matmul, LinearReluIsReluOfLinear) {
  // linear(x, W, b, relu) = relu(linear(x, W, b)) in values and gradients (f64: the same products, so equal), for
  // one weight, stacked weights and no bias; its own gradcheck and double backward.
  engine::manual_seed(8);
  Tensor x = rand_input({2, 3, 4});
  std::vector<Tensor> ws = {rand_input({5, 4}), rand_input({3, 4})}, bs = {rand_input({5}), rand_input({3})};
  const ops::Activation relu = ops::Activation::relu;
  struct Case {
    const char* name;
    std::function<Tensor(ops::Activation)> run;
  };
  const std::vector<Case> cases = {{"one weight", [&](ops::Activation a) { return ops::linear(x, ws[0], bs[0], a); }},
                                   {"no bias", [&](ops::Activation a) { return ops::linear(x, ws[0], Tensor(), a); }},
                                   {"stacked", [&](ops::Activation a) { return ops::linear(x, ws, bs, a); }}};
  const std::vector<Tensor> inputs = {x, ws[0], ws[1], bs[0], bs[1]};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor fused = c.run(relu), separate = ops::relu(c.run(ops::Activation::none));
    EXPECT_EQ(fused.to_double(), separate.to_double());
    Tensor g = ops::rand(fused.shape(), -1, 1, DType::f64);
    std::vector<Tensor> got = graph::grad({fused}, inputs, {g}), want = graph::grad({separate}, inputs, {g});
    for (size_t i = 0; i < inputs.size(); i++) {
      ASSERT_EQ(got[i].defined(), want[i].defined()) << "input " << i;
      if (want[i].defined()) {
        EXPECT_EQ(got[i].to_double(), want[i].to_double()) << "input " << i;
      }
    }
  }
  testutil::Fn f = [](const std::vector<Tensor>& in) {
    Tensor y = ops::linear(in[0], in[1], in[2], ops::Activation::relu);
    return ops::mul(y, y);  // nonlinear, so that second derivatives mix x and W
  };
  testutil::expect_gradcheck(f, {x, ws[0], bs[0]});
  testutil::expect_double_backward(f, {x, ws[0], bs[0]});
}

TEST(Matmul, LinearReluNeverMakesThePreActivation) {
  // The fused op leaves only its result alive (saved for backward, as the next layer saves it too); relu after a
  // linear made the pre-activation first, so its peak held both.
  auto meta = engine::Device::create(engine::DeviceType::meta, size_t(1) << 30);
  engine::DeviceGuard guard(meta);
  Tensor x = ops::zeros({64, 16}, DType::bf16).set_requires_grad(true);
  Tensor w = ops::zeros({256, 16}, DType::bf16).set_requires_grad(true), b = ops::zeros({256}, DType::bf16);
  const size_t y_bytes = 64 * 256 * 2;
  ops::linear(x, w, b);  // the GEMM workspace, reserved once
  auto measure = [&](const std::function<Tensor()>& f) {
    meta->ledger().reset_peak();
    const size_t before = meta->ledger().live_bytes();
    Tensor y = f();
    return std::make_pair(meta->ledger().live_bytes() - before, meta->ledger().peak_bytes() - before);
  };
  EXPECT_EQ(measure([&] { return ops::linear(x, w, b, ops::Activation::relu); }), std::make_pair(y_bytes, y_bytes));
  EXPECT_EQ(measure([&] { return ops::relu(ops::linear(x, w, b)); }), std::make_pair(y_bytes, 2 * y_bytes));
}

TEST(Matmul, ShapeErrorsNameTheShapes) {
  Tensor a = ops::zeros({2, 3}), b = ops::zeros({4, 5});
  std::string e = error_of([&] { ops::matmul(a, b); });
  EXPECT_NE(e.find("matmul"), std::string::npos);
  EXPECT_NE(e.find("[2, 3]"), std::string::npos);
  EXPECT_NE(e.find("[4, 5]"), std::string::npos);
  e = error_of([] { ops::matmul(ops::zeros({2, 2, 3}), ops::zeros({3, 3, 4})); });
  EXPECT_NE(e.find("batch"), std::string::npos) << e;
  EXPECT_NE(error_of([] { ops::matmul(ops::zeros({2, 3}), ops::zeros({3, 2}, DType::f64)); }), "");
  EXPECT_NE(error_of([] { ops::bmm(ops::zeros({2, 2, 3}), ops::zeros({3, 3, 4})); }).find("bmm"), std::string::npos);
  e = error_of([] { ops::linear(ops::zeros({2, 3}), ops::zeros({5, 4})); });
  EXPECT_NE(e.find("linear"), std::string::npos);
  EXPECT_NE(e.find("[5, 4]"), std::string::npos);
  e = error_of([] { ops::linear(ops::zeros({2, 4}), ops::zeros({5, 4}), ops::zeros({4})); });
  EXPECT_NE(e.find("bias"), std::string::npos);
  e = error_of([] { ops::linear(ops::zeros({2, 4}), {ops::zeros({5, 4}), ops::zeros({5, 3})}, {}); });
  EXPECT_NE(e.find("every stacked weight"), std::string::npos) << e;
  e = error_of([] { ops::linear(ops::zeros({2, 4}), {ops::zeros({5, 4}), ops::zeros({5, 4})}, {ops::zeros({5})}); });
  EXPECT_NE(e.find("one bias per weight"), std::string::npos) << e;
  EXPECT_NE(error_of([] {
              ops::linear(ops::zeros({2, 4}), std::vector<Tensor>{}, {});
            }).find("no weight"),
            std::string::npos);
}

TEST(Matmul, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor a = ops::rand({2, 3, 4}).set_requires_grad(true);
    Tensor b = ops::rand({4, 5}).set_requires_grad(true);
    Tensor w = ops::rand({6, 5}).set_requires_grad(true), bias = ops::rand({6}).set_requires_grad(true);
    Tensor y = ops::linear(ops::matmul(a, b), w, bias);
    graph::backward(ops::sum(y));
    // A padded (wide, unaligned) linear: its temporaries too.
    Tensor x = ops::rand({3, 8}, -1, 1, DType::bf16).set_requires_grad(true);
    Tensor wide = ops::rand({1030, 8}, -1, 1, DType::bf16).set_requires_grad(true);
    Tensor wide_bias = ops::rand({1030}, -1, 1, DType::bf16).set_requires_grad(true);
    graph::backward(ops::sum(ops::linear(x, wide, wide_bias)));
    // Stacked weights: the stack made in forward and again in backward.
    Tensor w2 = ops::rand({3, 5}).set_requires_grad(true), b2 = ops::rand({3}).set_requires_grad(true);
    graph::backward(ops::sum(ops::linear(ops::matmul(a, b), {w, w2}, {bias, b2})));
    // relu in the epilogue: the result saved, relu's gradient made in backward.
    graph::backward(ops::sum(ops::linear(ops::matmul(a, b), w, bias, ops::Activation::relu)));
  });
}
