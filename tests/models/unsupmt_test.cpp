// unsupmt_test.cpp: the XLM unsupervised MT step: the tiny model runs its two auto-encoding and two
// back-translation updates per step and every loss falls; the back-translation's generation shows in the
// ledger under phase `generate` with its key/value cache; full size on meta has the analytic parameter count.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/device.h"
#include "models/registry.h"
#include "models/translation/unsupmt.h"

using engine::Device;
using engine::DeviceType;
using models::translation::UnsupMT;

namespace {

models::ModelConfig config(const std::string& size) {
  models::ModelConfig c;
  c.name = "unsupmt";
  c.size = size;
  return c;
}

}  // namespace

TEST(UnsupMT, TinyModelRunsAutoEncodingAndBackTranslationAndEveryLossFalls) {
  auto dev = Device::create(DeviceType::cpu, size_t(1) << 32);
  engine::DeviceGuard g(dev);
  UnsupMT model(config("tiny"));
  std::map<std::string, std::vector<double>> losses;
  const int steps = 40;
  for (int s = 1; s <= steps; s++) {
    models::StepResult r = model.train_step(s);
    ASSERT_EQ(r.losses.size(), 4u);
    for (auto& [name, v] : r.losses) {
      EXPECT_TRUE(std::isfinite(v)) << name;
      losses[name].push_back(v);
    }
    EXPECT_GT(r.items, 0);
    dev->ledger().check();
  }
  EXPECT_EQ(model.optimizer().step_count(), 4 * steps) << "one update per AE and per BT sub-step";
  for (const char* name : {"ae_en", "ae_fr", "bt_en_fr_en", "bt_fr_en_fr"}) {
    const auto& v = losses.at(name);
    double first = (v[0] + v[1]) / 2, last = (v[steps - 1] + v[steps - 2] + v[steps - 3]) / 3;
    EXPECT_LT(last, 0.7 * first) << name << ": first " << first << " last " << last;
  }
}

TEST(UnsupMT, BackTranslationMemoryIsUnderPhaseGenerate) {
  auto dev = Device::create(DeviceType::cpu, size_t(1) << 32);
  engine::DeviceGuard g(dev);
  UnsupMT model(config("tiny"));
  model.train_step(1);
  int cache_blocks = 0;
  for (const auto& b : dev->ledger().history()) {
    bool cache = b.owner.find("kv_cache") != std::string::npos;
    if (cache) {
      EXPECT_EQ(b.phase, engine::Phase::generate) << b.owner;
      cache_blocks++;
    }
  }
  // Two BT sub-steps x decoder layers x (self K, V + encoder-decoder K, V).
  EXPECT_EQ(cache_blocks, 2 * int(model.recipe().net.decoder_layers) * 4);
  EXPECT_TRUE(model.module().training());
}

// Back-translation runs all max_len steps and pads its generated sources to a fixed width, so no allocation
// depends on the generated tokens: meta makes the cpu's allocation decisions, generation included.
TEST(UnsupMT, MetaMakesTheSameAllocationsAsCpuGenerationIncluded) {
  auto d_cpu = Device::create(DeviceType::cpu, size_t(1) << 32),
       d_meta = Device::create(DeviceType::meta, size_t(1) << 32);
  for (auto dev : {d_cpu, d_meta}) {
    engine::DeviceGuard g(dev);
    UnsupMT model(config("tiny"));
    model.train_step(1);
    model.train_step(2);
  }
  EXPECT_EQ(d_cpu->ledger().events_csv(), d_meta->ledger().events_csv());
  EXPECT_EQ(d_cpu->ledger().peak_bytes(), d_meta->ledger().peak_bytes());
}

TEST(UnsupMT, FullSizeParameterCountIsTheAnalyticCountAndAStepRunsOnMeta) {
  auto dev = Device::create(DeviceType::meta, size_t(1) << 40);
  engine::DeviceGuard g(dev);
  auto model = models::create_model(config("big"));
  const int64_t V = 64000, C = 1024, F = 4096, L = 6, P = 512, languages = 2;
  const int64_t norm = 2 * C;
  const int64_t embeddings = V * C + P * C + languages * C + norm;  // per side: tokens, positions, languages, LN
  const int64_t attention = 4 * (C * C + C);
  const int64_t ffn = (C * F + F) + (F * C + C);
  const int64_t encoder_layer = attention + ffn + 2 * norm;
  const int64_t decoder_layer = 2 * attention + ffn + 3 * norm;
  const int64_t expected = 2 * embeddings + L * encoder_layer + L * decoder_layer + V;  // + output bias
  EXPECT_EQ(model->module().num_parameters(), expected);
  models::StepResult r = model->train_step(1);
  EXPECT_EQ(r.losses.size(), 4u);
  EXPECT_GT(r.items, 0);
}
