// models_cuda_test.cpp: for every registered model, a cuda training run makes exactly the allocations the
// meta device predicts (every offset, size, tag and phase, hence the same peak), and the max batch that
// meta predicts for a capacity fits on the GPU while one more does not (the engine's own OutOfMemory).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>

#include "engine/device.h"
#include "models/bert/pretraining.h"
#include "models/registry.h"
#include "models/transformer_lm.h"
#include "ops/factory.h"
#include "tools/max_batch.h"

namespace {

std::string run_two_steps(const models::ModelConfig& c, std::shared_ptr<engine::Device> dev, size_t* peak) {
  engine::DeviceGuard g(dev);
  auto model = models::create_model(c);
  for (int s = 1; s <= 2; s++) model->train_step(s);
  dev->synchronize();
  *peak = dev->ledger().peak_bytes();
  return dev->ledger().events_csv();
}

}  // namespace

TEST(ModelsCuda, EveryModelAllocatesExactlyAsMetaPredicts) {
  const size_t capacity = size_t(40) << 30;
  for (const auto& name : models::model_names()) {
    for (const char* precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(name + " " + precision);
      models::ModelConfig c;
      c.name = name;
      c.precision = precision;
      if (name == "transformer_lm") c.size = "small";
      size_t peak_cuda = 0, peak_meta = 0;
      std::string cuda = run_two_steps(c, engine::Device::create(engine::DeviceType::cuda, capacity), &peak_cuda);
      std::string meta = run_two_steps(c, engine::Device::create(engine::DeviceType::meta, capacity), &peak_meta);
      EXPECT_EQ(peak_cuda, peak_meta);
      EXPECT_TRUE(cuda == meta) << name << ": the cuda run's allocation events differ from meta's";
      std::printf("%s %s: cuda peak %zu bytes == meta peak %zu bytes\n", name.c_str(), precision, peak_cuda,
                  peak_meta);
    }
  }
}

// The researcher's levers (issue 21) on the GPU: decoding with a KV cache (eval steps, no training state), gradient
// accumulation, Adafactor, a reshaped transformer and Mask R-CNN's detection make exactly the allocations meta
// predicts.
TEST(ModelsCuda, LeversAndDecodingAllocateExactlyAsMetaPredicts) {
  const size_t capacity = size_t(40) << 30;
  std::vector<models::ModelConfig> configs(5);
  configs[0].name = "transformer_lm";
  configs[0].size = "small";
  configs[0].precision = "bf16";
  configs[0].inference = true;
  configs[0].seq = 96;
  configs[0].generate = 32;
  configs[0].batch = 4;
  configs[1].name = "bert_base";
  configs[1].batch = 8;
  configs[1].accumulate = 3;
  configs[2].name = "transformer_lm";
  configs[2].size = "small";
  configs[2].precision = "bf16";
  configs[2].optimizer = "adafactor";
  configs[3].name = "bert_squad";
  configs[3].dims.layers = 3;
  configs[3].dims.hidden = 512;
  configs[3].dims.heads = 8;
  configs[3].precision = "bf16";
  configs[3].attention = "flash";
  configs[4].name = "maskrcnn";  // detection at full size (fixed 100 detections per image)
  configs[4].precision = "bf16";
  configs[4].inference = true;
  for (const models::ModelConfig& c : configs) {
    SCOPED_TRACE(c.name + (c.inference ? " generate" : c.optimizer.empty() ? "" : " " + c.optimizer));
    auto run = [&](engine::DeviceType type, size_t* peak) {
      auto dev = engine::Device::create(type, capacity);
      engine::DeviceGuard g(dev);
      auto model = models::create_model(c);
      for (int s = 1; s <= 2; s++) c.inference ? model->eval_step(s) : model->train_step(s);
      dev->synchronize();
      *peak = dev->ledger().peak_bytes();
      return dev->ledger().events_csv();
    };
    size_t peak_cuda = 0, peak_meta = 0;
    const std::string cuda = run(engine::DeviceType::cuda, &peak_cuda),
                      meta = run(engine::DeviceType::meta, &peak_meta);
    EXPECT_EQ(peak_cuda, peak_meta);
    EXPECT_TRUE(cuda == meta) << "the cuda run's allocation events differ from meta's";
    std::printf("%s: cuda peak %zu bytes == meta peak %zu bytes\n", c.name.c_str(), peak_cuda, peak_meta);
  }
}

// Greedy decoding on the GPU: with the cache (prefill, then one token per step) == without it, token for token,
// for a tiny model trained on the GPU until its predictions are confident.
TEST(ModelsCuda, CachedDecodingEqualsUncachedOnTheGpu) {
  auto dev = engine::Device::create(engine::DeviceType::cuda, size_t(4) << 30);
  engine::DeviceGuard g(dev);
  models::TransformerLMConfig c;
  c.max_positions = 64;
  models::TransformerLM lm(c);
  for (int64_t step = 1; step <= 150; step++) lm.train_step(step);
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < 6; b++)
    for (int64_t i = 0; i < 9; i++) ids.push_back((5 * b + 3 + i * (1 + b % 4)) % 64);
  const engine::Tensor prompt = ops::from_vector(ids, {6, 9}, engine::DType::i64);
  const models::LMGeneration cached = models::greedy_generate(lm.net(), prompt, 20, true);
  const models::LMGeneration uncached = models::greedy_generate(lm.net(), prompt, 20, false);
  EXPECT_EQ(cached.tokens, uncached.tokens);
  EXPECT_EQ(cached.tokens[0][0], 12);
}

// bf16 mixed precision trains bert_base like fp32: 200 steps each on the same synthetic data from the same
// initialization; the curves (means over windows of 20 steps) stay within 3% of each other and both fall.
// The curves are printed for BENCHMARKS.md.
TEST(ModelsCuda, Bf16TracksTheFp32LossCurveOfBertBase) {
  std::map<std::string, std::vector<double>> curve;
  for (const char* precision : {"fp32", "bf16"}) {
    engine::DeviceGuard g(engine::Device::create(engine::DeviceType::cuda, size_t(40) << 30));
    models::ModelConfig c;
    c.name = "bert_base";
    // BERT-Base at seq 128, batch 32; a constant lr of 1e-4 (the recipe's peak, without its 10,000-step
    // warmup) and progressions over 1,000 word ids, so that 200 steps move the loss a long way.
    models::bert::BertRecipe r = models::bert::BertPretraining::recipe_for(c);
    r.warmup = 0;
    r.synthetic_words = 1000;
    auto model = std::make_unique<models::bert::BertPretraining>(r);
    model->set_precision(models::precision_from_name(precision));
    for (int s = 1; s <= 200; s++) curve[precision].push_back(model->train_step(s).loss);
  }
  auto window = [](const std::vector<double>& v, size_t w) {
    double sum = 0;
    for (size_t i = w * 20; i < (w + 1) * 20; i++) sum += v[i];
    return sum / 20;
  };
  std::printf("bert_base seq 128 batch 32, mean loss per 20 steps (fp32 | bf16):\n");
  for (size_t w = 0; w < 10; w++) {
    const double a = window(curve["fp32"], w), b = window(curve["bf16"], w);
    std::printf("  steps %3zu-%3zu  %.4f | %.4f  (%+.2f%%)\n", w * 20 + 1, w * 20 + 20, a, b, 100 * (b - a) / a);
    EXPECT_NEAR(b, a, 0.03 * a) << "steps " << w * 20 + 1 << "-" << w * 20 + 20;
  }
  EXPECT_LT(window(curve["fp32"], 9), 0.8 * window(curve["fp32"], 0)) << "fp32 does not learn: nothing to track";
  EXPECT_LT(window(curve["bf16"], 9), 0.8 * window(curve["bf16"], 0));
}

TEST(ModelsCuda, MetaPredictsTheOutOfMemoryPoint) {
  models::ModelConfig c;
  c.name = "bert_base";
  c.seq = 128;
  const size_t capacity = size_t(6) << 30;
  tools::MaxBatchResult predicted = tools::find_max_batch(c, engine::DeviceType::meta, capacity);
  ASSERT_GT(predicted.largest_fit, 0);
  tools::MaxBatchProbe fit = tools::probe_batch(c, engine::DeviceType::cuda, capacity, predicted.largest_fit, 2);
  tools::MaxBatchProbe fail = tools::probe_batch(c, engine::DeviceType::cuda, capacity, predicted.largest_fit + 1, 2);
  EXPECT_TRUE(fit.fits) << fit.failure;
  EXPECT_FALSE(fail.fits);
  EXPECT_NE(fail.failure.find("out of memory on cuda"), std::string::npos) << fail.failure;
  std::printf("bert_base seq 128 in 6 GiB: meta predicts %lld fits, %lld does not; cuda: %s / %s\n",
              (long long)predicted.largest_fit, (long long)predicted.largest_fit + 1, fit.fits ? "fits" : "FAILS",
              fail.fits ? "FITS" : "does not fit");
}

// The finder on the GPU gives meta's answer, in arenas of odd sizes, for fp16 runs whose first steps overflow
// on the GPU (never on meta, which has no values): the skipped steps still allocate the optimizer state, and
// the probes run until every task head has it (Model::probe_schedule), so both reach the same steady state.
TEST(ModelsCuda, TheFinderOnCudaGivesMetasAnswer) {
  struct Case {
    const char* model;
    const char* precision;
    const char* attention;
    size_t mib;
  };
  for (const Case& k : {Case{"mtdnn", "fp16", "flash", 12345}, Case{"bert_squad", "fp16", "naive", 7777},
                        Case{"transformer_big", "fp16", "flash", 9999}}) {
    SCOPED_TRACE(k.model);
    models::ModelConfig c;
    c.name = k.model;
    c.precision = k.precision;
    c.attention = k.attention;
    const size_t capacity = k.mib << 20;
    tools::MaxBatchResult meta = tools::find_max_batch(c, engine::DeviceType::meta, capacity);
    tools::MaxBatchResult cuda = tools::find_max_batch(c, engine::DeviceType::cuda, capacity);
    EXPECT_EQ(cuda.largest_fit, meta.largest_fit);
    EXPECT_EQ(cuda.first_fail, meta.first_fail);
    std::printf("%s %s %s in %zu MiB: meta %lld %s fit, %lld do not; cuda %lld fit, %lld do not (%zu and %zu probes)\n",
                k.model, k.precision, k.attention, k.mib, (long long)meta.largest_fit, meta.unit.c_str(),
                (long long)meta.first_fail, (long long)cuda.largest_fit, (long long)cuda.first_fail,
                meta.probes.size(), cuda.probes.size());
  }
}

// The timeline's time axis on the GPU (Device::set_event_clock): a CUDA event at every allocation and free of a step,
// read back in order, never backwards, spanning no more than the step's wall time; the allocations the same as
// without the clock (the clock tags nothing).
TEST(ModelsCuda, TheEventClockStampsEveryEventInGpuTime) {
  auto dev = engine::Device::create(engine::DeviceType::cuda, size_t(8) << 30);
  dev->ledger().set_detail(true);
  engine::DeviceGuard g(dev);
  models::ModelConfig c;
  c.name = "transformer_lm";
  c.size = "small";
  c.batch = 4;
  c.seq = 128;
  auto model = models::create_model(c);
  model->train_step(1);
  dev->synchronize();
  const int64_t from = dev->ledger().sequence();
  dev->set_event_clock(true);
  const auto start = std::chrono::steady_clock::now();
  model->train_step(2);
  dev->synchronize();
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const std::vector<std::pair<int64_t, double>> times = dev->event_times();
  int64_t events = 0;
  for (const engine::BlockInfo& b : dev->ledger().history()) events += (b.alloc_seq > from) + (b.free_seq > from);
  EXPECT_EQ(int64_t(times.size()), events);
  ASSERT_FALSE(times.empty());
  for (size_t i = 1; i < times.size(); i++) {
    EXPECT_GT(times[i].first, times[i - 1].first);
    EXPECT_GE(times[i].second, times[i - 1].second);
  }
  EXPECT_GT(times.back().second, 0.0);
  EXPECT_LE(times.back().second, wall_ms + 1.0);
}
