// softmax_cuda_test.cpp: softmax and log_softmax on the GPU against the cpu reference, outputs and gradients
// (the fused backward ops) and second derivatives (the backward ops' own rules), over every kernel path:
// warp rows of each register size, block rows (long, unaligned, misaligned), strided rows (dim not the
// unit-stride one, transposed views); masked (-inf) entries; and the ledger of a GPU run equal to meta's.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/softmax.h"
#include "ops/view.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::cpu_input;
using testutil::expect_cuda_matches_cpu;

using testutil::median_ms;

namespace {

const DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

struct Case {
  const char* layout;
  Shape shape;
  int64_t dim;
  bool transpose;  // softmax over transpose(x, 0, last) (a non-unit stride along the row)
  bool misalign;   // drop the first column: rows start off 16-byte boundaries
};

const Case kCases[] = {
    {"warp rows, half vectors", {37, 32}, -1, false, false},
    {"warp rows, half vectors (128)", {20, 128}, -1, false, false},
    {"warp rows, 2 items", {9, 3, 200}, -1, false, false},
    {"warp rows, 3 items (384)", {5, 384}, -1, false, false},
    {"warp rows, 6 items (768)", {4, 768}, -1, false, false},
    {"warp rows, 8 items (1024)", {3, 1024}, -1, false, false},
    {"block rows, unaligned length", {11, 5}, -1, false, false},
    {"block rows, long", {3, 5000}, -1, false, false},
    {"block rows, misaligned", {6, 129}, -1, false, true},
    {"strided rows, middle dim", {4, 33, 7}, 1, false, false},
    {"strided rows, first dim", {50, 6}, 0, false, false},
    {"strided rows, transposed view", {40, 3, 9}, -1, true, false},
    {"single element rows", {7, 1}, -1, false, false},
};

Tensor layout(const Case& c, const Tensor& x) {
  Tensor t = c.transpose ? ops::transpose(x, 0, x.dim() - 1) : x;
  return c.misalign ? ops::slice(t, -1, 1, t.size(-1)) : t;
}


}  // namespace

TEST(SoftmaxCuda, ForwardAndBackwardMatchCpuOnEveryPath) {
  for (DType dt : kFloats) {
    for (const Case& c : kCases) {
      for (bool log : {false, true}) {
        std::string what = engine::str(log ? "log_softmax " : "softmax ", engine::dtype_name(dt), " ", c.layout, " ",
                                       engine::shape_str(c.shape), " dim ", c.dim);
        auto f = [&c, log](const std::vector<Tensor>& in) {
          Tensor x = layout(c, in[0]);
          return log ? ops::log_softmax(x, c.dim) : ops::softmax(x, c.dim);
        };
        expect_cuda_matches_cpu(what, f, {cpu_input(c.shape, dt, -4, 4, true)});
      }
    }
  }
}

TEST(SoftmaxCuda, BackwardOpsAndTheirRulesMatchCpu) {
  // softmax_backward / log_softmax_backward called directly, g and y requiring grad: outputs are the fused
  // kernels, gradients run the ops' own (double backward) rules on each device.
  const Case cases[] = {kCases[1], kCases[4], kCases[7], kCases[8], kCases[9], kCases[11]};
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (const Case& c : cases) {
      for (bool log : {false, true}) {
        std::string what = engine::str(log ? "log_softmax_backward " : "softmax_backward ", engine::dtype_name(dt),
                                       " ", c.layout, " ", engine::shape_str(c.shape));
        auto f = [&c, log](const std::vector<Tensor>& in) {
          Tensor g = layout(c, in[0]), x = layout(c, in[1]);
          Tensor y = log ? ops::log_softmax(x, c.dim) : ops::softmax(x, c.dim);
          return log ? ops::log_softmax_backward(g, y, c.dim) : ops::softmax_backward(g, y, c.dim);
        };
        expect_cuda_matches_cpu(what, f, {cpu_input(c.shape, dt, -1, 1, true), cpu_input(c.shape, dt, -3, 3, true)});
      }
    }
  }
}

TEST(SoftmaxCuda, MaskedEntriesAndLargeValues) {
  // Attention-style rows: -inf where masked (also leading the row), and values near 1e4 (exp overflows
  // without the max).
  const double kInf = std::numeric_limits<double>::infinity();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t n : {64, 768, 3000}) {
      for (bool log : {false, true}) {
        std::string what = engine::str(log ? "log_softmax" : "softmax", " masked ", engine::dtype_name(dt), " n ", n);
        auto f = [n, log, kInf](const std::vector<Tensor>& in) {
          // Mask the first third of every row and a scattered tenth of the rest.
          Tensor cols = ops::reshape(ops::arange(n, DType::i64, in[0].device_ptr()), {1, n});
          Tensor mask = ops::compare(ops::CompareOp::lt, cols, double(n / 3));
          Tensor x = ops::masked_fill(ops::add(in[0], 1e4), mask, -kInf);
          return log ? ops::log_softmax(x, 1) : ops::softmax(x, 1);
        };
        // log_softmax of a masked entry is -inf on both devices (equal, so it passes).
        expect_cuda_matches_cpu(what, f, {cpu_input({8, n}, dt, -5, 5, true)});
      }
    }
  }
}

TEST(SoftmaxCuda, RepeatableBitForBit) {
  Tensor x = testutil::to_cuda(cpu_input({64, 768}, DType::f32, -3, 3));
  engine::DeviceGuard guard(testutil::cuda_device());
  testutil::expect_equal("softmax run twice", ops::softmax(x, -1), ops::softmax(x, -1));
  testutil::expect_equal("log_softmax over dim 0 run twice", ops::log_softmax(x, 0), ops::log_softmax(x, 0));
}

TEST(SoftmaxCuda, LedgerMatchesMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor x = ops::rand({4, 8, 96}, -2, 2, DType::f32).set_requires_grad(true);
    Tensor y = ops::add(ops::softmax(x, -1), ops::log_softmax(x, 1));
    graph::backward(ops::sum(y));
  });
}

// Not run by default (--gtest_also_run_disabled_tests): bytes moved per second at attention sizes.
TEST(SoftmaxCuda, DISABLED_Bandwidth) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t n : {128, 512, 1024, 4096}) {
      const int64_t rows = (int64_t(100) << 20) / n;  // 100M elements
      Tensor x = testutil::to_cuda(cpu_input({rows, n}, dt, -4, 4));
      Tensor g = testutil::to_cuda(cpu_input({rows, n}, dt, -1, 1));
      Tensor y;
      const double bytes = double(x.nbytes());
      double fwd = median_ms([&] { y = ops::softmax(x, -1); });
      double bwd = median_ms([&] { ops::softmax_backward(g, y, -1); });
      std::printf("softmax %s [%ld, %ld]: forward %.3f ms %.0f GB/s, backward %.3f ms %.0f GB/s\n",
                  engine::dtype_name(dt), long(rows), long(n), fwd, 2 * bytes / fwd / 1e6, bwd, 3 * bytes / bwd / 1e6);
    }
  }
}
