// accumulate_test.cpp: gradient accumulation (--accumulate K, Model::set_accumulation) and the finder's largest
// micro-batch for a global batch (--find-max-batch --global-batch G, tools::find_micro_batch).
// The references: one step over the whole batch (the same examples) for the weights; the ledger's own gradient
// bytes for the peak; probes of the neighbouring micro-batches for the finder's answer.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/device.h"
#include "models/registry.h"
#include "ops/factory.h"
#include "tests/util/error_util.h"
#include "tests/util/meta_util.h"
#include "tools/max_batch.h"

using engine::DeviceType;
using models::ModelConfig;

namespace {

// A fixed transformer_lm batch of `n` sequences of 32 tokens (the tiny model's shapes): ids and next-token targets.
models::Batch lm_batch(int64_t n) {
  std::mt19937_64 rng(7);
  std::vector<int64_t> ids(size_t(n * 32)), targets(size_t(n * 32));
  for (size_t i = 0; i < ids.size(); i++) {
    ids[i] = int64_t(rng() % 64);
    targets[i] = int64_t(rng() % 64);
  }
  return {{"ids", ops::from_vector(ids, {n, 32}, engine::DType::i64)},
          {"targets", ops::from_vector(targets, {n * 32}, engine::DType::i64)}};
}

// The arena a training run of `c` (steps 1 and 2, as a probe runs) needs on meta: its high water.
size_t arena_needed(const ModelConfig& c) {
  auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
  engine::DeviceGuard guard(device);
  auto model = models::create_model(c);
  for (int64_t step = 1; step <= 2; step++) model->train_step(step);
  return device->ledger().high_water();
}

std::map<std::string, std::vector<double>> weights(models::Model& m) {
  std::map<std::string, std::vector<double>> w;
  for (const auto& [name, p] : m.module().named_parameters()) w[name] = p.to_double();
  return w;
}

}  // namespace

TEST(Accumulate, FourMicroBatchesUpdateLikeTheWholeBatch) {
  // SGD (no per-element normalization to amplify rounding), dropout 0: the update of 4 micro-batches of 2 equals
  // that of the batch of 8 up to f32 rounding of the summed gradients.
  auto device = engine::Device::create(DeviceType::cpu, size_t(1) << 30);
  engine::DeviceGuard guard(device);
  ModelConfig c;
  c.name = "transformer_lm";
  c.optimizer = "sgd";
  auto whole = models::create_model(c);
  c.accumulate = 4;
  auto micro = models::create_model(c);
  EXPECT_EQ(micro->accumulation(), 4);
  const auto before = weights(*whole);
  EXPECT_EQ(before, weights(*micro));  // the same seed: the same initial weights
  whole->set_fixed_batch(lm_batch(8));
  micro->set_fixed_batch(lm_batch(8));
  for (int64_t step = 1; step <= 3; step++) {
    const models::StepResult a = whole->train_step(step), b = micro->train_step(step);
    EXPECT_EQ(a.items, 8);
    EXPECT_EQ(b.items, 8);
    EXPECT_NEAR(a.loss, b.loss, 1e-5) << "step " << step << ": the mean of the micro-batch losses";
  }
  const auto w_whole = weights(*whole), w_micro = weights(*micro);
  double moved = 0;
  for (const auto& [name, w] : w_whole) {
    const std::vector<double>& v = w_micro.at(name);
    for (size_t i = 0; i < w.size(); i++) {
      moved = std::max(moved, std::fabs(w[i] - before.at(name)[i]));
      ASSERT_NEAR(v[i], w[i], 1e-6 * (1 + std::fabs(w[i]))) << name << "[" << i << "]";
    }
  }
  EXPECT_GT(moved, 1e-4) << "the updates were too small for the comparison to mean anything";
}

TEST(Accumulate, PeakIsTheMicroBatchsPlusAtMostOneGradientSet) {
  auto peak = [](int64_t accumulate, size_t* grads) {
    auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
    engine::DeviceGuard guard(device);
    ModelConfig c;
    c.name = "bert_base";
    c.size = "tiny";
    c.batch = 4;
    c.accumulate = accumulate;
    auto model = models::create_model(c);
    for (int64_t step = 1; step <= 2; step++) model->train_step(step);
    *grads = device->ledger().live_bytes(engine::Category::param);  // f32: each gradient has its parameter's bytes
    return device->ledger().peak_bytes();
  };
  size_t grads = 0;
  const size_t one = peak(1, &grads), four = peak(4, &grads), two = peak(2, &grads);
  EXPECT_GT(four, one);
  EXPECT_LE(four, one + grads);
  EXPECT_GT(four, one + grads / 2) << "most of the gradient set should be live at the accumulated peak";
  EXPECT_EQ(four, two) << "beyond two micro-batches the count does not change the peak";
  testutil::expect_meta_allocates_like_cpu([] {
    ModelConfig c;
    c.name = "bert_base";
    c.size = "tiny";
    c.batch = 2;
    c.accumulate = 3;
    auto model = models::create_model(c);
    for (int64_t step = 1; step <= 2; step++) model->train_step(step);
  });
}

TEST(Accumulate, ModelsThatCannotAndBatchesThatDoNotSplitAreErrors) {
  auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
  engine::DeviceGuard guard(device);
  ModelConfig c;
  c.name = "stylegan";  // a GAN step is two networks' updates of its own
  c.size = "tiny";
  c.accumulate = 2;
  EXPECT_ERROR_HAS(models::create_model(c), "cannot accumulate micro-batches");
  c.name = "transformer_lm";
  c.size = "";
  c.accumulate = 0;
  EXPECT_ERROR_HAS(models::create_model(c), "--accumulate 0", "1 (no accumulation) to 4096");
  c.accumulate = 3;
  auto model = models::create_model(c);
  model->set_fixed_batch(lm_batch(8));
  EXPECT_ERROR_HAS(model->train_step(1), "has 8 rows, which do not split into 3 equal micro-batches");
}

TEST(Accumulate, FinderGivesTheLargestMicroBatchThatDividesTheGlobalBatch) {
  ModelConfig c;
  c.name = "bert_base";
  c.size = "tiny";
  const int64_t global = 24;
  // An arena that holds a micro-batch of 7 under accumulation: 7 does not divide 24, 6 does.
  ModelConfig seven = c;
  seven.accumulate = 2;
  seven.batch = 7;
  // (1% more than the high water at 1 TiB: the allocator's placements in a tight arena differ a little.)
  const size_t capacity = arena_needed(seven) / 100 * 101;
  const tools::MicroBatchResult r = tools::find_micro_batch(c, DeviceType::meta, capacity, global);
  EXPECT_FALSE(r.whole.fits);
  EXPECT_EQ(r.search.largest_fit, 7);
  ASSERT_EQ(r.micro, 6);
  EXPECT_EQ(global % r.micro, 0);
  EXPECT_EQ(r.micro * r.accumulate, global);
  EXPECT_TRUE(r.check.fits);
  // The next divisor up does not fit with accumulation.
  int64_t next = r.micro + 1;
  while (global % next != 0) next++;
  ASSERT_LT(next, global);
  ModelConfig acc = c;
  acc.accumulate = global / next;
  EXPECT_FALSE(tools::probe_batch(acc, DeviceType::meta, capacity, next, 2).fits) << "micro-batch " << next;
  const std::string text = tools::describe_micro_batch(r, capacity, {});
  EXPECT_NE(text.find("largest micro-batch: " + std::to_string(r.micro) + " seq x " + std::to_string(r.accumulate)),
            std::string::npos)
      << text;
  // An arena large enough: the whole batch, no accumulation.
  ModelConfig whole_batch = c;
  whole_batch.batch = global;
  const size_t whole = arena_needed(whole_batch);
  const tools::MicroBatchResult all = tools::find_micro_batch(c, DeviceType::meta, whole, global);
  EXPECT_EQ(all.micro, global);
  EXPECT_EQ(all.accumulate, 1);
}
