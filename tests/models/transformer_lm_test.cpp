// transformer_lm_test.cpp: the foundation end to end on a small transformer language model:
// it learns (loss falls), it is deterministic, and the meta device makes exactly the cpu device's
// allocation decisions, step after step, so its peak and out-of-memory point are the cpu's.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/device.h"
#include "models/transformer_lm.h"

using engine::Device;
using engine::DeviceType;

namespace {

models::TransformerLMConfig tiny() {
  models::TransformerLMConfig c;  // vocab 64, dim 64, 4 heads, 2 layers, seq 32, batch 8
  return c;
}

std::vector<double> train(models::TransformerLMConfig c, int steps, std::shared_ptr<Device> dev) {
  engine::DeviceGuard g(dev);
  models::TransformerLM model(c);
  std::vector<double> losses;
  for (int s = 1; s <= steps; s++) {
    losses.push_back(model.train_step(s).loss);
    dev->ledger().check();
  }
  return losses;
}

std::shared_ptr<Device> cpu(size_t cap = size_t(1) << 32) { return Device::create(DeviceType::cpu, cap); }
std::shared_ptr<Device> meta(size_t cap = size_t(1) << 32) { return Device::create(DeviceType::meta, cap); }

}  // namespace

TEST(TransformerLM, TinyModelLearnsOnCpu) {
  std::vector<double> losses = train(tiny(), 40, cpu());
  double first = losses.front();
  double last = (losses[35] + losses[36] + losses[37] + losses[38] + losses[39]) / 5;
  EXPECT_NEAR(first, std::log(64.0), 0.5) << "an untrained model predicts roughly uniformly";
  EXPECT_LT(last, 0.4 * first) << "first " << first << " last " << last;
}

TEST(TransformerLM, SameSeedSameLossesBitForBit) {
  auto c = tiny();
  c.dropout = 0.1;  // dropout masks come from the seeded counter-based generator
  std::vector<double> a = train(c, 4, cpu()), b = train(c, 4, cpu());
  EXPECT_EQ(a, b);
  c.seed = 2;
  EXPECT_NE(train(c, 4, cpu()), a);
}

TEST(TransformerLM, MetaMakesTheSameAllocationsAsCpu) {
  for (auto algo : {ops::AttentionAlgo::naive, ops::AttentionAlgo::flash}) {
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(std::string(ops::attention_algo_name(algo)) + (recompute ? " recompute" : ""));
      auto c = tiny();
      c.algo = algo;
      c.recompute_layers = recompute;
      c.dropout = 0.1;
      auto d_cpu = cpu(), d_meta = meta();
      train(c, 3, d_cpu);
      train(c, 3, d_meta);
      // Every (offset, size, category, owner, phase) decision, in order, and therefore the peak.
      EXPECT_EQ(d_cpu->ledger().events_csv(), d_meta->ledger().events_csv());
      EXPECT_EQ(d_cpu->ledger().peak_bytes(), d_meta->ledger().peak_bytes());
      EXPECT_EQ(d_cpu->allocator().high_water(), d_meta->allocator().high_water());
      EXPECT_GT(d_cpu->ledger().peak_bytes(), 0u);
    }
  }
}

TEST(TransformerLM, MetaPredictsTheOutOfMemoryPoint) {
  auto c = tiny();
  // The live peak of an unconstrained run, then a capacity just under it: no placement can fit, and both
  // devices must fail at the same request with the same report. (The high water is not the threshold:
  // best fit's choices depend on the size of the free tail, so a smaller arena may pack tighter.)
  auto probe = meta();
  train(c, 2, probe);
  size_t tight = probe->ledger().peak_bytes() - 256;
  std::string messages[2];
  int i = 0;
  for (auto dev : {cpu(tight), meta(tight)}) {
    try {
      train(c, 2, dev);
      ADD_FAILURE() << "expected out of memory at capacity " << tight;
    } catch (const engine::OutOfMemory& e) {
      messages[i] = e.what();
    }
    i++;
  }
  // The reports differ only in the device name.
  auto strip = [](const std::string& s) { return s.empty() ? s : s.substr(s.find(':')); };
  EXPECT_EQ(strip(messages[0]), strip(messages[1]));
  EXPECT_NE(messages[0].find("out of memory"), std::string::npos);
}

TEST(TransformerLM, RecomputeAndFlashSaveActivationMemoryWithoutChangingTheLoss) {
  auto peak_activation = [](models::TransformerLMConfig c, std::vector<double>* losses) {
    auto dev = cpu();
    *losses = train(c, 2, dev);
    return dev->ledger().peak_bytes(engine::Category::activation);
  };
  auto c = tiny();
  c.seq = 64;
  c.max_positions = 64;
  std::vector<double> base_loss, flash_loss, rec_loss;
  size_t base = peak_activation(c, &base_loss);
  c.algo = ops::AttentionAlgo::flash;
  size_t flash = peak_activation(c, &flash_loss);
  c.recompute_layers = true;
  size_t both = peak_activation(c, &rec_loss);
  EXPECT_LT(flash, base);
  EXPECT_LT(both, flash);
  for (size_t s = 0; s < base_loss.size(); s++) {
    EXPECT_NEAR(flash_loss[s], base_loss[s], 1e-4);
    EXPECT_NEAR(rec_loss[s], flash_loss[s], 1e-5);
  }
}
