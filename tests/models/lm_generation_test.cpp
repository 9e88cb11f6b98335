// lm_generation_test.cpp: transformer_lm's greedy decoding with a KV cache (--inference --generate N) against the
// uncached reference (the whole sequence again at every step), token for token; the cache's bytes against their
// formula and the ledger's kv_cache category; inference keeps no training state; the serving question answered
// by the max-batch finder.
#include <gtest/gtest.h>

#include <set>

#include "engine/device.h"
#include "graph/autograd.h"
#include "models/registry.h"
#include "models/transformer_lm.h"
#include "ops/factory.h"
#include "tests/util/error_util.h"
#include "tests/util/meta_util.h"
#include "tools/max_batch.h"

using engine::Category;
using engine::DeviceType;
using engine::Tensor;
using models::ModelConfig;

namespace {

// Prompts of the tiny model's data: arithmetic progressions (s + i k) mod 64, which the model learns to continue.
Tensor progressions(int64_t batch, int64_t length) {
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < batch; b++)
    for (int64_t i = 0; i < length; i++) ids.push_back((5 * b + 3 + i * (1 + b % 4)) % 64);
  return ops::from_vector(ids, {batch, length}, engine::DType::i64);
}

}  // namespace

TEST(LmGeneration, CachedDecodingEqualsUncachedTokenForToken) {
  auto device = engine::Device::create(DeviceType::cpu, size_t(1) << 30);
  engine::DeviceGuard guard(device);
  models::TransformerLMConfig c;  // tiny: 2 layers, width 64
  c.max_positions = 64;
  models::TransformerLM lm(c);
  for (int64_t step = 1; step <= 150; step++) lm.train_step(step);  // varied tokens, not one repeated
  const Tensor prompt = progressions(6, 9);
  const models::LMGeneration cached = models::greedy_generate(lm.net(), prompt, 20, true);
  const models::LMGeneration uncached = models::greedy_generate(lm.net(), prompt, 20, false);
  // The prefill in passes of 2 sequences (18 prompt tokens per pass), the last pass shorter when it must be.
  const models::LMGeneration chunked = models::greedy_generate(lm.net(), prompt, 20, true, 18);
  const models::LMGeneration odd = models::greedy_generate(lm.net(), prompt, 20, true, 36);  // 4, then 2
  ASSERT_EQ(cached.tokens.size(), 6u);
  EXPECT_EQ(cached.tokens, uncached.tokens);
  EXPECT_EQ(chunked.tokens, uncached.tokens);
  EXPECT_EQ(odd.tokens, uncached.tokens);
  std::set<int64_t> distinct;
  for (const auto& row : cached.tokens) distinct.insert(row.begin(), row.end());
  EXPECT_GT(distinct.size(), 8u) << "the trained model should continue its progressions, not repeat one token";
  // The model has learned its data: row 0 (s 3, k 1) continues 12, 13, 14, ...
  EXPECT_EQ(cached.tokens[0][0], 12);
  EXPECT_EQ(cached.tokens[0][1], 13);
  EXPECT_TRUE(lm.net().training()) << "the training flag is restored";
  EXPECT_EQ(cached.cache_bytes, models::lm_cache_bytes(c, 6, 29, 4));
  EXPECT_EQ(uncached.cache_bytes, 0u);
}

TEST(LmGeneration, TheCacheIsItsOwnCategoryAtItsFormulaAndMetaAllocatesLikeCpu) {
  ModelConfig c;
  c.name = "transformer_lm";
  c.seq = 24;
  c.batch = 3;
  c.generate = 8;
  c.inference = true;
  auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
  {
    engine::DeviceGuard guard(device);
    auto model = models::create_model(c);
    const models::StepResult r = model->eval_step(1);
    EXPECT_FALSE(r.has_loss);
    EXPECT_EQ(r.items, 3);
    ASSERT_FALSE(r.details.empty());
    EXPECT_NE(r.details[0].find("KV cache 96.00 KiB allocated at 32 positions"), std::string::npos) << r.details[0];
  }
  // 2 (K, V) x 2 layers x 3 sequences x 32 positions x 64 channels x 4 bytes = 96 KiB, in kv_cache at the peak.
  EXPECT_EQ(device->ledger().peak_bytes(Category::kv_cache), size_t(2 * 2 * 3 * 32 * 64 * 4));
  EXPECT_EQ(device->ledger().peak_bytes(Category::optimizer), 0u);
  testutil::expect_meta_allocates_like_cpu([&] {
    auto model = models::create_model(c);
    model->eval_step(1);
    model->eval_step(2);
  });
}

TEST(LmGeneration, PrefillPassesBoundTheActivationsBesideTheFullCache) {
  auto peak = [](int64_t prefill_tokens) {
    auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
    engine::DeviceGuard guard(device);
    ModelConfig c;
    c.name = "transformer_lm";
    c.size = "small";
    c.precision = "bf16";
    c.inference = true;
    c.seq = 256;
    c.generate = 16;
    c.batch = 64;
    c.prefill_tokens = prefill_tokens;
    models::create_model(c)->eval_step(1);
    return std::make_pair(device->ledger().peak_bytes(), device->ledger().peak_bytes(Category::kv_cache));
  };
  const auto one = peak(0), passes = peak(2048);  // 64 prompts at once; 8 passes of 8
  EXPECT_EQ(one.second, passes.second) << "the same cache";
  // A pass's largest temporaries (the MLP's [rows, 3072] bf16 input and output) shrink 8 times.
  EXPECT_LT(passes.first + size_t(2) * (64 - 8) * 256 * 3072 * 2, one.first);
}

TEST(LmGeneration, InferenceKeepsNoTrainingState) {
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
    engine::DeviceGuard guard(device);
    ModelConfig c;
    c.name = "transformer_lm";
    c.size = "small";
    c.precision = precision;
    c.inference = true;
    auto model = models::create_model(c);
    const size_t params = device->ledger().live_bytes(Category::param);
    EXPECT_EQ(params, device->ledger().live_bytes()) << "only the weights are live after building";
    EXPECT_EQ(device->ledger().live_bytes(Category::optimizer), 0u);
    const int64_t element = std::string(precision) == "bf16" ? 2 : 4;
    EXPECT_GE(params, size_t(model->module().num_parameters() * element));
    EXPECT_LT(params, size_t(model->module().num_parameters() * element) * 101 / 100);
    // Built in its dtype: never all the f32 weights at once, at most the weights and the largest f32 tensor (wte).
    const size_t wte_f32 = size_t(50257 * 768 * 4);
    EXPECT_LE(device->ledger().peak_bytes(), params + wte_f32);
  }
}

TEST(LmGeneration, BadRequestsAreErrorsNamingTheFix) {
  auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
  engine::DeviceGuard guard(device);
  ModelConfig c;
  c.name = "transformer_lm";
  c.size = "small";
  c.generate = 8;
  EXPECT_ERROR_HAS(models::create_model(c), "add --inference");
  c.inference = true;
  c.seq = 1020;
  EXPECT_ERROR_HAS(models::create_model(c), "--seq 1020 + --generate 8 = 1028 positions", "has 1024");
  c.name = "bert_base";
  c.seq = 0;
  EXPECT_ERROR_HAS(models::create_model(c), "--generate is for decoder language models");
}

TEST(LmGeneration, FinderAnswersTheMostConcurrentSequences) {
  ModelConfig c;
  c.name = "transformer_lm";
  c.seq = 32;
  c.generate = 16;
  tools::MaxBatchOptions o;
  o.inference = true;
  o.steps = 1;
  const size_t capacity = 40 << 20;  // 32 MiB of it the GEMM workspace
  const tools::MaxBatchResult r = tools::find_max_batch(c, DeviceType::meta, capacity, o);
  ASSERT_GT(r.largest_fit, 1);
  EXPECT_EQ(r.first_fail, r.largest_fit + 1);
  EXPECT_TRUE(tools::probe_batch(c, DeviceType::meta, capacity, r.largest_fit, 1, true).fits);
  const tools::MaxBatchProbe fail = tools::probe_batch(c, DeviceType::meta, capacity, r.first_fail, 1, true);
  EXPECT_FALSE(fail.fits);
  EXPECT_GT(fail.breakdown[size_t(Category::kv_cache)], 0u) << "the KV cache is live when the next one fails";
}
