// pool_cuda_test.cpp: max_pool2d, avg_pool2d and global_avg_pool2d on the GPU against the cpu reference, for
// every dtype and the window shapes the image models use (3x3 s2 p1, 2x2 ceil_mode, dilation, asymmetric
// 'SAME' padding, both avg divisors): outputs and gradients (the gather-form backward kernels, and their
// rules: gather at the argmax, avg_pool2d); the ledger equal to meta's.
#include <gtest/gtest.h>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/pool.h"
#include "ops/reduce.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using ops::Pool2dParams;
using testutil::cpu_input;

namespace {

const DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

struct Case {
  const char* name;
  Shape shape;  // x, NHWC
  Pool2dParams p;
};

std::vector<Case> cases() {
  Pool2dParams same = ops::same_pool_padding(ops::pool2d_params(3, 2), 16, 15);
  Pool2dParams ceil2 = ops::pool2d_params(2, 2, 0, 1, true);
  Pool2dParams ceil3 = ops::pool2d_params(3, 2, 1, 1, true);
  return {
      {"3x3 s2 p1 (ResNet stem)", {2, 17, 19, 64}, ops::pool2d_params(3, 2, 1)},
      {"2x2 s2 ceil_mode", {2, 9, 11, 5}, ceil2},
      {"3x3 s2 p1 ceil_mode", {1, 10, 10, 33}, ceil3},
      {"3x3 s1 p1 dilation 2", {2, 12, 10, 7}, ops::pool2d_params(3, 1, 1, 2)},
      {"3x3 s2 'SAME' (asymmetric)", {2, 16, 15, 24}, same},
      {"5x5 s1 p2 (SPP)", {1, 13, 13, 32}, ops::pool2d_params(5, 1, 2)},
      {"3x3 s1 p1 (NASNet; 2 channels per vector)", {2, 11, 9, 42}, ops::pool2d_params(3, 1, 1)},
  };
}

}  // namespace

TEST(PoolCuda, MaxAndAvgMatchCpu) {
  for (DType dt : kFloats) {
    for (const Case& c : cases()) {
      std::string base = engine::str(engine::dtype_name(dt), " ", c.name, " ", engine::shape_str(c.shape));
      Pool2dParams p = c.p;
      testutil::expect_cuda_matches_cpu("max_pool2d " + base,
                                        [p](const std::vector<Tensor>& in) { return ops::max_pool2d(in[0], p); },
                                        {cpu_input(c.shape, dt, -2, 2, true)});
      if (p.dilation_h != 1) continue;
      for (bool include : {true, false}) {
        p.count_include_pad = include;
        testutil::expect_cuda_matches_cpu(
            engine::str("avg_pool2d ", base, include ? " count_include_pad" : " excluding pad"),
            [p](const std::vector<Tensor>& in) { return ops::avg_pool2d(in[0], p); },
            {cpu_input(c.shape, dt, -2, 2, true)});
      }
    }
  }
}

TEST(PoolCuda, BackwardOpsAndTheirRulesMatchCpu) {
  // The backward ops as functions of g (their gradients are their rules: gather at the argmax; avg_pool2d).
  for (DType dt : {DType::f32, DType::f64}) {
    for (const Case& c : cases()) {
      const Pool2dParams p = c.p;
      Tensor x = cpu_input(c.shape, dt, -2, 2);
      Tensor indices;
      Shape ys;
      {
        Tensor xr = x.detach().set_requires_grad(true);
        Tensor y = ops::max_pool2d(xr, p);
        ys = y.shape();
        indices = y.grad_fn()->saved_tensors[0].data;
      }
      const Shape xs = c.shape;
      testutil::expect_cuda_matches_cpu(
          engine::str("max_pool2d_backward ", engine::dtype_name(dt), " ", c.name),
          [&](const std::vector<Tensor>& in) { return ops::max_pool2d_backward(in[0], in[1], xs, p); },
          {cpu_input(ys, dt, -1, 1, true), indices});
      if (p.dilation_h != 1) continue;
      testutil::expect_cuda_matches_cpu(
          engine::str("avg_pool2d_backward ", engine::dtype_name(dt), " ", c.name),
          [&](const std::vector<Tensor>& in) { return ops::avg_pool2d_backward(in[0], xs, p); },
          {cpu_input(ys, dt, -1, 1, true)});
    }
  }
}

TEST(PoolCuda, GlobalAveragePoolMatchesCpu) {
  for (DType dt : kFloats)
    testutil::expect_cuda_matches_cpu(engine::str("global_avg_pool2d ", engine::dtype_name(dt)),
                                      [](const std::vector<Tensor>& in) { return ops::global_avg_pool2d(in[0]); },
                                      {cpu_input({4, 33, 33, 256}, dt, -2, 2, true)});
}

TEST(PoolCuda, LedgerMatchesMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor x = ops::rand({2, 33, 33, 64}).set_requires_grad(true);
    Tensor a = ops::max_pool2d(x, ops::pool2d_params(3, 2, 1));
    Tensor b = ops::avg_pool2d(a, ops::pool2d_params(2, 2, 0, 1, true));
    graph::backward(ops::sum(ops::global_avg_pool2d(b)));
  });
}

// Not run by default (--gtest_also_run_disabled_tests): the ResNet stem's max pool; NASNet's 3x3 average pool
// (stride 1, padding excluded from the divisor) forward and backward at batch 32, 42^2 x 168.
TEST(PoolCuda, DISABLED_Bandwidth) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor x = testutil::to_cuda(cpu_input({32, 42, 42, 168}, dt, -2, 2));
    Pool2dParams p = ops::pool2d_params(3, 1, 1);
    p.count_include_pad = false;
    testutil::measure_bandwidth(engine::str("avg_pool2d 3x3 s1 (NASNet) ", engine::dtype_name(dt)),
                                2.0 * double(x.nbytes()), [&] { ops::avg_pool2d(x, p); });
    testutil::measure_bandwidth(engine::str("avg_pool2d_backward 3x3 s1 (NASNet) ", engine::dtype_name(dt)),
                                2.0 * double(x.nbytes()), [&] { ops::avg_pool2d_backward(x, x.shape(), p); });
  }
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor x = testutil::to_cuda(cpu_input({8, 257, 257, 64}, dt, -2, 2));
    const Pool2dParams p = ops::pool2d_params(3, 2, 1);
    const double bytes = double(x.nbytes()) * 1.25 + double(x.numel()) / 4 * 4;  // x, y, indices
    testutil::measure_bandwidth(engine::str("max_pool2d 3x3 s2 ", engine::dtype_name(dt)), bytes,
                                [&] { ops::max_pool2d(x, p); });
  }
}
