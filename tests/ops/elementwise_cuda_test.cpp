// elementwise_cuda_test.cpp: every elementwise kernel on the GPU against the cpu reference: outputs and
// gradients (and second derivatives through unary_d2) in f32, f64, bf16, f16, over dense, broadcast,
// inner-dense, transposed and misaligned layouts (the dense, inner-vectorized and strided kernels); comparisons,
// casts between
// every pair of dtypes, fills and in-place updates exactly; and the ledger of a GPU run equal to meta's.
#include <gtest/gtest.h>

#include "graph/autograd.h"
#include "ops/dropout.h"
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
using testutil::to_cuda;

namespace {

const DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
const DType kAll[] = {DType::f32, DType::f64, DType::bf16, DType::f16,
                      DType::i32, DType::i64, DType::u8,   DType::boolean};

std::string name(const char* op, DType dtype, const char* layout) {
  return engine::str(op, " ", engine::dtype_name(dtype), " ", layout);
}

// Small non-negative values of any dtype (bool: 0/1), with many ties.
Tensor small_values(const Shape& shape, DType dtype, int64_t high = 4) {
  Tensor t = ops::randint(shape, dtype == DType::boolean ? 2 : high, DType::i64);
  return ops::to(t, dtype);
}

struct UnaryCase {
  const char* name;
  ops::UnaryOp op;
  double alpha, beta, low, high;
  bool second;  // has a nonzero second derivative (checked through double backward)
};

const UnaryCase kUnary[] = {
    {"affine", ops::UnaryOp::affine, 1.5, -0.25, -2, 2, false},
    {"exp", ops::UnaryOp::exp, 0, 0, -2, 2, true},
    {"log", ops::UnaryOp::log, 0, 0, 0.5, 2, true},
    {"sqrt", ops::UnaryOp::sqrt, 0, 0, 0.5, 2, true},
    {"rsqrt", ops::UnaryOp::rsqrt, 0, 0, 0.5, 2, true},
    {"tanh", ops::UnaryOp::tanh, 0, 0, -2, 2, true},
    {"sigmoid", ops::UnaryOp::sigmoid, 0, 0, -3, 3, true},
    {"relu", ops::UnaryOp::relu, 0, 0, -2, 2, false},
    {"leaky_relu", ops::UnaryOp::leaky_relu, 0.1, 0, -2, 2, false},
    {"gelu", ops::UnaryOp::gelu, 0, 0, -3, 3, true},
    {"gelu_tanh", ops::UnaryOp::gelu_tanh, 0, 0, -3, 3, true},
    {"pow", ops::UnaryOp::pow, 2.5, 0, 0.5, 2, true},
    {"erf", ops::UnaryOp::erf, 0, 0, -2, 2, true},
    {"softplus", ops::UnaryOp::softplus, 0, 0, -3, 3, true},
};

}  // namespace

TEST(ElementwiseCuda, BinaryOpsMatchCpuOnEveryLayout) {
  const std::pair<const char*, ops::BinaryOp> ops_[] = {
      {"add", ops::BinaryOp::add}, {"sub", ops::BinaryOp::sub}, {"mul", ops::BinaryOp::mul},
      {"div", ops::BinaryOp::div}, {"maximum", ops::BinaryOp::maximum}, {"minimum", ops::BinaryOp::minimum}};
  for (DType dt : kFloats) {
    for (auto [op_name, op] : ops_) {
      auto bin = [op = op](const std::vector<Tensor>& in) { return ops::binary(op, in[0], in[1]); };
      // dense, 7 * 131 elements: 16-byte packs and a scalar tail
      expect_cuda_matches_cpu(name(op_name, dt, "dense"), bin,
                              {cpu_input({7, 131}, dt, -1, 1, true), cpu_input({7, 131}, dt, 0.5, 2, true)});
      // NumPy broadcasting both ways: [4, 1, 33] op [5, 1] -> [4, 5, 33]
      expect_cuda_matches_cpu(name(op_name, dt, "broadcast"), bin,
                              {cpu_input({4, 1, 33}, dt, -1, 1, true), cpu_input({5, 1}, dt, 0.5, 2, true)});
      // the innermost dimension dense or broadcast: 16-byte packs along it (a bias row, a per-row scale,
      // columns 8..71 of a wider tensor)
      expect_cuda_matches_cpu(name(op_name, dt, "bias row"), bin,
                              {cpu_input({6, 64}, dt, -1, 1, true), cpu_input({64}, dt, 0.5, 2, true)});
      expect_cuda_matches_cpu(name(op_name, dt, "per-row scale"), bin,
                              {cpu_input({6, 64}, dt, -1, 1, true), cpu_input({6, 1}, dt, 0.5, 2, true)});
      expect_cuda_matches_cpu(
          name(op_name, dt, "column slice"),
          [op = op](const std::vector<Tensor>& in) { return ops::binary(op, ops::slice(in[0], 1, 8, 72), in[1]); },
          {cpu_input({6, 72}, dt, -1, 1, true), cpu_input({6, 64}, dt, 0.5, 2, true)});
      // a transposed view
      expect_cuda_matches_cpu(
          name(op_name, dt, "transposed"),
          [op = op](const std::vector<Tensor>& in) { return ops::binary(op, ops::transpose(in[0], 0, 1), in[1]); },
          {cpu_input({33, 6}, dt, -1, 1, true), cpu_input({6, 33}, dt, 0.5, 2, true)});
      // dense but starting one element into its storage: not 16-byte aligned, the scalar path
      expect_cuda_matches_cpu(
          name(op_name, dt, "misaligned"),
          [op = op](const std::vector<Tensor>& in) { return ops::binary(op, ops::slice(in[0], 0, 1, 1001), in[1]); },
          {cpu_input({1001}, dt, -1, 1, true), cpu_input({1000}, dt, 0.5, 2, true)});
    }
  }
}

TEST(ElementwiseCuda, UnaryOpsAndTheirDerivativesMatchCpu) {
  for (DType dt : kFloats) {
    for (const UnaryCase& c : kUnary) {
      auto f = [&c](const std::vector<Tensor>& in) { return ops::unary(c.op, in[0], c.alpha, c.beta); };
      expect_cuda_matches_cpu(name(c.name, dt, "dense"), f, {cpu_input({3, 257}, dt, c.low, c.high, true)});
      expect_cuda_matches_cpu(name(c.name, dt, "transposed"),
                              [&c](const std::vector<Tensor>& in) {
                                return ops::unary(c.op, ops::transpose(in[0], 0, 1), c.alpha, c.beta);
                              },
                              {cpu_input({19, 5}, dt, c.low, c.high, true)});
      // Second derivatives (unary_backward's rule, unary_d2's kernel): the gradient g * f'(x) with
      // create_graph is itself differentiated by the helper. f32 and f64: in 16-bit types each of the
      // chained ops rounds, and the comparison would measure that rounding more than the kernels.
      if (c.second && (dt == DType::f32 || dt == DType::f64)) {
        expect_cuda_matches_cpu(
            name(c.name, dt, "double backward"),
            [&c](const std::vector<Tensor>& in) {
              Tensor y = ops::unary(c.op, in[0], c.alpha, c.beta);
              return graph::grad({y}, {in[0]}, {in[1]}, true)[0];
            },
            {cpu_input({4, 65}, dt, c.low, c.high, true), cpu_input({4, 65}, dt, -1, 1)});
      }
    }
  }
}

TEST(ElementwiseCuda, LargeTensorsCrossTheGridStrideLoop) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t n = (int64_t(1) << 20) + 3;
    expect_cuda_matches_cpu(name("add", dt, "1M"), [](const std::vector<Tensor>& in) { return ops::add(in[0], in[1]); },
                            {cpu_input({n}, dt), cpu_input({n}, dt)});
    expect_cuda_matches_cpu(name("gelu", dt, "1M"), [](const std::vector<Tensor>& in) { return ops::gelu(in[0]); },
                            {cpu_input({n}, dt, -3, 3, true)});
  }
}

TEST(ElementwiseCuda, ComparisonsAreExactForEveryDtype) {
  const ops::CompareOp cmp[] = {ops::CompareOp::gt, ops::CompareOp::ge, ops::CompareOp::lt,
                                ops::CompareOp::le, ops::CompareOp::eq, ops::CompareOp::ne};
  for (DType dt : kAll) {
    Tensor a = small_values({6, 1, 9}, dt), b = small_values({5, 1}, dt);
    for (ops::CompareOp op : cmp) {
      std::string what = engine::str("compare ", int(op), " ", engine::dtype_name(dt));
      testutil::expect_equal(what + " broadcast", ops::compare(op, a, b), ops::compare(op, to_cuda(a), to_cuda(b)));
      testutil::expect_equal(what + " scalar 2", ops::compare(op, a, 2.0), ops::compare(op, to_cuda(a), 2.0));
      Tensor at = ops::transpose(a, 0, 2);
      testutil::expect_equal(what + " scalar 0.5 transposed", ops::compare(op, at, 0.5),
                             ops::compare(op, ops::transpose(to_cuda(a), 0, 2), 0.5));
    }
  }
}

TEST(ElementwiseCuda, CastsBetweenEveryPairOfDtypesAreExact) {
  for (DType from : kAll) {
    // Values every dtype holds: [0, 100) (bool: 0/1), fractional for floating sources.
    Tensor x = engine::is_floating(from) ? cpu_input({3, 67}, from, 0, 100) : small_values({3, 67}, from, 100);
    Tensor xc = to_cuda(x);
    for (DType to : kAll) {
      std::string what = engine::str("cast ", engine::dtype_name(from), " -> ", engine::dtype_name(to));
      testutil::expect_equal(what, ops::to(x, to), ops::to(xc, to));
      testutil::expect_equal(what + " transposed", ops::to(ops::transpose(x, 0, 1), to),
                             ops::to(ops::transpose(xc, 0, 1), to));
    }
  }
  // Same-dtype copies move bits: i64 values beyond 2^53 survive a strided clone.
  std::vector<int64_t> big = {(int64_t(1) << 60) + 1, -7, (int64_t(1) << 62) - 3, 5, -(int64_t(1) << 55) - 1, 9};
  Tensor t = ops::from_vector(big, {2, 3});
  Tensor back = testutil::to_cpu(ops::clone(ops::transpose(to_cuda(t), 0, 1)));  // [3, 2]
  const int64_t* p = back.data<int64_t>();
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++)
      EXPECT_EQ(p[i * 2 + j], big[size_t(j * 3 + i)]) << "i64 clone at [" << i << ", " << j << "]";
}

TEST(ElementwiseCuda, CopyIntoStridedAndBroadcastViews) {
  for (DType dt : kFloats) {
    Tensor src = cpu_input({5}, dt);
    Tensor src16 = ops::to(cpu_input({5}, DType::f32), DType::bf16);
    Tensor dst = ops::full({5, 7}, -1.0, dt), dst_c = to_cuda(dst);
    {
      graph::NoGrad ng;
      ops::copy_(ops::transpose(dst, 0, 1), src);  // [7, 5] view of [5, 7]; src broadcast along rows
      ops::copy_(ops::transpose(dst_c, 0, 1), to_cuda(src));
      ops::copy_(ops::slice(dst, 1, 0, 7, 3), ops::unsqueeze(src16, 1));  // columns 0, 3, 6, with a cast
      ops::copy_(ops::slice(dst_c, 1, 0, 7, 3), ops::unsqueeze(to_cuda(src16), 1));
    }
    testutil::expect_equal(name("copy_", dt, "strided"), dst, dst_c);
  }
}

TEST(ElementwiseCuda, FillsAreExact) {
  for (DType dt : kAll) {
    const double v = dt == DType::boolean ? 1.0 : engine::is_floating(dt) ? 2.71828 : 7.0;
    testutil::expect_equal(engine::str("full ", engine::dtype_name(dt)), ops::full({3, 37}, v, dt),
                           ops::full({3, 37}, v, dt, testutil::cuda_device()));
    Tensor a = small_values({6, 10}, dt), ac = to_cuda(a);
    ops::fill_(ops::slice(a, 1, 1, 10, 2), v);  // every other column: a strided fill
    ops::fill_(ops::slice(ac, 1, 1, 10, 2), v);
    testutil::expect_equal(engine::str("fill_ strided ", engine::dtype_name(dt)), a, ac);
  }
}

TEST(ElementwiseCuda, InPlaceAddAndScaleMatchCpu) {
  graph::NoGrad ng;
  for (DType dt : kFloats) {
    Tensor a = cpu_input({4, 33}, dt), b = cpu_input({33}, dt), ac = to_cuda(a);
    ops::add_(a, b, -0.5);  // b broadcast over rows
    ops::add_(ac, to_cuda(b), -0.5);
    ops::mul_(a, 1.25);
    ops::mul_(ac, 1.25);
    testutil::expect_close(name("add_/mul_", dt, "dense"), a, ac);
    Tensor t = cpu_input({33, 4}, dt), tc = to_cuda(t);
    ops::add_(ops::transpose(t, 0, 1), a, 2.0);  // a strided destination
    ops::add_(ops::transpose(tc, 0, 1), ac, 2.0);
    ops::mul_(ops::transpose(t, 0, 1), -3.0);
    ops::mul_(ops::transpose(tc, 0, 1), -3.0);
    testutil::expect_close(name("add_/mul_", dt, "strided"), t, tc);
  }
}

TEST(ElementwiseCuda, LedgerOfAGpuRunEqualsMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor x = ops::rand({64, 33}).set_requires_grad(true);
    Tensor b = ops::rand({33}, -1, 1);
    Tensor y = ops::gelu(ops::add(x, b));
    Tensor z = ops::to(ops::mul(y, ops::sigmoid(y)), DType::bf16);
    Tensor loss = ops::sum(ops::to(z, DType::f32));
    graph::backward(loss);
    graph::NoGrad ng;
    ops::add_(x, x.grad(), -0.1);
    ops::fill_(b, 0.0);
  });
}

// Perf mode (--gtest_also_run_disabled_tests): GB/s of the memory-bound kernels on 64M-element tensors,
// bytes counted as each input read once plus the output written once (copy ceiling on an H200: 4.3 TB/s).
TEST(ElementwiseCuda, DISABLED_Bandwidth) {
  graph::NoGrad ng;
  auto dev = testutil::cuda_device();
  const int64_t n = int64_t(1) << 26;
  for (DType dt : {DType::f32, DType::bf16}) {
    const double e = double(engine::dtype_size(dt));
    Tensor a = ops::rand({n}, -1, 1, dt, dev), b = ops::rand({n}, -1, 1, dt, dev);
    Tensor rows = ops::reshape(a, {n / 1024, 1024}), bias = ops::rand({1024}, -1, 1, dt, dev);
    std::string t = engine::dtype_name(dt);
    testutil::measure_bandwidth("add dense " + t, 3 * e * n, [&] { ops::add(a, b); });
    testutil::measure_bandwidth("add bias [65536, 1024] + [1024] " + t, 2 * e * n, [&] { ops::add(rows, bias); });
    testutil::measure_bandwidth("gelu " + t, 2 * e * n, [&] { ops::gelu(a); });
    testutil::measure_bandwidth("gelu backward " + t, 3 * e * n,
                                [&] { ops::unary_backward(ops::UnaryOp::gelu, a, b); });
    testutil::measure_bandwidth("transpose copy [8192, 8192] " + t, 2 * e * n,
                                [&] { ops::contiguous(ops::transpose(ops::reshape(a, {8192, 8192}), 0, 1)); });
    testutil::measure_bandwidth("cast to f32/bf16 " + t, (e + (dt == DType::f32 ? 2 : 4)) * n,
                                [&] { ops::to(a, dt == DType::f32 ? DType::bf16 : DType::f32); });
    testutil::measure_bandwidth("add_ (in place) " + t, 3 * e * n, [&] { ops::add_(a, b, 1e-3); });
    testutil::measure_bandwidth("sum rows [65536, 1024] -> [65536] " + t, e * n, [&] { ops::sum(rows, {1}); });
    testutil::measure_bandwidth("sum cols [65536, 1024] -> [1024] " + t, e * n, [&] { ops::sum(rows, {0}); });
    testutil::measure_bandwidth("sum all " + t, e * n, [&] { ops::sum(a); });
    testutil::measure_bandwidth("argmax rows [65536, 1024] " + t, e * n, [&] { ops::argmax(rows, 1); });
    testutil::measure_bandwidth("dropout p 0.1 " + t, 2 * e * n, [&] { ops::dropout(a, 0.1); });
  }
}
