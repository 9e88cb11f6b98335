// loss_test.cpp: cross-entropy against a log-sum-exp written here (ignore_index, label smoothing, every
// reduction, the all-ignored batch), its gradient against softmax minus the smoothed one-hot, the pointwise
// losses against their formulas, finite-difference first and second derivatives of every loss, errors,
// what cross-entropy saves, and meta allocations equal to cpu.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/reduce.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using ops::Reduction;
using testutil::rand_input;

namespace {

constexpr int64_t kN = 5, kV = 7;
const std::vector<int64_t> kTargets = {3, -100, 0, 6, 3};  // row 1 is ignored

struct Reference {
  std::vector<double> rows;  // per-row loss, 0 on ignored rows
  std::vector<double> dlogits;  // d mean / d logits
  double sum = 0, mean = 0;
};

// Cross-entropy by hand: log-sum-exp with the max subtracted, PyTorch's label smoothing, mean over the
// non-ignored rows; the gradient of the mean is (softmax - q) / count on counted rows.
Reference reference_cross_entropy(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t ignore,
                                  double eps) {
  Reference r;
  r.rows.assign(t.size(), 0.0);
  r.dlogits.assign(x.size(), 0.0);
  int count = 0;
  for (size_t i = 0; i < t.size(); i++) count += t[i] != ignore;
  for (size_t i = 0; i < t.size(); i++) {
    if (t[i] == ignore) continue;
    const double* row = &x[i * kV];
    double m = row[0], s = 0, mean_x = 0;
    for (int c = 0; c < kV; c++) m = std::max(m, row[c]);
    for (int c = 0; c < kV; c++) s += std::exp(row[c] - m), mean_x += row[c] / kV;
    double lse = m + std::log(s);
    r.rows[i] = (1 - eps) * (lse - row[t[i]]) + eps * (lse - mean_x);
    r.sum += r.rows[i];
    for (int c = 0; c < kV; c++) {
      double q = eps / kV + (c == t[i] ? 1 - eps : 0.0);
      r.dlogits[i * kV + c] = (std::exp(row[c] - lse) - q) / count;
    }
  }
  r.mean = count > 0 ? r.sum / count : 0.0;
  return r;
}

Tensor targets(const std::vector<int64_t>& t = kTargets) { return ops::from_vector(t, {int64_t(t.size())}); }
Tensor squared(const Tensor& y) { return ops::mul(y, y); }

void expect_values_near(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

}  // namespace

TEST(Loss, CrossEntropyMatchesHandWrittenLogSumExp) {
  Tensor x = rand_input({kN, kV}, -3, 3, false);
  std::vector<double> xv = x.to_double();
  for (double eps : {0.0, 0.1}) {
    SCOPED_TRACE(eps);
    Reference r = reference_cross_entropy(xv, kTargets, -100, eps);
    Tensor t = targets();
    Tensor mean = ops::cross_entropy(x, t, -100, eps);
    EXPECT_EQ(mean.shape(), Shape{});
    EXPECT_NEAR(mean.item(), r.mean, 1e-12);
    EXPECT_NEAR(ops::cross_entropy(x, t, -100, eps, Reduction::sum).item(), r.sum, 1e-12);
    expect_values_near(ops::cross_entropy(x, t, -100, eps, Reduction::none).to_double(), r.rows, 1e-12);
    // f32 logits (and i32 targets): the same function, computed in float, returned as f32.
    Tensor loss32 = ops::cross_entropy(ops::to(x, DType::f32), ops::from_vector(kTargets, {kN}, DType::i32), -100, eps);
    EXPECT_EQ(loss32.dtype(), DType::f32);
    EXPECT_NEAR(loss32.item(), r.mean, 1e-5);
    // bf16 logits: the loss is still f32 (the reference is computed from the rounded logits).
    Tensor xb = ops::to(x, DType::bf16);
    Tensor lossb = ops::cross_entropy(xb, t, -100, eps);
    EXPECT_EQ(lossb.dtype(), DType::f32);
    EXPECT_NEAR(lossb.item(), reference_cross_entropy(xb.to_double(), kTargets, -100, eps).mean, 1e-5);
  }
  // ignore_index may be a real class (a padding token): rows with target 3 then count for nothing.
  EXPECT_NEAR(ops::cross_entropy(x, ops::from_vector(std::vector<int64_t>{3, 2, 0, 6, 3}, {kN}), 3).item(),
              reference_cross_entropy(xv, {3, 2, 0, 6, 3}, 3, 0.0).mean, 1e-12);
}

TEST(Loss, CrossEntropyGradientIsSoftmaxMinusSmoothedOneHot) {
  Tensor x = rand_input({kN, kV}, -3, 3);
  Reference r = reference_cross_entropy(x.to_double(), kTargets, -100, 0.1);
  graph::backward(ops::cross_entropy(x, targets(), -100, 0.1));
  expect_values_near(x.grad().to_double(), r.dlogits, 1e-12);
  for (int c = 0; c < kV; c++) EXPECT_EQ(x.grad().to_double()[1 * kV + c], 0.0);  // the ignored row
}

TEST(Loss, CrossEntropyGradAndDoubleBackward) {
  Tensor x = rand_input({kN, kV}, -2, 2);
  Tensor t = targets();
  for (Reduction red : {Reduction::mean, Reduction::sum, Reduction::none}) {
    for (double eps : {0.0, 0.2}) {
      SCOPED_TRACE(::testing::Message() << "reduction " << int(red) << " eps " << eps);
      testutil::Fn f = [&](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], t, -100, eps, red); };
      testutil::expect_gradcheck(f, {x});
      testutil::expect_double_backward(f, {x});
      // Squared: the loss gradient g depends on x, so the backward op's d/dg rule runs too.
      testutil::Fn f2 = [&](const std::vector<Tensor>& in) {
        return squared(ops::cross_entropy(in[0], t, -100, eps, red));
      };
      testutil::expect_gradcheck(f2, {x});
      testutil::expect_double_backward(f2, {x});
    }
  }
}

TEST(Loss, CrossEntropyAllIgnoredGivesZeroNotNaN) {
  // Documented in loss.h: PyTorch returns 0 / 0 = NaN here; the engine divides by max(count, 1).
  Tensor x = rand_input({3, kV});
  Tensor t = ops::from_vector(std::vector<int64_t>{-100, -100, -100}, {3});
  Tensor loss = ops::cross_entropy(x, t, -100, 0.1);
  EXPECT_EQ(loss.item(), 0.0);
  graph::backward(loss);
  for (double v : x.grad().to_double()) EXPECT_EQ(v, 0.0);
}

TEST(Loss, CrossEntropySavesRowLogSumExpNotProbabilities) {
  Tensor x = rand_input({kN, kV});
  Tensor loss = ops::cross_entropy(x, targets());
  int full_size = 0;
  for (const auto& s : loss.grad_fn()->saved_tensors) {
    if (s.data.numel() == kN * kV) {
      full_size++;
      EXPECT_EQ(s.data.impl(), x.impl()) << "the only [N, V] tensor saved is the logits themselves";
    }
  }
  EXPECT_EQ(full_size, 1);
  EXPECT_EQ(loss.grad_fn()->saved_tensors[2].data.shape(), Shape{kN});  // the row log-sum-exp
}

TEST(Loss, CrossEntropyErrors) {
  Tensor x = ops::zeros({kN, kV});
  try {
    ops::cross_entropy(x, targets({3, 1, 7, 0, 0}));
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("cross_entropy"), std::string::npos) << msg;
    EXPECT_NE(msg.find("index 7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("size 7"), std::string::npos) << msg;
  }
  EXPECT_THROW(ops::cross_entropy(x, targets({1, 2, 3})), engine::Error);                 // [3] for 5 rows
  EXPECT_THROW(ops::cross_entropy(ops::zeros({kN, kV, 1}), targets()), engine::Error);    // 3-D logits
  EXPECT_THROW(ops::cross_entropy(x, ops::zeros({kN})), engine::Error);                   // float targets
  EXPECT_THROW(ops::cross_entropy(x, targets(), -100, 1.5), engine::Error);               // smoothing > 1
}

TEST(Loss, PointwiseLossesMatchFormulas) {
  Tensor a = rand_input({3, 4}, -2, 2, false), b = rand_input({3, 4}, 0, 1, false);
  std::vector<double> av = a.to_double(), bv = b.to_double();
  std::vector<double> mse(12), l1(12), bce(12), bce_w(12), smooth(12);
  const double pw[4] = {0.5, 1.0, 2.0, 3.0};
  for (int i = 0; i < 12; i++) {
    double x = av[i], t = bv[i], p = pw[i % 4];
    mse[i] = (x - t) * (x - t);
    l1[i] = std::fabs(x - t);
    smooth[i] = std::fabs(x - t) < 0.7 ? 0.5 * (x - t) * (x - t) / 0.7 : std::fabs(x - t) - 0.35;  // beta 0.7
    bce[i] = -(t * std::log(1 / (1 + std::exp(-x))) + (1 - t) * std::log(1 - 1 / (1 + std::exp(-x))));
    bce_w[i] = -(p * t * std::log(1 / (1 + std::exp(-x))) + (1 - t) * std::log(1 - 1 / (1 + std::exp(-x))));
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double e : v) s += e;
    return s / double(v.size());
  };
  Tensor w = ops::from_vector(std::vector<double>(pw, pw + 4), {4}, DType::f64);
  EXPECT_NEAR(ops::mse_loss(a, b).item(), mean(mse), 1e-12);
  EXPECT_NEAR(ops::l1_loss(a, b, Reduction::sum).item(), mean(l1) * 12, 1e-12);
  expect_values_near(ops::smooth_l1_loss(a, b, 0.7, Reduction::none).to_double(), smooth, 1e-12);
  EXPECT_NEAR(ops::smooth_l1_loss(a, b, 0.7).item(), mean(smooth), 1e-12);
  EXPECT_NEAR(ops::smooth_l1_loss(a, b, 0.0).item(), mean(l1), 1e-12);  // beta 0: L1
  expect_values_near(ops::bce_with_logits(a, b, Tensor(), Reduction::none).to_double(), bce, 1e-12);
  EXPECT_NEAR(ops::bce_with_logits(a, b, w).item(), mean(bce_w), 1e-12);
  EXPECT_EQ(ops::mse_loss(ops::to(a, DType::bf16), ops::to(b, DType::bf16)).dtype(), DType::f32);
  // Large logits stay finite in the stable form: loss ~ |x| on the wrong side, ~ 0 on the right side.
  Tensor big = ops::from_vector(std::vector<double>{100, -100}, {2}, DType::f32);
  Tensor zero = ops::zeros({2});
  expect_values_near(ops::bce_with_logits(big, zero, Tensor(), Reduction::none).to_double(), {100, 0}, 1e-4);
}

TEST(Loss, PointwiseLossesGradAndDoubleBackward) {
  Tensor a = rand_input({3, 4}, -2, 2), b = rand_input({3, 4}, 0, 1), w = rand_input({4}, 0.5, 2);
  for (Reduction red : {Reduction::mean, Reduction::sum, Reduction::none}) {
    SCOPED_TRACE(int(red));
    std::vector<testutil::Fn> fs = {
        [&](const std::vector<Tensor>& in) { return ops::mse_loss(in[0], in[1], red); },
        [&](const std::vector<Tensor>& in) { return squared(ops::mse_loss(in[0], in[1], red)); },
        [&](const std::vector<Tensor>& in) { return squared(ops::l1_loss(in[0], in[1], red)); },
        [&](const std::vector<Tensor>& in) { return squared(ops::smooth_l1_loss(in[0], in[1], 0.7, red)); },
        [&](const std::vector<Tensor>& in) { return squared(ops::bce_with_logits(in[0], in[1], Tensor(), red)); },
    };
    for (size_t k = 0; k < fs.size(); k++) {
      SCOPED_TRACE(k);
      testutil::expect_gradcheck(fs[k], {a, b});
      testutil::expect_double_backward(fs[k], {a, b});
    }
    testutil::Fn fw = [&](const std::vector<Tensor>& in) {
      return squared(ops::bce_with_logits(in[0], in[1], in[2], red));
    };
    testutil::expect_gradcheck(fw, {a, b, w});
    testutil::expect_double_backward(fw, {a, b, w});
  }
}

TEST(Loss, PointwiseLossErrors) {
  EXPECT_THROW(ops::mse_loss(ops::zeros({3}), ops::zeros({4})), engine::Error);
  EXPECT_THROW(ops::l1_loss(ops::zeros({3}), ops::zeros({3}, DType::f64)), engine::Error);
  EXPECT_THROW(ops::smooth_l1_loss(ops::zeros({3}), ops::zeros({3}), -1.0), engine::Error);  // beta < 0
  EXPECT_THROW(ops::bce_with_logits(ops::zeros({2, 3}), ops::zeros({2, 3}), ops::zeros({2})), engine::Error);
}

TEST(Loss, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor x = ops::rand({4, 6}, -1, 1).set_requires_grad(true);
    Tensor y = ops::rand({4, 6}, 0, 1);
    Tensor t = ops::from_vector(std::vector<int64_t>{5, -100, 0, 2}, {4});
    Tensor loss = ops::add(ops::cross_entropy(x, t, -100, 0.1),
                           ops::add(ops::mse_loss(x, y), ops::bce_with_logits(x, y, ops::ones({6}))));
    loss = ops::add(loss, ops::sum(ops::l1_loss(x, y, Reduction::none)));
    graph::backward(loss);
  });
}
