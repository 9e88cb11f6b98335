// autograd_test.cpp: the tape: accumulation, release of saved tensors during backward (visible in the
// ledger), NoGrad, retain_graph, grad() without accumulation, recompute, and the Module tree.
#include <gtest/gtest.h>

#include "engine/device.h"
#include "engine/rng.h"
#include "graph/autograd.h"
#include "graph/module.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "tests/util/gradcheck_util.h"

using engine::Category;
using engine::DType;
using engine::Tensor;

TEST(Autograd, GradientsAccumulateAcrossUsesAndCalls) {
  Tensor x = ops::from_vector(std::vector<double>{1, 2, 3}, {3}, DType::f64).set_requires_grad(true);
  Tensor y = ops::sum(ops::add(ops::mul(x, x), x));  // d/dx = 2x + 1
  graph::backward(y);
  EXPECT_EQ(x.grad().to_double(), (std::vector<double>{3, 5, 7}));
  Tensor z = ops::sum(ops::mul(x, 2.0));
  graph::backward(z);
  EXPECT_EQ(x.grad().to_double(), (std::vector<double>{5, 7, 9}));
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = testutil::rand_input({4});
  graph::NoGrad ng;
  Tensor y = ops::exp(x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
}

TEST(Autograd, BackwardTwiceNeedsRetainGraph) {
  Tensor x = testutil::rand_input({4});
  Tensor y = ops::sum(ops::exp(x));
  graph::backward(y);
  EXPECT_THROW(graph::backward(y), engine::Error);
  Tensor z = ops::sum(ops::exp(x));
  graph::backward(z, Tensor(), false, true);
  EXPECT_NO_THROW(graph::backward(z));
}

TEST(Autograd, SavedTensorsAreActivationsAndAreReleasedDuringBackward) {
  auto dev = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 28);
  engine::DeviceGuard g(dev);
  Tensor w = ops::rand({256}).set_requires_grad(true);
  w.set_category(Category::param);
  const engine::Ledger& l = dev->ledger();
  Tensor h = w;
  // Each tanh saves its output (1 KiB); each mul saves its inputs, which are w (a parameter: stays
  // `param`) and the previous tanh output (already saved). The mul outputs are saved by nobody.
  for (int i = 0; i < 4; i++) h = ops::tanh(ops::mul(h, w));
  Tensor loss = ops::sum(h);
  EXPECT_EQ(l.live_bytes(Category::activation), 4u * 1024u);
  EXPECT_EQ(l.live_bytes(Category::temp), 256u) << "only the loss scalar";
  graph::backward(loss);
  EXPECT_EQ(l.live_bytes(Category::activation), 1024u) << "only h (the last tanh output, still held) remains";
  EXPECT_EQ(l.live_bytes(Category::grad), 1024u);
  EXPECT_EQ(l.peak_bytes(Category::activation), 4u * 1024u);
}

TEST(Autograd, GradDoesNotTouchDotGrad) {
  Tensor x = testutil::rand_input({3});
  Tensor y = ops::sum(ops::mul(x, x));
  auto g = graph::grad({y}, {x});
  EXPECT_FALSE(x.grad().defined());
  std::vector<double> xv = x.to_double(), gv = g[0].to_double();
  for (int i = 0; i < 3; i++) EXPECT_DOUBLE_EQ(gv[i], 2 * xv[i]);
}

TEST(Autograd, RecomputeGivesTheSameGradientsAndSavesLess) {
  auto run = [](bool use_recompute, size_t* act_after_forward) {
    auto dev = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 28);
    engine::DeviceGuard g(dev);
    engine::manual_seed(11);
    Tensor x = ops::rand({64}, -1, 1, DType::f64).set_requires_grad(true);
    Tensor w = ops::rand({64}, -1, 1, DType::f64).set_requires_grad(true);
    graph::RecomputeFn block = [&w](const std::vector<Tensor>& in) {
      Tensor h = in[0];
      for (int i = 0; i < 3; i++) h = ops::gelu(ops::mul(h, w));
      return h;
    };
    Tensor h = use_recompute ? graph::recompute(block, {x}) : block({x});
    Tensor loss = ops::sum(ops::exp(h));
    *act_after_forward = dev->ledger().live_bytes(Category::activation);
    graph::backward(loss);
    return std::make_pair(x.grad().to_double(), w.grad().to_double());
  };
  size_t act_plain = 0, act_recompute = 0;
  auto plain = run(false, &act_plain);
  auto again = run(true, &act_recompute);
  EXPECT_EQ(plain.first, again.first);
  EXPECT_EQ(plain.second, again.second);
  EXPECT_LT(act_recompute, act_plain);
}

namespace {
struct Tiny : graph::Module {
  struct Inner : graph::Module {
    Tensor weight;
    Inner() { weight = register_parameter("weight", ops::ones({2, 3})); }
  };
  std::shared_ptr<Inner> a, b;
  Tensor bias;
  Tiny() {
    a = register_module("a", std::make_shared<Inner>());
    b = register_module("layer_b", std::make_shared<Inner>());
    bias = register_parameter("bias", ops::zeros({3}));
  }
};
}  // namespace

TEST(Module, DottedNamesAndParamCategory) {
  auto dev = engine::Device::create(engine::DeviceType::meta, size_t(1) << 20);
  engine::DeviceGuard g(dev);
  Tiny m;
  auto named = m.named_parameters("model");
  ASSERT_EQ(named.size(), 3u);
  EXPECT_EQ(named[0].first, "model.bias");
  EXPECT_EQ(named[1].first, "model.a.weight");
  EXPECT_EQ(named[2].first, "model.layer_b.weight");
  EXPECT_EQ(m.num_parameters(), 15);
  EXPECT_EQ(dev->ledger().live_bytes(Category::param), 3u * 256u);
  EXPECT_TRUE(named[1].second.requires_grad());
}

// A backward pass through a gradient (create_graph: R1, gradient penalties) runs the rules of the nodes the first
// backward recorded in Phase::backward2, the first-order nodes in Phase::backward: the ledger tells the two apart.
TEST(Autograd, TheSecondOrderBackwardHasItsOwnPhase) {
  auto device = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 24);
  engine::DeviceGuard guard(device);
  Tensor x = testutil::rand_input({64});
  Tensor y = ops::exp(ops::mul(x, x));
  Tensor g = graph::grad({ops::sum(y)}, {x}, {}, true)[0];  // its nodes are recorded inside that backward
  const int64_t from = device->ledger().sequence();
  graph::backward(ops::sum(ops::mul(g, g)));
  bool first = false, second = false;
  for (const engine::BlockInfo& b : device->ledger().history())
    if (b.alloc_seq > from) {
      first |= b.phase == engine::Phase::backward;
      second |= b.phase == engine::Phase::backward2;
    }
  EXPECT_TRUE(first) << "exp's and mul's own rules (first-order nodes) in backward";
  EXPECT_TRUE(second) << "the rules of the nodes the first backward recorded in backward2";
  EXPECT_STREQ(engine::phase_name(engine::Phase::backward2), "backward2");
  // A plain backward has none.
  Tensor z = testutil::rand_input({64});
  const int64_t from2 = device->ledger().sequence();
  graph::backward(ops::sum(ops::exp(z)));
  for (const engine::BlockInfo& b : device->ledger().history()) {
    if (b.alloc_seq > from2) {
      EXPECT_NE(b.phase, engine::Phase::backward2);
    }
  }
}
