// parameter_shards_test.cpp: ZeRO-3's units (graph/parameter_shards.h) on a small stack: which modules are units,
// that training through the shards gives the gradients of the whole parameters, that a rank holds only its shards,
// the root and the layer in flight, and that a parameter read while released is an Error naming it.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/allocator.h"
#include "engine/device.h"
#include "engine/dist.h"
#include "engine/rng.h"
#include "graph/autograd.h"
#include "graph/data_parallel.h"
#include "graph/module.h"
#include "graph/parameter_shards.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/view.h"

using engine::Category;
using engine::Tensor;

namespace {

constexpr int64_t kWidth = 16;
constexpr size_t kMatrix = kWidth * kWidth * 4, kVector = kWidth * 4;  // f32 bytes

// Each forward notes the parameter bytes live while it runs.
struct Layer : graph::Module {
  Tensor weight, bias;
  std::vector<size_t>* live_params;
  explicit Layer(std::vector<size_t>* seen) : live_params(seen) {
    weight = register_parameter("weight", ops::mul(ops::rand({kWidth, kWidth}), 0.5));
    bias = register_parameter("bias", ops::rand({kWidth}));
  }
  Tensor forward(const Tensor& h) {
    auto s = scope();
    live_params->push_back(weight.device().ledger().live_bytes(Category::param));
    return ops::tanh(ops::linear(h, weight, bias));
  }
};

// embed (the root's) is used twice, before and after the stack (a tied input and output matrix).
struct Stack : graph::Module {
  Tensor embed;
  std::vector<std::shared_ptr<Layer>> layers;
  std::vector<size_t> live_params;
  Stack() {
    embed = register_parameter("embed", ops::rand({kWidth, kWidth}));
    for (int i = 0; i < 3; i++)
      layers.push_back(register_module("layers." + std::to_string(i), std::make_shared<Layer>(&live_params)));
    tag_memory();
  }
  Tensor loss(const Tensor& x) {
    auto s = scope();
    Tensor h = ops::matmul(x, embed);
    for (auto& l : layers) h = l->forward(h);
    return ops::sum(ops::matmul(h, ops::transpose(embed, 0, 1)));
  }
};

// What the arena holds for `bytes` (each block is rounded up).
size_t held(size_t bytes) { return engine::Allocator::round_up(bytes); }
size_t held_shards(const graph::ParameterShards& shards, size_t params) {
  size_t n = 0;
  for (size_t k = 0; k < params; k++) n += shards.stored(k).defined() ? held(shards.stored(k).nbytes()) : 0;
  return n;
}

// `net` sharded over `world` ranks of a meta communicator, this process being rank 0: the reducer of its parameters
// (ZeRO stage 3) and its shards, which the reducer tells of every complete gradient.
struct Sharded {
  std::shared_ptr<engine::dist::Communicator> comm;
  graph::GradientReducer reducer;
  graph::ParameterShards shards;
  Sharded(Stack& net, int world)
      : comm(engine::dist::meta_world(world, 0)),
        reducer(comm, net.named_parameters(), graph::kDefaultBucketBytes, 3),
        shards(comm, reducer, net) {
    reducer.set_parameter_shards(&shards);
  }
};

std::vector<std::vector<double>> gradients(const graph::Module& m) {
  std::vector<std::vector<double>> g;
  for (const auto& [name, p] : m.named_parameters()) g.push_back(p.grad().to_double());
  return g;
}

}  // namespace

TEST(ParameterShards, UnitsAreTheNumberedLayersAndTheRestIsTheRoot) {
  auto dev = engine::Device::create(engine::DeviceType::meta, size_t(1) << 30);
  engine::DeviceGuard guard(dev);
  Stack net;
  Sharded sharded(net, 2);
  const graph::ParameterShards& shards = sharded.shards;
  ASSERT_EQ(shards.units().size(), 4u);
  EXPECT_EQ(shards.units()[0].name, "");
  EXPECT_EQ(shards.units()[0].bytes, kMatrix);
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(shards.units()[size_t(i) + 1].name, "layers." + std::to_string(i));
    EXPECT_EQ(shards.units()[size_t(i) + 1].bytes, kMatrix + kVector);
  }
  // Rank 0 of 2 owns the first half of the 4 x 256 + 3 x 16 elements laid end to end: embed, layers.0 and half of
  // layers.1.weight (the boundary is at element 536 = 256 + 272 + 8).
  EXPECT_EQ(shards.shard_bytes(), (4 * kWidth * kWidth + 3 * kWidth) / 2 * 4);
  for (const auto& [name, p] : net.named_parameters()) EXPECT_TRUE(p.storage()->released()) << name;
}

// A world of one: rank 0 owns every piece, so each gather copies the shard back whole. The gradients (and the loss)
// are those of the same network trained without shards, bit for bit, and every parameter is released after.
TEST(ParameterShards, TrainingThroughTheShardsGivesTheWholeParametersGradients) {
  auto dev = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 26);
  engine::DeviceGuard guard(dev);
  engine::generator().seed = 5, engine::generator().offset = 0;
  const Tensor x = ops::rand({4, kWidth});
  std::vector<double> want;
  std::vector<std::vector<double>> want_gradients;
  {
    engine::generator().seed = 5, engine::generator().offset = 64;
    Stack plain;
    const Tensor loss = plain.loss(x);
    graph::backward(loss);
    want = loss.to_double();
    want_gradients = gradients(plain);
  }
  engine::generator().seed = 5, engine::generator().offset = 64;
  Stack sharded;

  Sharded world(sharded, 1);
  world.shards.gather_root();
  Tensor got;
  world.reducer.reduce_during([&] {
    got = sharded.loss(x);
    graph::backward(got);
  });
  EXPECT_EQ(got.to_double(), want);
  EXPECT_EQ(gradients(sharded), want_gradients);
  for (const auto& [name, p] : sharded.named_parameters()) EXPECT_TRUE(p.storage()->released()) << name;
  EXPECT_EQ(dev->ledger().live_bytes(Category::param), held_shards(world.shards, 7));
}

// Two ranks on meta (rank 0): while layer i runs, the parameters live are the shards, the root and layer i only.
TEST(ParameterShards, ARankHoldsItsShardsTheRootAndTheLayerInFlight) {
  auto dev = engine::Device::create(engine::DeviceType::meta, size_t(1) << 30);
  engine::DeviceGuard guard(dev);
  Stack net;
  Sharded world(net, 2);
  graph::ParameterShards& shards = world.shards;
  const engine::Ledger& ledger = dev->ledger();
  // Rank 0's pieces: embed, layers.0 and the first 8 elements of layers.1.weight, each a block.
  const size_t mine = held(kMatrix) + held(kMatrix) + held(kVector) + held(8 * 4);
  EXPECT_EQ(held_shards(shards, 7), mine);
  EXPECT_EQ(ledger.live_bytes(Category::param), mine);
  shards.gather_root();
  const Tensor x = ops::rand({4, kWidth});
  world.reducer.reduce_during([&] { graph::backward(net.loss(x)); });
  ASSERT_EQ(net.live_params.size(), 3u);
  for (size_t n : net.live_params) EXPECT_EQ(n, mine + held(kMatrix) + held(kMatrix) + held(kVector));
  EXPECT_EQ(ledger.live_bytes(Category::param), mine);
}

TEST(ParameterShards, AParameterReadWhileReleasedIsAnErrorNamingIt) {
  for (auto type : {engine::DeviceType::cpu, engine::DeviceType::meta}) {
    auto dev = engine::Device::create(type, size_t(1) << 26);
    engine::DeviceGuard guard(dev);
    Stack net;
    Sharded world(net, 2);
    // A layer's weight used outside the layer's forward (on cpu the kernel's read fails; on meta, where no kernel
    // reads, the op's recording does).
    try {
      ops::sum(net.layers[1]->weight);
      FAIL() << "no error";
    } catch (const engine::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'layers.1.weight' was read while ZeRO-3 had it released"),
                std::string::npos)
          << e.what();
    }
  }
}
