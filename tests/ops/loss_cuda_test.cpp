// loss_cuda_test.cpp: the losses on the GPU against the cpu reference: cross-entropy (every reduction,
// ignore_index, label smoothing, i32/i64 targets, small and vocabulary-sized rows, strided logits, an
// all-ignored batch, double backward through its fused backward op, an out-of-range target raising the
// cpu's error), mse / l1 / bce_with_logits (every reduction, pos_weight, strided inputs, sums over many
// partial blocks); repeatability of the reductions; the ledger equal to meta's (workspaces included).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/reduce.h"
#include "ops/softmax.h"
#include "ops/view.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using ops::Reduction;
using testutil::cpu_input;
using testutil::expect_cuda_matches_cpu;
using testutil::Tolerance;

using testutil::median_ms;

namespace {

const DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
const Reduction kReductions[] = {Reduction::mean, Reduction::sum, Reduction::none};
const char* reduction_name(Reduction r) { return r == Reduction::mean ? "mean" : r == Reduction::sum ? "sum" : "none"; }

// Targets in [0, V), every third one set to ignore_index (-100) when with_ignored.
Tensor targets(int64_t N, int64_t V, DType dtype, bool with_ignored) {
  Tensor t = ops::randint({N}, V, DType::i64);
  if (with_ignored) {
    std::vector<double> v = t.to_double();
    for (size_t i = 0; i < v.size(); i += 3) v[i] = -100;
    t = ops::from_vector(v, {N}, DType::i64);
  }
  return ops::to(t, dtype);
}

// Sums of many terms: the cpu adds one at a time, the GPU in trees.
Tolerance sum_tolerance(DType dt) { return dt == DType::f32 ? Tolerance{1e-4, 1e-5} : Tolerance{}; }


}  // namespace

TEST(CrossEntropyCuda, MatchesCpu) {
  struct Case {
    int64_t N, V;
    bool transposed;  // logits given as transpose of [V, N]: a column stride of N
  };
  // A few classes run a thread per row in blocks of 2048 rows: 4097 rows end with a block of one row (its count
  // read from the target), 5000 transposed ones are strided.
  const Case cases[] = {{7, 3, false},  {33, 1000, false}, {16, 30522, false},
                        {20, 50, true}, {4097, 21, false}, {5000, 21, true}};
  for (DType dt : kFloats) {
    for (const Case& c : cases) {
      for (Reduction r : kReductions) {
        for (double smoothing : {0.0, 0.1}) {
          for (DType tdt : {DType::i64, DType::i32}) {
            std::string what = engine::str("cross_entropy ", engine::dtype_name(dt), " [", c.N, ", ", c.V, "]",
                                           c.transposed ? " transposed" : "", " ", reduction_name(r), " smoothing ",
                                           smoothing, " target ", engine::dtype_name(tdt));
            Tensor target = targets(c.N, c.V, tdt, true);
            Shape shape = c.transposed ? Shape{c.V, c.N} : Shape{c.N, c.V};
            auto f = [&](const std::vector<Tensor>& in) {
              Tensor logits = c.transposed ? ops::transpose(in[0], 0, 1) : in[0];
              return ops::cross_entropy(logits, in[1], -100, smoothing, r);
            };
            expect_cuda_matches_cpu(what, f, {cpu_input(shape, dt, -5, 5, true), target}, sum_tolerance(dt));
          }
        }
      }
    }
  }
}

TEST(CrossEntropyCuda, AllIgnoredBatchGivesZero) {
  Tensor target = ops::full({6}, -100, DType::i64);
  for (Reduction r : kReductions)
    expect_cuda_matches_cpu(
        engine::str("cross_entropy all ignored ", reduction_name(r)),
        [r](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], in[1], -100, 0.1, r); },
        {cpu_input({6, 10}, DType::f32, -1, 1, true), target});
}

TEST(CrossEntropyCuda, DoubleBackwardThroughTheFusedBackward) {
  // d/dlogits of <w, dL/dlogits>: the cross_entropy_backward op's rule on each device.
  for (Reduction r : kReductions) {
    Tensor target = targets(9, 12, DType::i64, true);
    auto f = [r](const std::vector<Tensor>& in) {
      Tensor loss = ops::cross_entropy(in[0], in[1], -100, 0.2, r);
      Tensor ones = ops::ones_like(loss);
      return graph::grad({loss}, {in[0]}, {ones}, /*create_graph=*/true)[0];
    };
    expect_cuda_matches_cpu(engine::str("cross_entropy double backward ", reduction_name(r)), f,
                            {cpu_input({9, 12}, DType::f64, -2, 2, true), target});
  }
}

TEST(CrossEntropyCuda, OutOfRangeTargetRaisesTheCpuError) {
  Tensor logits = testutil::to_cuda(cpu_input({4, 5}, DType::f32));
  Tensor target = testutil::to_cuda(ops::from_vector(std::vector<int64_t>{0, 7, 1, 2}, {4}));
  testutil::expect_cuda_throws(
      "cross_entropy with target 7 of 5 classes", [&] { ops::cross_entropy(logits, target); },
      "index 7 is out of range for a dimension of size 5");
}

TEST(PointwiseLossCuda, MatchesCpu) {
  struct Case {
    const char* layout;
    Shape shape;
    bool transpose;
  };
  // Large means and sums are checked against an f64 reference below (the cpu's one-at-a-time f32 sum
  // drifts by ~1e-4 over 1e5 terms; the GPU's tree does better).
  const Case cases[] = {
      {"small", {3, 5}, false}, {"strided", {40, 33}, true}, {"large, no reduction", {300, 1111}, false}};
  for (DType dt : kFloats) {
    for (const Case& c : cases) {
      for (Reduction r : kReductions) {
        if (c.shape[0] == 300 && r != Reduction::none) continue;
        auto view = [&c](const Tensor& t) { return c.transpose ? ops::transpose(t, 0, 1) : t; };
        std::string tail = engine::str(engine::dtype_name(dt), " ", c.layout, " ", engine::shape_str(c.shape), " ",
                                       reduction_name(r));
        Tolerance tol = sum_tolerance(dt);
        expect_cuda_matches_cpu(
            "mse_loss " + tail,
            [&](const std::vector<Tensor>& in) { return ops::mse_loss(view(in[0]), view(in[1]), r); },
            {cpu_input(c.shape, dt, -2, 2, true), cpu_input(c.shape, dt, -2, 2, true)}, tol);
        expect_cuda_matches_cpu(
            "l1_loss " + tail, [&](const std::vector<Tensor>& in) { return ops::l1_loss(view(in[0]), view(in[1]), r); },
            {cpu_input(c.shape, dt, -2, 2, true), cpu_input(c.shape, dt, -2, 2, true)}, tol);
        expect_cuda_matches_cpu(
            "smooth_l1_loss " + tail,
            [&](const std::vector<Tensor>& in) { return ops::smooth_l1_loss(view(in[0]), view(in[1]), 0.5, r); },
            {cpu_input(c.shape, dt, -2, 2, true), cpu_input(c.shape, dt, -2, 2, true)}, tol);
        expect_cuda_matches_cpu(
            "bce_with_logits " + tail,
            [&](const std::vector<Tensor>& in) { return ops::bce_with_logits(view(in[0]), view(in[1]), Tensor(), r); },
            {cpu_input(c.shape, dt, -4, 4, true), cpu_input(c.shape, dt, 0, 1, true)}, tol);
        const int64_t classes = view(cpu_input(c.shape, dt)).size(-1);
        expect_cuda_matches_cpu(
            "bce_with_logits pos_weight " + tail,
            [&](const std::vector<Tensor>& in) { return ops::bce_with_logits(view(in[0]), view(in[1]), in[2], r); },
            {cpu_input(c.shape, dt, -4, 4, true), cpu_input(c.shape, dt, 0, 1, true),
             cpu_input({classes}, dt, 0.5, 3, true)},
            tol);
      }
    }
  }
}

TEST(PointwiseLossCuda, LargeReductionsMatchAnF64Reference) {
  // 333300 terms over 82 partial blocks: the GPU's mean/sum in f32 against the same loss of the same
  // (rounded) inputs in f64, to a relative 1e-5.
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (Reduction r : {Reduction::mean, Reduction::sum}) {
      Tensor a = cpu_input({300, 1111}, dt, -2, 2), b = cpu_input({300, 1111}, dt, 0, 1);
      Tensor w = cpu_input({1111}, dt, 0.5, 3);
      auto losses = [r](const Tensor& a, const Tensor& b, const Tensor& w) {
        return std::vector<Tensor>{ops::mse_loss(a, b, r), ops::l1_loss(a, b, r),
                                   ops::bce_with_logits(a, b, Tensor(), r), ops::bce_with_logits(a, b, w, r)};
      };
      std::vector<Tensor> want = losses(ops::to(a, DType::f64), ops::to(b, DType::f64), ops::to(w, DType::f64));
      std::vector<Tensor> got;
      {
        Tensor ga = testutil::to_cuda(a), gb = testutil::to_cuda(b), gw = testutil::to_cuda(w);
        engine::DeviceGuard guard(testutil::cuda_device());
        got = losses(ga, gb, gw);
      }
      const char* names[] = {"mse_loss", "l1_loss", "bce_with_logits", "bce_with_logits pos_weight"};
      for (size_t k = 0; k < want.size(); k++) {
        const double ref = want[k].item(), value = got[k].item();
        EXPECT_NEAR(value, ref, 1e-5 * std::fabs(ref))
            << names[k] << " " << engine::dtype_name(dt) << " [300, 1111] " << reduction_name(r)
            << ": cuda f32 result against the f64 reference";
      }
    }
  }
}

TEST(LossCuda, ReductionsRepeatableBitForBit) {
  Tensor a = testutil::to_cuda(cpu_input({1000, 513}, DType::f32, -2, 2));
  Tensor b = testutil::to_cuda(cpu_input({1000, 513}, DType::f32, -2, 2));
  Tensor logits = testutil::to_cuda(cpu_input({500, 3000}, DType::f32, -3, 3));
  Tensor target = testutil::to_cuda(targets(500, 3000, DType::i64, true));
  engine::DeviceGuard guard(testutil::cuda_device());
  testutil::expect_equal("mse_loss run twice", ops::mse_loss(a, b), ops::mse_loss(a, b));
  testutil::expect_equal("cross_entropy run twice", ops::cross_entropy(logits, target, -100, 0.1),
                         ops::cross_entropy(logits, target, -100, 0.1));
}

TEST(LossCuda, LedgerMatchesMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor logits = ops::rand({64, 100}, -2, 2, DType::f32).set_requires_grad(true);
    Tensor target = ops::randint({64}, 100, DType::i64);
    Tensor x = ops::rand({20, 30}, -2, 2, DType::f32).set_requires_grad(true);
    Tensor y = ops::rand({20, 30}, 0, 1, DType::f32);
    Tensor loss = ops::add(ops::cross_entropy(logits, target, -100, 0.1),
                           ops::add(ops::mse_loss(x, y), ops::bce_with_logits(x, y, Tensor(), Reduction::sum)));
    graph::backward(loss);
  });
}

// Not run by default (--gtest_also_run_disabled_tests): cross-entropy over a BERT vocabulary, and over
// deeplabv3's pixels (8 x 513 x 513 rows of 21 classes).
TEST(CrossEntropyCuda, DISABLED_Bandwidth) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (Shape s : {Shape{8192, 30522}, Shape{8 * 513 * 513, 21}}) {
      const int64_t N = s[0], V = s[1];
      Tensor logits = testutil::to_cuda(cpu_input(s, dt, -4, 4));
      Tensor target = testutil::to_cuda(targets(N, V, DType::i64, false));
      const double bytes = double(logits.nbytes());
      Tensor g, lse, div;
      double fwd = median_ms([&] { ops::cross_entropy(logits, target); });
      {
        engine::DeviceGuard guard(testutil::cuda_device());
        Tensor lp = ops::log_softmax(ops::to(logits, DType::f32), 1);
        lse = ops::reshape(ops::sub(ops::slice(ops::to(logits, DType::f32), 1, 0, 1), ops::slice(lp, 1, 0, 1)), {N});
        div = ops::full({}, double(N), DType::f32);
        g = ops::full({}, 1, DType::f32);
      }
      double bwd =
          median_ms([&] { ops::cross_entropy_backward(g, logits, target, lse, div, -100, 0.1, ops::Reduction::mean); });
      std::printf("cross_entropy %s %s: forward %.3f ms %.0f GB/s, backward %.3f ms %.0f GB/s\n",
                  engine::dtype_name(dt), engine::shape_str(s).c_str(), fwd, bytes / fwd / 1e6, bwd,
                  2 * bytes / bwd / 1e6);
    }
  }
}
