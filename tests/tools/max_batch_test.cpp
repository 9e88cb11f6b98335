// max_batch_test.cpp: the max-batch finder on the meta device. Its verdict is checked independently: a
// batch of N trains two steps on a fresh device, N + 1 runs out of memory; the binding term is the
// category that grows with the batch.
#include <gtest/gtest.h>

#include "engine/rng.h"
#include "models/registry.h"
#include "tools/max_batch.h"

namespace {

constexpr size_t kCapacity = size_t(48) << 20;  // 48 MiB: a tiny transformer_lm fits a few dozen sequences

models::ModelConfig tiny_lm() {
  models::ModelConfig c;
  c.name = "transformer_lm";
  c.size = "tiny";
  return c;
}

// Two training steps of `c` on a fresh meta device, written apart from the finder's probe.
bool trains(const models::ModelConfig& c, size_t capacity) {
  engine::DeviceGuard guard(engine::Device::create(engine::DeviceType::meta, capacity));
  try {
    auto model = models::create_model(c);
    model->train_step(1);
    model->train_step(2);
  } catch (const engine::OutOfMemory&) {
    return false;
  }
  return true;
}

bool trains(int64_t batch, size_t capacity) {
  models::ModelConfig c = tiny_lm();
  c.batch = batch;
  return trains(c, capacity);
}

}  // namespace

TEST(MaxBatch, FindsTheLargestBatchThatFitsOnMeta) {
  engine::manual_seed(1234);
  engine::generator().reserve(40);
  const engine::Generator before = engine::generator();
  int calls = 0;
  tools::MaxBatchOptions options;
  options.on_probe = [&](const tools::MaxBatchProbe&, int64_t, int64_t) { calls++; };
  tools::MaxBatchResult r = tools::find_max_batch(tiny_lm(), engine::DeviceType::meta, kCapacity, options);
  // The caller's random stream is left where it was (every probe's model reseeds it).
  EXPECT_EQ(engine::generator().seed, before.seed);
  EXPECT_EQ(engine::generator().offset, before.offset);

  ASSERT_GT(r.largest_fit, 1);
  EXPECT_EQ(r.first_fail, r.largest_fit + 1);
  EXPECT_TRUE(trains(r.largest_fit, kCapacity)) << "batch " << r.largest_fit << " should fit";
  EXPECT_FALSE(trains(r.largest_fit + 1, kCapacity)) << "batch " << r.largest_fit + 1 << " should not fit";
  EXPECT_EQ(r.unit, "seq");
  EXPECT_EQ(calls, int(r.probes.size()));
  EXPECT_LE(r.probes.size(), 16u) << "exponential search then bisection: about 2 log2(N) probes";
  EXPECT_EQ(r.probes[0].batch, 1);

  // Activations grow with the batch: they are what binds, and both figures are reported.
  EXPECT_EQ(r.binding, engine::Category::activation);
  EXPECT_GT(r.binding_fail_bytes, r.binding_fit_bytes);
  EXPECT_GT(r.binding_fit_bytes, 0u);
  EXPECT_NE(r.failure.find("out of memory on meta"), std::string::npos) << r.failure;
  std::string text = tools::describe_max_batch(r, kCapacity, options);
  EXPECT_NE(text.find("max batch: " + std::to_string(r.largest_fit) + " seq fit, " + std::to_string(r.first_fail) +
                      " do not"), std::string::npos) << text;
  EXPECT_NE(text.find("binding term: activation grew most"), std::string::npos) << text;
  EXPECT_NE(text.find("| " + std::to_string(r.first_fail) + " | no |"), std::string::npos) << text;
}

TEST(MaxBatch, ProbesRunTwoStepsSoOptimizerStateCounts) {
  tools::MaxBatchProbe p = tools::probe_batch(tiny_lm(), engine::DeviceType::meta, kCapacity, 2, 2);
  EXPECT_TRUE(p.fits);
  EXPECT_GT(p.breakdown[size_t(engine::Category::optimizer)], 0u) << "AdamW's moments exist in the second step";
  tools::MaxBatchProbe one = tools::probe_batch(tiny_lm(), engine::DeviceType::meta, kCapacity, 2, 1);
  EXPECT_LE(one.peak, p.peak);
}

TEST(MaxBatch, InferenceFitsMoreAndTheLimitStopsTheSearch) {
  tools::MaxBatchResult train = tools::find_max_batch(tiny_lm(), engine::DeviceType::meta, kCapacity);
  tools::MaxBatchOptions eval;
  eval.inference = true;
  tools::MaxBatchResult forward = tools::find_max_batch(tiny_lm(), engine::DeviceType::meta, kCapacity, eval);
  EXPECT_GT(forward.largest_fit, train.largest_fit) << "no saved activations, no gradients, no optimizer state";

  tools::MaxBatchOptions limited;
  limited.limit = 6;
  tools::MaxBatchResult r = tools::find_max_batch(tiny_lm(), engine::DeviceType::meta, size_t(1) << 34, limited);
  EXPECT_EQ(r.largest_fit, 6);
  EXPECT_EQ(r.first_fail, 0);
  ASSERT_EQ(r.probes.size(), 4u);  // 1, 2, 4, 6
  EXPECT_EQ(r.probes.back().batch, 6);
  EXPECT_NE(tools::describe_max_batch(r, size_t(1) << 34, limited).find("every batch up to the search limit 6"),
            std::string::npos);
}

TEST(MaxBatch, NothingFitsAndOtherErrorsAreNotVerdicts) {
  tools::MaxBatchResult r = tools::find_max_batch(tiny_lm(), engine::DeviceType::meta, size_t(1) << 20);
  EXPECT_EQ(r.largest_fit, 0);
  EXPECT_EQ(r.first_fail, 1);
  EXPECT_EQ(r.probes.size(), 1u);
  models::ModelConfig bad = tiny_lm();
  bad.size = "enormous";
  try {
    tools::find_max_batch(bad, engine::DeviceType::meta, kCapacity);
    FAIL() << "a bad config is an error, not 'nothing fits'";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("probe at batch 1 failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unknown --size 'enormous'"), std::string::npos) << e.what();
  }
}

// A model whose batches change shape runs its extremes first and asks for the steps that cover them: the
// token-batched translation models run the longest batch at steps 1-2 and the most padded one at step 3, so
// their probes run 3 steps (a 2-step probe once passed convs2s budgets whose third step ran out of memory).
TEST(MaxBatch, ProbesRunTheStepsTheModelAsksFor) {
  models::ModelConfig c;
  c.name = "convs2s";
  c.size = "tiny";
  tools::MaxBatchProbe p = tools::probe_batch(c, engine::DeviceType::meta, kCapacity, 256, 2);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.schedule, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(tools::probe_batch(tiny_lm(), engine::DeviceType::meta, kCapacity, 2, 2).schedule,
            (std::vector<int64_t>{1, 2}));
  // More steps than the schedule: it continues with the steps after its last; fewer: the schedule still runs.
  EXPECT_EQ(tools::probe_batch(tiny_lm(), engine::DeviceType::meta, kCapacity, 2, 4).schedule,
            (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(tools::probe_batch(tiny_lm(), engine::DeviceType::meta, kCapacity, 2, 1).schedule,
            (std::vector<int64_t>{1, 2}));
}

// deeplabv3 cannot train on one image (batch norm of its image-pooling branch sees one value per channel):
// searches start at its smallest batch, 2, and never probe below it, whether or not anything fits.
TEST(MaxBatch, NeverProbesBelowTheModelsSmallestBatch) {
  models::ModelConfig c;
  c.name = "deeplabv3";
  c.size = "tiny";
  EXPECT_EQ(tools::min_batch(c), 2);
  tools::MaxBatchOptions options;
  options.limit = 8;
  tools::MaxBatchResult r = tools::find_max_batch(c, engine::DeviceType::meta, kCapacity, options);
  EXPECT_EQ(r.largest_fit, 8);
  tools::MaxBatchResult none = tools::find_max_batch(c, engine::DeviceType::meta, size_t(1) << 20, options);
  EXPECT_EQ(none.largest_fit, 0);
  EXPECT_EQ(none.first_fail, 2);
  for (const auto* result : {&r, &none})
    for (const auto& p : result->probes) EXPECT_GE(p.batch, 2) << "probed below the smallest batch";
  const std::string text = tools::describe_max_batch(none, size_t(1) << 20, options);
  EXPECT_NE(text.find("not even a batch of 2 img fits"), std::string::npos) << text;
}

// --find-max-seq: the longest sequence at the config's batch, N tokens fit and N + 1 do not (each trained apart from
// the finder); the search starts at the model's shortest sequence (or 8) and stops at its learned positions.
TEST(MaxBatch, FindsTheLongestSequenceThatFitsAtTheBatch) {
  models::ModelConfig lm = tiny_lm();  // tiny's position table grows with the request: the arena binds
  lm.batch = 4;
  tools::MaxBatchOptions seq;
  seq.axis = tools::SearchAxis::seq;
  const tools::MaxBatchResult r = tools::find_max_batch(lm, engine::DeviceType::meta, kCapacity, seq);
  ASSERT_GT(r.largest_fit, 8);
  EXPECT_EQ(r.first_fail, r.largest_fit + 1);
  EXPECT_EQ(r.probes[0].batch, 8) << "from 8 tokens";
  auto trains_seq = [&](int64_t length) {
    models::ModelConfig c = lm;
    c.seq = length;
    return trains(c, kCapacity);
  };
  EXPECT_TRUE(trains_seq(r.largest_fit)) << "seq " << r.largest_fit << " should fit";
  EXPECT_FALSE(trains_seq(r.largest_fit + 1)) << "seq " << r.largest_fit + 1 << " should not fit";
  const std::string text = tools::describe_max_batch(r, kCapacity, seq);
  EXPECT_NE(text.find("longest sequence: " + std::to_string(r.largest_fit) + " tokens fit"), std::string::npos) << text;
  EXPECT_NE(text.find("| seq | fits | peak |"), std::string::npos) << text;

  // BERT-Base's 512 learned positions end the search when they fit; SQuAD's synthetic batches need 16 tokens.
  models::ModelConfig bert;
  bert.name = "bert_base";
  bert.size = "base";
  bert.batch = 1;
  EXPECT_EQ(tools::max_seq(bert), 512);
  EXPECT_EQ(tools::min_seq(bert), 5);
  const tools::MaxBatchResult all = tools::find_max_batch(bert, engine::DeviceType::meta, size_t(1) << 40, seq);
  EXPECT_EQ(all.largest_fit, 512);
  EXPECT_EQ(all.first_fail, 0);
  EXPECT_EQ(all.probes.back().batch, 512);
  EXPECT_NE(tools::describe_max_batch(all, size_t(1) << 40, seq).find("every seq up to the model's 512 positions"),
            std::string::npos);
  models::ModelConfig squad;
  squad.name = "bert_squad";
  EXPECT_EQ(tools::min_seq(squad), 16);
  squad.batch = 64;
  squad.size = "large";
  const tools::MaxBatchResult short_ = tools::find_max_batch(squad, engine::DeviceType::meta, size_t(1) << 30, seq);
  EXPECT_EQ(short_.largest_fit, 0) << "not even 16 tokens of 64 sequences fit BERT-Large in 1 GiB";
  EXPECT_EQ(short_.first_fail, 16);

  // A model without a sequence length is an error naming those with one, before any probe.
  models::ModelConfig image;
  image.name = "yolov3";
  try {
    tools::find_max_batch(image, engine::DeviceType::meta, kCapacity, seq);
    FAIL() << "yolov3 has no --seq";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("yolov3 has no sequence length"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bert_base"), std::string::npos) << e.what();
  }
}

TEST(MaxBatch, TranslationModelsSearchTheirTokenBudget) {
  models::ModelConfig bert;
  bert.name = "bert_base";
  EXPECT_FALSE(tools::counts_tokens(bert));
  EXPECT_EQ(tools::first_probe(bert), 1);
  EXPECT_EQ(tools::default_batch(bert), 32);
  for (const auto& e : models::registry()) {
    models::ModelConfig c;
    c.name = e.name;
    engine::DeviceGuard guard(engine::Device::create(engine::DeviceType::meta, size_t(1) << 40));
    std::unique_ptr<models::Model> m = models::create_model(c);
    bool tokens = std::string(m->item_unit()) == "tok";
    EXPECT_EQ(tools::counts_tokens(c), tokens) << e.name;
    EXPECT_EQ(tools::default_batch(c), m->batch_size()) << e.name;
    // A token budget starts at the model's default: a budget shorter than a sentence makes no batch.
    EXPECT_EQ(tools::first_probe(c), tokens ? m->batch_size() : m->min_batch()) << e.name;
  }
}
