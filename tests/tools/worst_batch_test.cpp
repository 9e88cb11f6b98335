// worst_batch_test.cpp: the max-batch finder over a whole epoch of a data set (engine_train --find-max-batch
// --data: MaxBatchOptions::whole_epoch) for a token-batched model: the answer N trains the whole epoch, N + 1 runs
// out of memory at exactly the batch the finder names; and the models that have such batches say so.
#include <gtest/gtest.h>

#include <random>

#include "engine/device.h"
#include "models/registry.h"
#include "tests/util/temp_dir.h"
#include "tools/max_batch.h"

using engine::DeviceType;

namespace {

// A parallel corpus of `pairs` sentence pairs of 1 to 40 words (ids 5-20 of a 21-word vocabulary), seeded: its
// batches differ in sentences x lengths, so the worst batch of an epoch is not the first.
std::string write_corpus(const testutil::TempDir& dir, int pairs) {
  std::mt19937_64 rng(11);
  std::string src, tgt, vocab = "<s>\n<pad>\n</s>\n<unk>\n<mask>\n";
  for (int w = 5; w < 21; w++) vocab += "w" + std::to_string(w) + "\n";
  auto sentence = [&](int64_t n) {
    std::string s;
    for (int64_t i = 0; i < n; i++) s += (i ? " " : "") + std::to_string(5 + rng() % 16);
    return s + "\n";
  };
  for (int i = 0; i < pairs; i++) {
    const int64_t n = 1 + int64_t(rng() % 40);
    src += sentence(n);
    tgt += sentence(std::max<int64_t>(1, n + int64_t(rng() % 7) - 3));
  }
  dir.write("corpus.src", src);
  dir.write("corpus.tgt", tgt);
  dir.write("corpus.vocab", vocab);
  return dir.file("corpus");
}

// Trains `c` at `tokens` through the probe schedule and then the epoch; returns the step that ran out of memory,
// or 0 when every step fit.
int64_t first_step_out_of_memory(models::ModelConfig c, size_t capacity, int64_t tokens) {
  c.tokens = tokens;
  auto device = engine::Device::create(DeviceType::meta, capacity);
  engine::DeviceGuard guard(device);
  auto model = models::create_model(c);
  std::vector<int64_t> steps = model->probe_schedule();
  const std::vector<int64_t> epoch = model->epoch_steps();
  steps.insert(steps.end(), epoch.begin(), epoch.end());
  for (int64_t step : steps) {
    try {
      model->train_step(step);
    } catch (const engine::OutOfMemory&) {
      return step;
    }
  }
  return 0;
}

}  // namespace

TEST(WorstBatch, TheAnswerTrainsTheWholeEpochAndOneMoreFailsAtTheNamedBatch) {
  testutil::TempDir dir;
  models::ModelConfig c;
  c.name = "transformer_big";
  c.size = "tiny";
  c.data = write_corpus(dir, 300);
  ASSERT_TRUE(tools::batches_vary(c));
  // An arena that holds a whole epoch at a budget of 600 tokens (1% above its high water at 1 TiB).
  size_t capacity = 0;
  {
    models::ModelConfig at600 = c;
    at600.tokens = 600;
    auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
    engine::DeviceGuard guard(device);
    auto model = models::create_model(at600);
    std::vector<int64_t> steps = model->probe_schedule();
    for (int64_t s : model->epoch_steps()) steps.push_back(s);
    EXPECT_GT(model->epoch_steps().size(), 5u) << "the corpus should make several batches";
    for (int64_t s : steps) model->train_step(s);
    capacity = device->ledger().high_water() / 100 * 101;
  }
  tools::MaxBatchOptions o;
  o.steps = 3;
  o.whole_epoch = true;
  const tools::MaxBatchResult r = tools::find_max_batch(c, DeviceType::meta, capacity, o);
  ASSERT_GT(r.largest_fit, 0);
  ASSERT_EQ(r.first_fail, r.largest_fit + 1);
  EXPECT_EQ(first_step_out_of_memory(c, capacity, r.largest_fit), 0) << "the answer trains the whole epoch";
  const tools::MaxBatchProbe* fail = nullptr;
  for (const auto& p : r.probes)
    if (p.batch == r.first_fail) fail = &p;
  ASSERT_NE(fail, nullptr);
  ASSERT_FALSE(fail->fits);
  EXPECT_EQ(first_step_out_of_memory(c, capacity, r.first_fail), fail->worst_step)
      << "one token more runs out of memory at the batch the finder names";
  EXPECT_NE(fail->worst_batch.find(" sentences, source "), std::string::npos) << fail->worst_batch;
  const std::string text = tools::describe_max_batch(r, capacity, o);
  EXPECT_NE(text.find("the first batch that does not fit (step " + std::to_string(fail->worst_step)), std::string::npos)
      << text;
  // Without the epoch (the probe schedule's longest and most padded batches only) the answer is never smaller.
  tools::MaxBatchOptions schedule_only = o;
  schedule_only.whole_epoch = false;
  EXPECT_GE(tools::find_max_batch(c, DeviceType::meta, capacity, schedule_only).largest_fit, r.largest_fit);
}

TEST(WorstBatch, ModelsWithOneBatchShapeHaveNoEpochToScan) {
  for (const char* name : {"bert_base", "transformer_lm", "yolov3"}) {
    models::ModelConfig c;
    c.name = name;
    c.size = "tiny";
    EXPECT_FALSE(tools::batches_vary(c)) << name;
  }
  for (const char* name : {"convs2s", "unsupmt"}) {
    models::ModelConfig c;
    c.name = name;
    c.size = "tiny";
    EXPECT_TRUE(tools::batches_vary(c)) << name;
  }
}
