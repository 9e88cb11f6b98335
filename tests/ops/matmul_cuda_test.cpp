// matmul_cuda_test.cpp: cuBLASLt GEMMs against the cpu reference (Eigen): plain, transposed operands,
// broadcast batches, the bias epilogue, f32 / tf32 / bf16 / f16, and the backward of linear.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/cuda/runtime.h"
#include "engine/device.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/view.h"

using engine::DType;
using engine::Tensor;

namespace {

std::shared_ptr<engine::Device> gpu() {
  static auto dev = engine::Device::create(engine::DeviceType::cuda, size_t(4) << 30);
  return dev;
}

// ||a - b|| / ||b|| over all elements.
double rel_error(const Tensor& a, const Tensor& b) {
  auto x = a.to_double(), y = b.to_double();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); i++) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

double tolerance(DType t, bool tf32) {
  if (t == DType::bf16) return 1e-2;
  if (t == DType::f16) return 2e-3;
  return tf32 ? 2e-3 : 1e-5;
}

}  // namespace

TEST(MatmulCuda, ShapesLayoutsAndDtypes) {
  struct Case {
    engine::Shape a, b;
    bool ta, tb;  // pass a transposed view (stored the other way round)
  };
  std::vector<Case> cases = {{{64, 96}, {96, 80}, false, false}, {{7, 33}, {33, 5}, true, false},
                             {{3, 4, 17, 9}, {9, 21}, false, true}, {{2, 1, 8, 16}, {3, 16, 12}, false, false},
                             {{5, 128, 64}, {5, 64, 128}, true, true}};
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (bool tf32 : {false, true}) {
      if (tf32 && t != DType::f32) continue;
      engine::set_allow_tf32(tf32);
      for (const Case& c : cases) {
        SCOPED_TRACE(engine::str(engine::dtype_name(t), tf32 ? " tf32 " : " ", engine::shape_str(c.a), " x ",
                                 engine::shape_str(c.b)));
        auto make = [&](engine::Shape s, bool transposed) {
          if (transposed) std::swap(s[s.size() - 1], s[s.size() - 2]);
          Tensor x = ops::to(ops::randn(s), t);
          return transposed ? ops::transpose(x, -1, -2) : x;
        };
        Tensor a = make(c.a, c.ta), b = make(c.b, c.tb);
        Tensor ref = ops::matmul(ops::to(a, DType::f64), ops::to(b, DType::f64));
        Tensor got = ops::matmul(ops::to_device(a, gpu()), ops::to_device(b, gpu()));
        EXPECT_LE(rel_error(got, ref), tolerance(t, tf32));
      }
    }
  }
  engine::set_allow_tf32(false);
}

// linear(x [..., in], W [out, in], bias, act) and its gradients (for an upstream gradient g) on cuda against the
// cpu, in f32 and bf16.
static void expect_linear_matches_cpu(const engine::Shape& x_shape, int64_t out,
                                      ops::Activation act = ops::Activation::none) {
  const int64_t in = x_shape.back();
  engine::Shape y_shape = x_shape;
  y_shape.back() = out;
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(engine::str(engine::dtype_name(t), " ", engine::shape_str(x_shape), " -> ", out));
    Tensor x = ops::to(ops::randn(x_shape), t), w = ops::to(ops::randn({out, in}), t),
           bias = ops::to(ops::randn({out}), t), g = ops::to(ops::randn(y_shape), t);
    auto run = [&](std::shared_ptr<engine::Device> dev) {
      Tensor xd = ops::to_device(x, dev).set_requires_grad(true), wd = ops::to_device(w, dev).set_requires_grad(true);
      Tensor bd = ops::to_device(bias, dev).set_requires_grad(true);
      Tensor y = ops::linear(xd, wd, bd, act);
      auto grads = graph::grad({y}, {xd, wd, bd}, {ops::to_device(g, dev)});
      return std::vector<Tensor>{y, grads[0], grads[1], grads[2]};
    };
    auto cpu = run(engine::default_device()), cuda = run(gpu());
    const char* names[] = {"y", "dx", "dw", "db"};
    for (int i = 0; i < 4; i++) EXPECT_LE(rel_error(cuda[i], cpu[i]), tolerance(t, false) * 2) << names[i];
  }
}

TEST(MatmulCuda, LinearWithBiasAndGradients) { expect_linear_matches_cpu({4, 10, 48}, 32); }

TEST(MatmulCuda, LinearReluMatchesCpu) {
  // relu in cuBLASLt's epilogue (RELU_BIAS), and its gradient, against the cpu's linear + max(0, .).
  expect_linear_matches_cpu({4, 10, 48}, 32, ops::Activation::relu);
  expect_linear_matches_cpu({40, 64}, 30522, ops::Activation::relu);  // padded
}

TEST(MatmulCuda, PaddedVocabularyLinearMatchesCpu) {
  // BERT's vocabulary projection at a small batch: 30522 outputs of bf16 run padded to 30528 (ops/matmul.h).
  expect_linear_matches_cpu({40, 64}, 30522);
}

TEST(MatmulCuda, StackedLinearMatchesCpu) {
  // q, k and v projected at once (ops::linear with stacked weights) and its gradients, cuda against the cpu.
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(engine::dtype_name(t));
    engine::manual_seed(12);
    Tensor x = ops::to(ops::randn({3, 17, 64}), t), g = ops::to(ops::randn({3, 17, 96}), t);
    std::vector<Tensor> ws, bs;
    for (int i = 0; i < 3; i++) {
      ws.push_back(ops::to(ops::randn({32, 64}), t));
      bs.push_back(ops::to(ops::randn({32}), t));
    }
    auto run = [&](std::shared_ptr<engine::Device> dev) {
      std::vector<Tensor> in{ops::to_device(x, dev).set_requires_grad(true)};
      for (const Tensor& w : ws) in.push_back(ops::to_device(w, dev).set_requires_grad(true));
      for (const Tensor& b : bs) in.push_back(ops::to_device(b, dev).set_requires_grad(true));
      Tensor y = ops::linear(in[0], {in[1], in[2], in[3]}, {in[4], in[5], in[6]});
      std::vector<Tensor> out = graph::grad({y}, in, {ops::to_device(g, dev)});
      out.insert(out.begin(), y);
      return out;
    };
    auto cpu = run(engine::default_device()), cuda = run(gpu());
    for (size_t i = 0; i < cpu.size(); i++) EXPECT_LE(rel_error(cuda[i], cpu[i]), tolerance(t, false) * 2) << i;
  }
}

TEST(MatmulCuda, AllocatesLikeMeta) {
  auto meta = engine::Device::create(engine::DeviceType::meta, size_t(4) << 30);
  auto cuda = engine::Device::create(engine::DeviceType::cuda, size_t(1) << 30);
  for (auto dev : {meta, cuda}) {
    engine::DeviceGuard g(dev);
    Tensor a = ops::randn({8, 64, 32}), b = ops::randn({32, 16});
    Tensor c = ops::matmul(a, b);
    Tensor d = ops::linear(c, ops::randn({24, 16}), ops::randn({24}));
    Tensor e = ops::linear(c, {ops::randn({24, 16}), ops::randn({8, 16})}, {ops::randn({24}), ops::randn({8})});
    Tensor r = ops::linear(c, ops::randn({24, 16}), ops::randn({24}), ops::Activation::relu);
  }
  EXPECT_EQ(cuda->ledger().events_csv(), meta->ledger().events_csv());
}
