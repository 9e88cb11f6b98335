// models_cuda_test.cpp: for every registered model, a cuda training run makes exactly the allocations the
// meta device predicts (every offset, size, tag and phase, hence the same peak), and the max batch that
// meta predicts for a capacity fits on the GPU while one more does not (the engine's own OutOfMemory).
#include <gtest/gtest.h>

#include "engine/device.h"
#include "models/registry.h"
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
    SCOPED_TRACE(name);
    models::ModelConfig c;
    c.name = name;
    if (name == "transformer_lm") c.size = "small";
    size_t peak_cuda = 0, peak_meta = 0;
    std::string cuda = run_two_steps(c, engine::Device::create(engine::DeviceType::cuda, capacity), &peak_cuda);
    std::string meta = run_two_steps(c, engine::Device::create(engine::DeviceType::meta, capacity), &peak_meta);
    EXPECT_EQ(peak_cuda, peak_meta);
    EXPECT_TRUE(cuda == meta) << name << ": the cuda run's allocation events differ from meta's";
    std::printf("%s: cuda peak %zu bytes == meta peak %zu bytes\n", name.c_str(), peak_cuda, peak_meta);
  }
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
