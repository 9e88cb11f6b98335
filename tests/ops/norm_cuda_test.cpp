// norm_cuda_test.cpp: layer_norm on the GPU against the cpu reference: outputs, mean/rstd-dependent
// gradients dx, dweight, dbias (the deterministic two-stage column sums, with many row chunks), the fused
// backward op's own rule (double backward), over the warp kernels of each register size, the block kernels
// (long, strided, misaligned rows), without weight or bias; repeatability; the ledger equal to meta's;
// dropout_add_layer_norm (its fused warp kernel and its three-kernel path) the same way; weight_norm (its sums,
// reduce.cu's sum_of_products on rows and columns, split or not, and its two pointwise passes, in packs or not)
// the same way, and its ledger.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>

#include "engine/rng.h"
#include "graph/autograd.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/norm.h"
#include "ops/reduce.h"
#include "ops/view.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::cpu_input;
using testutil::expect_cuda_matches_cpu;
using testutil::Tolerance;

using testutil::median_ms;

namespace {

const DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

struct Case {
  const char* layout;
  Shape shape;  // of x; C = last
  bool transpose;  // x = transpose(input, 0, last): a non-unit stride along C
  bool misalign;   // drop the first column
};

const Case kCases[] = {
    {"warp, 1 item", {7, 3, 32}, false, false},
    {"warp, 3 items (384)", {10, 384}, false, false},
    {"warp, 6 items (768)", {33, 768}, false, false},
    {"warp, 8 items (1024)", {9, 1024}, false, false},
    {"block, unaligned C", {13, 5}, false, false},
    {"block, long rows", {5, 3000}, false, false},
    {"block, misaligned", {6, 257}, false, true},
    {"block, strided", {64, 4, 17}, true, false},
    {"many row chunks (512 partial rows)", {9000, 64}, false, false},
};

Tensor layout(const Case& c, const Tensor& x) {
  Tensor t = c.transpose ? ops::transpose(x, 0, x.dim() - 1) : x;
  return c.misalign ? ops::slice(t, -1, 1, t.size(-1)) : t;
}

// dweight/dbias sum over the rows: the cpu adds row after row, the GPU in chunks and trees. A sequential f32 sum
// of R terms with random signs carries a rounding error growing as sqrt(R) (the cpu's own error at 9000 rows is
// a few 1e-4 of sums near 1), so the f32 tolerance grows so past 512 rows.
Tolerance column_sum_tolerance(DType dt, int64_t rows = 1) {
  const double growth = std::sqrt(std::max(1.0, double(rows) / 512.0));
  return dt == DType::f32 ? Tolerance{1e-4 * growth, 1e-4 * growth} : Tolerance{};
}


}  // namespace

TEST(LayerNormCuda, ForwardAndGradientsMatchCpuOnEveryPath) {
  for (DType dt : kFloats) {
    for (const Case& c : kCases) {
      for (int affine = 0; affine < 3; affine++) {  // weight and bias, weight only, neither
        std::string what =
            engine::str("layer_norm ", engine::dtype_name(dt), " ", c.layout, " ", engine::shape_str(c.shape),
                        affine == 0   ? " weight+bias"
                        : affine == 1 ? " weight"
                                      : " plain");
        const int64_t C = layout(c, cpu_input(c.shape, dt)).size(-1);
        auto f = [&c, affine](const std::vector<Tensor>& in) {
          return ops::layer_norm(layout(c, in[0]), affine < 2 ? in[1] : Tensor(), affine == 0 ? in[2] : Tensor(), 1e-5);
        };
        // Rows with an offset and a spread, so mean and rstd matter.
        expect_cuda_matches_cpu(what, f,
                                {cpu_input(c.shape, dt, 2, 5, true), cpu_input({C}, dt, 0.5, 1.5, true),
                                 cpu_input({C}, dt, -1, 1, true)},
                                column_sum_tolerance(dt, c.shape.front() * (c.shape.size() > 2 ? c.shape[1] : 1)));
      }
    }
  }
}

TEST(DropoutAddLayerNormCuda, MatchesCpuOnEveryPath) {
  // The fused warp kernel (contiguous, aligned rows up to 1024 wide) and the three-kernel path for every other
  // layout, with and without dropout: output and the gradients of y, residual, weight and bias. The masks are
  // the cpu's bit for bit (the helper gives both runs one generator state).
  engine::manual_seed(11);
  for (DType dt : kFloats) {
    for (const Case& c : kCases) {
      for (double p : {0.1, 0.0}) {
        const std::string what = engine::str("dropout_add_layer_norm p ", p, " ", engine::dtype_name(dt), " ",
                                             c.layout, " ", engine::shape_str(c.shape));
        const int64_t C = layout(c, cpu_input(c.shape, dt)).size(-1);
        auto f = [&c, p](const std::vector<Tensor>& in) {
          return ops::dropout_add_layer_norm(layout(c, in[0]), layout(c, in[1]), in[2], in[3], p, true, 1e-5);
        };
        expect_cuda_matches_cpu(what, f,
                                {cpu_input(c.shape, dt, 2, 5, true), cpu_input(c.shape, dt, -1, 1, true),
                                 cpu_input({C}, dt, 0.5, 1.5, true), cpu_input({C}, dt, -1, 1, true)},
                                column_sum_tolerance(dt, c.shape.front() * (c.shape.size() > 2 ? c.shape[1] : 1)));
      }
    }
  }
}

TEST(LayerNormCuda, BackwardOpAndItsRuleMatchCpu) {
  // layer_norm_backward called directly with g, x, weight requiring grad: its three outputs are the fused
  // kernel's, their gradients run the op's rule (double backward) on each device.
  const Case cases[] = {kCases[2], kCases[4], kCases[7]};
  for (DType dt : {DType::f32, DType::f64}) {
    for (const Case& c : cases) {
      std::string what = engine::str("layer_norm_backward ", engine::dtype_name(dt), " ", c.layout);
      const int64_t C = layout(c, cpu_input(c.shape, dt)).size(-1);
      auto f = [&c](const std::vector<Tensor>& in) -> std::vector<Tensor> {
        Tensor g = layout(c, in[0]), x = layout(c, in[1]), w = in[2];
        Tensor mean, rstd;
        {
          // The statistics as the forward saves them ([rows], acc dtype), from a detached forward.
          graph::NoGrad ng;
          const DType st = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
          Tensor xs = ops::to(x, st);
          const int64_t rows = x.numel() / x.size(-1);
          Tensor mu = ops::mean(xs, {-1}, true);
          Tensor xc = ops::sub(xs, mu);
          mean = ops::reshape(mu, {rows});
          rstd = ops::reshape(ops::rsqrt(ops::add(ops::mean(ops::mul(xc, xc), {-1}), 1e-5)), {rows});
        }
        ops::LayerNormGrads r = ops::layer_norm_backward(g, x, w, mean, rstd, 1e-5, {true, true, true});
        return {r.dx, r.dweight, r.dbias};
      };
      testutil::expect_cuda_matches_cpu_multi(what, f,
                                              {cpu_input(c.shape, dt, -1, 1, true), cpu_input(c.shape, dt, 2, 5, true),
                                               cpu_input({C}, dt, 0.5, 1.5, true)},
                                              column_sum_tolerance(dt));
    }
  }
}

TEST(LayerNormCuda, RepeatableBitForBit) {
  // The column sums use no atomics: two runs give the same bits.
  Tensor x = testutil::to_cuda(cpu_input({4000, 768}, DType::f32, -2, 2, true));
  Tensor w = testutil::to_cuda(cpu_input({768}, DType::f32, 0.5, 1.5, true));
  Tensor b = testutil::to_cuda(cpu_input({768}, DType::f32, -1, 1, true));
  engine::DeviceGuard guard(testutil::cuda_device());
  std::vector<Tensor> runs[2];
  for (auto& r : runs) {
    Tensor y = ops::layer_norm(x, w, b, 1e-5);
    r = graph::grad({y}, {x, w, b}, {ops::mul(ops::ones_like(y), 0.37)});
    r.push_back(y);
  }
  for (size_t k = 0; k < runs[0].size(); k++)
    testutil::expect_equal(engine::str("layer_norm run twice, result ", k), runs[0][k], runs[1][k]);
}

TEST(LayerNormCuda, LedgerMatchesMeta) {
  // The backward's column-sum workspace is allocated on both devices alike.
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor x = ops::rand({300, 96}, -2, 2, DType::f32).set_requires_grad(true);
    Tensor w = ops::rand({96}, 0.5, 1.5, DType::f32).set_requires_grad(true);
    Tensor b = ops::rand({96}, -1, 1, DType::f32).set_requires_grad(true);
    graph::backward(ops::sum(ops::layer_norm(x, w, b, 1e-5)));
  });
}

TEST(DropoutAddLayerNormCuda, LedgerMatchesMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor y = ops::rand({300, 768}, -2, 2, DType::bf16).set_requires_grad(true);
    Tensor r = ops::rand({300, 768}, -2, 2, DType::bf16).set_requires_grad(true);
    Tensor w = ops::rand({768}, 0.5, 1.5, DType::bf16).set_requires_grad(true);
    Tensor b = ops::rand({768}, -1, 1, DType::bf16).set_requires_grad(true);
    graph::backward(ops::sum(ops::dropout_add_layer_norm(y, r, w, b, 0.1, true, 1e-5)));
  });
}

TEST(WeightNormCuda, MatchesCpuOnEveryPath) {
  // v's layouts around dim: channels last (the one-pass column kernel: 16 columns a block, a partial last group),
  // channels first (the one-pass row kernel: a warp per channel; also behind a leading 1), a middle dim (the split
  // sums, then the pointwise pass), an odd count (no 16-byte packs), a 1-d v; then the output and both gradients
  // against the cpu.
  struct WnCase {
    Shape shape;
    int64_t dim;
  };
  const WnCase cases[] = {{{3, 40, 24}, 2}, {{3, 512, 1024}, 2}, {{1, 2048, 40}, 2}, {{50, 37}, 1},
                          {{96, 40}, 0},    {{24, 20000}, 0},    {{1, 40, 96}, 1},   {{5, 6, 7}, 1},
                          {{5, 7, 3}, 0},   {{13}, 0},           {{1000, 3, 8}, 1}};
  for (DType dt : kFloats) {
    for (const WnCase& c : cases) {
      const std::string what =
          engine::str("weight_norm ", engine::dtype_name(dt), " v ", engine::shape_str(c.shape), " dim ", c.dim);
      Shape gs(c.shape.size(), 1);
      gs[size_t(c.dim)] = c.shape[size_t(c.dim)];
      auto f = [&c](const std::vector<Tensor>& in) { return ops::weight_norm(in[0], in[1], c.dim); };
      // dg sums over a channel's elements: up to 3 x 512 = 1536 and 20000 terms, so f32's tolerance grows as there.
      const int64_t per_channel = engine::numel_of(c.shape) / c.shape[size_t(c.dim)];
      expect_cuda_matches_cpu(what, f, {cpu_input(c.shape, dt, -1, 1, true), cpu_input(gs, dt, 0.5, 1.5, true)},
                              column_sum_tolerance(dt, per_channel));
    }
  }
}

TEST(WeightNormCuda, RepeatableBitForBitAndLedgerMatchesMeta) {
  // Sums in a fixed order (one-pass columns and rows, split for a middle dim): two runs give the same bits. The
  // ledger: the norms saved, the split sums' workspaces (none on the one-pass layouts).
  const std::pair<Shape, int64_t> layouts[] = {{{3, 1024, 2048}, 2}, {{20000, 512}, 0}, {{64, 512, 32}, 1}};
  for (const auto& [shape, dim] : layouts) {
    Shape gs(shape.size(), 1);
    gs[size_t(dim)] = shape[size_t(dim)];
    Tensor v = testutil::to_cuda(cpu_input(shape, DType::bf16, -1, 1, true));
    Tensor g = testutil::to_cuda(cpu_input(gs, DType::bf16, 0.5, 1.5, true));
    engine::DeviceGuard guard(testutil::cuda_device());
    std::vector<Tensor> runs[2];
    for (auto& r : runs) {
      Tensor w = ops::weight_norm(v, g, dim);
      r = graph::grad({w}, {v, g}, {ops::mul(ops::ones_like(w), 0.37)});
      r.push_back(w);
    }
    for (size_t k = 0; k < runs[0].size(); k++)
      testutil::expect_equal(
          engine::str("weight_norm ", engine::shape_str(shape), " dim ", dim, " run twice, result ", k), runs[0][k],
          runs[1][k]);
  }
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor v = ops::rand({3, 512, 1024}, -1, 1, DType::bf16).set_requires_grad(true);
    Tensor g = ops::rand({1, 1, 1024}, 0.5, 1.5, DType::bf16).set_requires_grad(true);
    Tensor v0 = ops::rand({40, 20000}, -1, 1, DType::f32).set_requires_grad(true);
    Tensor g0 = ops::rand({40, 1}, 0.5, 1.5, DType::f32).set_requires_grad(true);
    Tensor v1 = ops::rand({64, 512, 32}, -1, 1, DType::f32).set_requires_grad(true);
    Tensor g1 = ops::rand({1, 512, 1}, 0.5, 1.5, DType::f32).set_requires_grad(true);
    graph::backward(ops::sum(ops::weight_norm(v, g, 2)));
    graph::backward(ops::sum(ops::weight_norm(v0, g0, 0)));
    graph::backward(ops::sum(ops::weight_norm(v1, g1, 1)));
  });
}

// Not run by default (--gtest_also_run_disabled_tests): bytes moved per second at BERT sizes.
TEST(LayerNormCuda, DISABLED_Bandwidth) {
  // 32M elements at three widths, then BERT-Base's rows at 512 x 32 and BERT-Large's (MT-DNN) at 512 x 8.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{(int64_t(32) << 20) / 768, 768},
                                                           {(int64_t(32) << 20) / 1024, 1024},
                                                           {(int64_t(32) << 20) / 4096, 4096},
                                                           {16384, 768},
                                                           {4096, 1024}};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const auto& [rows, C] : shapes) {
      Tensor x = testutil::to_cuda(cpu_input({rows, C}, dt, -2, 2));
      Tensor w = testutil::to_cuda(cpu_input({C}, dt, 0.5, 1.5)), b = testutil::to_cuda(cpu_input({C}, dt, -1, 1));
      Tensor g = testutil::to_cuda(cpu_input({rows, C}, dt, -1, 1));
      const double bytes = double(x.nbytes());
      double fwd = median_ms([&] { ops::layer_norm(x, w, b, 1e-5); });
      Tensor mean, rstd;
      {
        engine::DeviceGuard guard(testutil::cuda_device());
        Tensor xs = ops::to(x, DType::f32);
        Tensor mu = ops::mean(xs, {-1}, true), xc = ops::sub(xs, mu);
        mean = ops::reshape(mu, {rows});
        rstd = ops::reshape(ops::rsqrt(ops::add(ops::mean(ops::mul(xc, xc), {-1}), 1e-5)), {rows});
      }
      double bwd = median_ms([&] { ops::layer_norm_backward(g, x, w, mean, rstd, 1e-5, {true, true, true}); });
      // The post-norm residual step: fused (y, residual read; sum, out written) against the three ops.
      double fused = median_ms([&] { ops::dropout_add_layer_norm(x, g, w, b, 0.1, true, 1e-5); });
      double three = median_ms([&] { ops::layer_norm(ops::add(ops::dropout(x, 0.1), g), w, b, 1e-5); });
      std::printf("layer_norm %s [%ld, %ld]: forward %.3f ms %.0f GB/s, backward (dx, dw, db) %.3f ms %.0f GB/s; "
                  "dropout_add_layer_norm %.3f ms %.0f GB/s (dropout, add, layer_norm: %.3f ms)\n",
                  engine::dtype_name(dt), long(rows), long(C), fwd, 2 * bytes / fwd / 1e6, bwd, 3 * bytes / bwd / 1e6,
                  fused, 4 * bytes / fused / 1e6, three);
    }
  }
}
