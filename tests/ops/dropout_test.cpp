// dropout_test.cpp: dropout's keep mask against the Philox draws it is defined by, its fraction, its
// regeneration from (seed, offset), a backward that saves nothing, gradient checks with a fixed generator
// state, recomputation, errors, meta allocations and reservations.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/rng.h"
#include "graph/autograd.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/view.h"
#include "tests/util/dropout_reference.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::rand_input;

namespace {

// Element i of a dropout drawn at (seed, offset), from the definition.
double expected_dropout(double x, double p, uint64_t seed, uint64_t offset, uint64_t i) {
  return testutil::dropout_reference(x, p, seed, offset, i);
}

}  // namespace

TEST(Dropout, KeepsAboutOneMinusPAndScales) {
  engine::manual_seed(1234);
  const double p = 0.3;
  Tensor y = ops::dropout(ops::ones({100000}), p, true);
  std::vector<double> v = y.to_double();
  int64_t dropped = 0;
  for (double e : v) {
    if (e == 0)
      dropped++;
    else
      EXPECT_NEAR(e, 1 / (1 - p), 1e-4);  // 1 / (1 - p_q), p_q = p rounded up to a multiple of 2^-16
  }
  EXPECT_NEAR(double(dropped) / double(v.size()), p, 0.01);
}

TEST(Dropout, MatchesPhiloxDrawsAndRegenerates) {
  engine::manual_seed(7);
  ops::rand({3});  // move the generator off offset 0
  const uint64_t seed = engine::generator().seed;
  const double p = 0.5;
  Tensor x = ops::rand({4, 6}, -1, 1, DType::f64);
  const uint64_t after_x = engine::generator().offset;
  Tensor y = ops::dropout(x, p, true);
  EXPECT_EQ(engine::generator().offset, after_x + 12);  // numel / 2 numbers reserved: two 16-bit draws each
  std::vector<double> xv = x.to_double(), yv = y.to_double();
  for (size_t i = 0; i < xv.size(); i++) EXPECT_DOUBLE_EQ(yv[i], expected_dropout(xv[i], p, seed, after_x, i));
  // The same (seed, offset) gives the same mask: through dropout_mask_apply, and through dropout again.
  EXPECT_EQ(ops::dropout_mask_apply(x, p, seed, after_x).to_double(), yv);
  engine::generator() = engine::Generator{seed, after_x};
  EXPECT_EQ(ops::dropout(x, p, true).to_double(), yv);
  // A non-contiguous input: element i is the i-th in row-major order of the view.
  Tensor xt = ops::transpose(x, 0, 1);  // [6, 4]
  const uint64_t at = engine::generator().offset;
  std::vector<double> xtv = xt.to_double(), ytv = ops::dropout(xt, p, true).to_double();
  for (size_t i = 0; i < xtv.size(); i++) EXPECT_DOUBLE_EQ(ytv[i], expected_dropout(xtv[i], p, seed, at, i));
}

TEST(Dropout, IdentityWhenNotTrainingOrPZero) {
  Tensor x = ops::rand({5});
  const uint64_t offset = engine::generator().offset;
  auto& ledger = engine::default_device()->ledger();
  int64_t before = ledger.alloc_count();
  EXPECT_EQ(ops::dropout(x, 0.0, true).impl(), x.impl());
  EXPECT_EQ(ops::dropout(x, 0.5, false).impl(), x.impl());
  EXPECT_EQ(ledger.alloc_count(), before);
  EXPECT_EQ(engine::generator().offset, offset);
}

TEST(Dropout, BackwardIsTheRegeneratedMaskTimesGAndSavesNothing) {
  engine::manual_seed(99);
  const double p = 0.4;
  Tensor x = rand_input({3, 5});
  const uint64_t seed = engine::generator().seed, offset = engine::generator().offset;
  Tensor y = ops::dropout(x, p, true);
  ASSERT_TRUE(y.grad_fn());
  EXPECT_TRUE(y.grad_fn()->saved_tensors.empty()) << "dropout must not save a mask";
  Tensor g = ops::rand({3, 5}, -1, 1, DType::f64);
  graph::backward(y, g);
  std::vector<double> gv = g.to_double(), gx = x.grad().to_double();
  for (size_t i = 0; i < gv.size(); i++) EXPECT_DOUBLE_EQ(gx[i], expected_dropout(gv[i], p, seed, offset, i));
}

TEST(Dropout, GradAndDoubleBackwardWithFixedGenerator) {
  engine::manual_seed(5);
  const engine::Generator start = engine::generator();
  Tensor x = rand_input({3, 4});
  // Every evaluation draws the same mask: the generator is reset before each call.
  testutil::Fn f = [start](const std::vector<Tensor>& in) {
    engine::generator() = start;
    return ops::dropout(ops::mul(in[0], in[0]), 0.5, true);
  };
  testutil::expect_gradcheck(f, {x});
  testutil::expect_double_backward(f, {x});
  Tensor g = rand_input({3, 4});
  testutil::Fn m = [](const std::vector<Tensor>& in) { return ops::dropout_mask_apply(in[0], 0.25, 11, 8); };
  testutil::expect_gradcheck(m, {g});
  testutil::expect_double_backward(m, {g});
}

TEST(Dropout, RecomputeReplaysTheSameMask) {
  engine::manual_seed(3);
  Tensor x = rand_input({4, 4});
  auto fn = [](const std::vector<Tensor>& in) { return ops::dropout(ops::tanh(in[0]), 0.5, true); };
  const engine::Generator start = engine::generator();
  Tensor direct = graph::grad({ops::sum(fn({x}))}, {x})[0];
  engine::generator() = start;
  Tensor replayed = graph::grad({ops::sum(graph::recompute(fn, {x}))}, {x})[0];
  EXPECT_EQ(direct.to_double(), replayed.to_double());
}

TEST(Dropout, Errors) {
  try {
    ops::dropout(ops::ones({3}), 1.5, true);
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("dropout"), std::string::npos);
    EXPECT_NE(msg.find("1.5"), std::string::npos);
  }
  EXPECT_THROW(ops::dropout(ops::ones({3}), -0.1, true), engine::Error);
  EXPECT_THROW(ops::dropout(ops::ones({3}, DType::i64), 0.5, true), engine::Error);
}

TEST(Dropout, MetaAllocatesAndReservesLikeCpu) {
  uint64_t reserved[2];
  int k = 0;
  testutil::expect_meta_allocates_like_cpu([&] {
    engine::manual_seed(0);
    Tensor x = ops::rand({4, 8}).set_requires_grad(true);
    graph::backward(ops::sum(ops::dropout(ops::dropout(x, 0.1, true), 0.2, true)));
    reserved[k++] = engine::generator().offset;
  });
  EXPECT_EQ(reserved[0], reserved[1]);
  EXPECT_EQ(reserved[0], 32u + 2 * 16u);  // rand (a number per element) + two dropouts (one per 2 elements)
}

// Drop path: sample n of x (all its elements) is kept iff dropout draw n keeps it at p = 1 - keep_prob, then scaled
// by 1 / (1 - p_q); half a number per sample is reserved; backward regenerates it and saves nothing.
TEST(DropPath, WholeSamplesAreKeptOrDroppedFromTheirOneDraw) {
  engine::manual_seed(7);
  const double keep = 0.7;
  const Shape xs = {400, 3, 2, 5};
  Tensor x = ops::rand(xs, 0.5, 1.5, DType::f64).set_requires_grad(true);
  const uint64_t seed = engine::generator().seed, offset = engine::generator().offset;
  Tensor y = ops::drop_path(x, keep, true);
  EXPECT_EQ(engine::generator().offset - offset, 200u) << "a 16-bit draw per sample";
  ASSERT_TRUE(y.grad_fn());
  EXPECT_TRUE(y.grad_fn()->saved_tensors.empty());
  const std::vector<double> xv = x.to_double(), yv = y.to_double();
  const int64_t inner = 3 * 2 * 5;
  int kept = 0;
  for (int64_t n = 0; n < 400; n++) {
    const bool k = testutil::dropout_keeps(seed, offset, uint64_t(n), 1 - keep);
    kept += k;
    for (int64_t j = 0; j < inner; j++) {
      const size_t i = size_t(n * inner + j);
      EXPECT_DOUBLE_EQ(yv[i], k ? xv[i] * testutil::dropout_scale(1 - keep) : 0.0) << "sample " << n;
    }
  }
  EXPECT_NEAR(double(kept) / 400, keep, 0.07);
  Tensor g = ops::rand(xs, -1, 1, DType::f64);
  graph::backward(y, g);
  const std::vector<double> gv = g.to_double(), gx = x.grad().to_double();
  for (size_t i = 0; i < gv.size(); i++) {
    const bool k = testutil::dropout_keeps(seed, offset, uint64_t(int64_t(i) / inner), 1 - keep);
    EXPECT_DOUBLE_EQ(gx[i], k ? gv[i] * testutil::dropout_scale(1 - keep) : 0.0);
  }
  EXPECT_TRUE(ops::drop_path(x, 1.0, true).impl() == x.impl()) << "keep_prob 1: x itself";
  EXPECT_TRUE(ops::drop_path(x, 0.5, false).impl() == x.impl()) << "not training: x itself";
  EXPECT_THROW(ops::drop_path(x, 1.5, true), engine::Error);
}

TEST(DropPath, GradAndDoubleBackwardWithFixedGenerator) {
  engine::manual_seed(11);
  const engine::Generator start = engine::generator();
  Tensor x = rand_input({6, 2, 3});
  testutil::Fn f = [start](const std::vector<Tensor>& in) {
    engine::generator() = start;
    return ops::drop_path(ops::mul(in[0], in[0]), 0.6, true);
  };
  testutil::expect_gradcheck(f, {x});
  testutil::expect_double_backward(f, {x});
}

// StyleGAN's noise input: y - x is the generator's normal draw [N, H, W, 1] times the strength per channel; the node
// keeps nothing and backward draws the same numbers again.
TEST(AddNoise, IsTheGeneratorsDrawTimesTheStrengthAndSavesNothing) {
  using engine::DType;
  Tensor x = testutil::rand_input({2, 3, 4, 5}), s = testutil::rand_input({5}, 0.5, 1.5);
  const engine::Generator at = engine::generator();
  Tensor y = ops::add_noise(x, s);
  const engine::Generator after = engine::generator();
  engine::generator() = at;
  const std::vector<double> n = ops::randn({2, 3, 4, 1}, 0, 1, DType::f64).to_double();
  engine::generator() = after;
  const std::vector<double> xv = x.to_double(), yv = y.to_double(), sv = s.to_double();
  for (size_t i = 0; i < yv.size(); i++) EXPECT_NEAR(yv[i] - xv[i], n[i / 5] * sv[i % 5], 1e-12);
  ASSERT_TRUE(y.grad_fn());
  EXPECT_TRUE(y.grad_fn()->saved_tensors.empty());
  // Gradients against finite differences (the generator rewound before each call, so every call draws the same
  // noise), and again through the backward's own graph.
  testutil::Fn f = [at](const std::vector<Tensor>& in) {
    engine::generator() = at;
    return ops::add_noise(in[0], in[1]);
  };
  testutil::expect_gradcheck(f, {x, s});
  testutil::expect_double_backward(f, {x, s});
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor a = ops::rand({2, 4, 4, 3}).set_requires_grad(true), b = ops::ones({3}).set_requires_grad(true);
    graph::backward(ops::sum(ops::mul(ops::add_noise(a, b), a)));
  });
}
