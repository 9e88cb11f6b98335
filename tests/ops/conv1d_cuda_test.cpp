// conv1d_cuda_test.cpp: conv1d and glu on the GPU against the cpu reference, by dtype: outputs and gradients
// (the shifted cuBLASLt GEMMs of forward and input gradient: over all the sentences' rows with the edge rows
// recomputed where To == T, batched over the sentences otherwise; the weight gradient's flat GEMM for the unshifted
// tap, its flat GEMMs less the sentence-boundary pairs for the shifted ones where To == T (one sentence, one and
// several boundary rows), and its tiled kernel for the other paddings, over several tiles with ragged edges), the
// gradient ops' own
// rules (double backward), GLU's vectorized and scalar paths; the ledger equal to meta's; a perf mode at
// convs2s's layer sizes.
#include <gtest/gtest.h>

#include <cstdio>

#include "graph/autograd.h"
#include "ops/conv1d.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/view.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::cpu_input;
using testutil::expect_cuda_matches_cpu;
using testutil::median_ms;
using testutil::Tolerance;

namespace {

const DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

struct ConvCase {
  const char* name;
  int64_t B, T, Cin, Cout, K, pl, pr;
};
const ConvCase kConvCases[] = {
    {"encoder K=3 (1, 1)", 2, 9, 16, 24, 3, 1, 1},
    {"decoder causal K=3 (2, 0)", 3, 7, 8, 12, 3, 2, 0},
    {"K=1 1x1", 2, 5, 32, 64, 1, 0, 0},
    {"ragged tiles: Cin 130, Cout 200", 2, 13, 130, 200, 3, 1, 1},
    {"pad wider than kernel (3, 2), K=2", 2, 4, 8, 8, 2, 3, 2},
    {"long reduction: B 8 x T 50", 8, 50, 40, 72, 3, 2, 0},
    {"one sentence K=3 (1, 1)", 1, 9, 16, 24, 3, 1, 1},
    {"decoder causal K=5 (4, 0)", 3, 11, 16, 24, 5, 4, 0},
    {"encoder K=5 (2, 2), sentences shorter than a tap's shift", 4, 2, 16, 24, 5, 2, 2},
    {"To != T: (2, 1), K=3 (the tiled kernel)", 3, 7, 16, 24, 3, 2, 1},
};

// The GPU accumulates tap after tap in the output's dtype (cuBLASLt beta = 1, as fairseq's ConvTBC does with
// addmm_): bf16/f16 outputs are rounded K times, the cpu's once; f32 sums run in another order. A rounding's error
// scales with the partial sum, not the result: in the long-reduction case a tap's sum over 72 channels reaches ~8,
// where half an f16 step is 2^-8, so K - 1 = 2 extra roundings can leave 2^-7 (0.0078) on a result of 0.13 (seen on
// an H100: whether it does depends on cuBLASLt's f32 summation order, which the flat GEMMs changed).
Tolerance conv_tolerance(DType dt) {
  switch (dt) {
    case DType::f32: return {1e-4, 1e-4};
    case DType::bf16: return {5e-2, 3e-2};
    case DType::f16:
      return {1e-2, 5e-3};
    default: return {};
  }
}

}  // namespace

TEST(Conv1dCuda, ForwardAndGradientsMatchCpu) {
  for (DType dt : kFloats) {
    for (const ConvCase& c : kConvCases) {
      std::string what = engine::str("conv1d ", engine::dtype_name(dt), " ", c.name, " x [", c.B, ", ", c.T, ", ",
                                     c.Cin, "] w [", c.K, ", ", c.Cin, ", ", c.Cout, "]");
      auto f = [&c](const std::vector<Tensor>& in) { return ops::conv1d(in[0], in[1], in[2], c.pl, c.pr); };
      expect_cuda_matches_cpu(
          what, f,
          {cpu_input({c.B, c.T, c.Cin}, dt, -0.5, 0.5, true), cpu_input({c.K, c.Cin, c.Cout}, dt, -0.5, 0.5, true),
           cpu_input({c.Cout}, dt, -1, 1, true)},
          conv_tolerance(dt));
    }
  }
}

TEST(Conv1dCuda, NoBiasAndStridedInput) {
  for (DType dt : {DType::f32, DType::bf16}) {
    auto f = [](const std::vector<Tensor>& in) {
      return ops::conv1d(ops::transpose(in[0], 0, 1), in[1], Tensor(), 2, 0);  // x [T, B, C] -> [B, T, C] view
    };
    expect_cuda_matches_cpu(engine::str("conv1d no bias, strided x, ", engine::dtype_name(dt)), f,
                            {cpu_input({6, 3, 20}, dt, -0.5, 0.5, true), cpu_input({3, 20, 10}, dt, -0.5, 0.5, true)},
                            conv_tolerance(dt));
  }
}

TEST(Conv1dCuda, GradientOpsAndTheirRulesMatchCpu) {
  const int64_t K = 3, pl = 1, pr = 1;
  for (DType dt : {DType::f32, DType::f64}) {
    auto fin = [](const std::vector<Tensor>& in) { return ops::conv1d_backward_input(in[0], in[1], pl, pr); };
    expect_cuda_matches_cpu(engine::str("conv1d_backward_input ", engine::dtype_name(dt)), fin,
                            {cpu_input({2, 11, 24}, dt, -0.5, 0.5, true), cpu_input({K, 16, 24}, dt, -0.5, 0.5, true)},
                            conv_tolerance(dt));
    auto fw = [](const std::vector<Tensor>& in) { return ops::conv1d_backward_weight(in[0], in[1], K, pl, pr); };
    expect_cuda_matches_cpu(engine::str("conv1d_backward_weight ", engine::dtype_name(dt)), fw,
                            {cpu_input({2, 11, 24}, dt, -0.5, 0.5, true), cpu_input({2, 11, 16}, dt, -0.5, 0.5, true)},
                            conv_tolerance(dt));
  }
}

TEST(GluCuda, ForwardAndBackwardMatchCpu) {
  struct GluCase {
    const char* name;
    Shape shape;
    int64_t dim;
  };
  const GluCase cases[] = {
      {"last dim, vectorized", {4, 6, 128}, -1},
      {"last dim, odd half (scalar path)", {3, 5, 14}, -1},
      {"middle dim", {3, 8, 5}, 1},
      {"first dim", {6, 7}, 0},
  };
  for (DType dt : kFloats) {
    for (const GluCase& c : cases) {
      auto f = [&c](const std::vector<Tensor>& in) { return ops::glu(in[0], c.dim); };
      expect_cuda_matches_cpu(engine::str("glu ", engine::dtype_name(dt), " ", c.name, " ", engine::shape_str(c.shape)),
                              f, {cpu_input(c.shape, dt, -3, 3, true)});
    }
    // glu_backward with g and x requiring grad: the fused kernel, then its rule (engine ops) on each device.
    auto fb = [](const std::vector<Tensor>& in) { return ops::glu_backward(in[0], in[1], -1); };
    expect_cuda_matches_cpu(engine::str("glu_backward ", engine::dtype_name(dt)), fb,
                            {cpu_input({5, 64}, dt, -1, 1, true), cpu_input({5, 128}, dt, -3, 3, true)});
  }
}

TEST(Conv1dCuda, LedgerMatchesMeta) {
  // The forward's and input gradient's GEMM workspace and every output are allocated on both devices alike.
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor x = ops::rand({4, 12, 32}, -1, 1, DType::f32).set_requires_grad(true);
    Tensor w = ops::rand({3, 32, 64}, -0.2, 0.2, DType::f32).set_requires_grad(true);
    Tensor b = ops::rand({64}, -1, 1, DType::f32).set_requires_grad(true);
    Tensor y = ops::glu(ops::conv1d(x, w, b, 2, 0), -1);
    graph::backward(ops::sum(ops::mul(y, y)));
  });
}

// Not run by default (--gtest_also_run_disabled_tests): TFLOP/s at convs2s's layer shapes (4000 tokens).
TEST(Conv1dCuda, DISABLED_Throughput) {
  struct Layer {
    int64_t Cin, Cout, K;
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    for (Layer l : {Layer{512, 1024, 3}, Layer{1024, 2048, 3}, Layer{2048, 4096, 1}}) {
      const int64_t B = 160, T = 25, pl = l.K - 1;
      Tensor x = testutil::to_cuda(cpu_input({B, T, l.Cin}, dt, -1, 1));
      Tensor w = testutil::to_cuda(cpu_input({l.K, l.Cin, l.Cout}, dt, -0.05, 0.05));
      Tensor g = testutil::to_cuda(cpu_input({B, T, l.Cout}, dt, -1, 1));
      const double flops = 2.0 * double(B * T) * double(l.K * l.Cin * l.Cout);  // ignoring the padded taps
      double fwd = median_ms([&] { ops::conv1d(x, w, Tensor(), pl, 0); });
      double din = median_ms([&] { ops::conv1d_backward_input(g, w, pl, 0); });
      double dw = median_ms([&] { ops::conv1d_backward_weight(g, x, l.K, pl, 0); });
      std::printf(
          "conv1d %s [%ld x %ld, %ld] K %ld -> %ld: forward %.3f ms %.1f TFLOP/s, dx %.3f ms %.1f, dw %.3f ms %.1f\n",
          engine::dtype_name(dt), long(B), long(T), long(l.Cin), long(l.K), long(l.Cout), fwd, flops / fwd / 1e9, din,
          flops / din / 1e9, dw, flops / dw / 1e9);
    }
  }
}
