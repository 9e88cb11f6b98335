// prefetch_test.cpp: the next step's host batch made during this step (Model::make_host_batch, made by train_step
// before it waits for the loss) changes nothing a run computes or allocates. The reference: the same run with every
// batch made at its own step (set_prefetch(false)): the losses bit for bit and the ledger's whole event list.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/device.h"
#include "models/registry.h"

namespace {

struct TrainedRun {
  std::vector<double> losses;
  std::string events;
  int64_t made_ahead = 0;
};

TrainedRun train(models::ModelConfig c, bool prefetch, engine::DeviceType type, int64_t steps) {
  auto device = engine::Device::create(type, size_t(1) << 34);
  engine::DeviceGuard guard(device);
  auto model = models::create_model(c);
  model->set_prefetch(prefetch);
  TrainedRun run;
  for (int64_t step = 1; step <= steps; step++) {
    run.losses.push_back(model->train_step(step).loss);
    if (step == 2) run.losses.push_back(model->eval_step(step + 1).loss);  // eval mode between two train steps
  }
  run.events = device->ledger().events_csv();
  run.made_ahead = model->batches_made_ahead();
  return run;
}

models::ModelConfig tiny(const std::string& name) {
  models::ModelConfig c;
  c.name = name;
  c.size = "tiny";
  return c;
}

}  // namespace

TEST(Prefetch, TheBatchMadeAheadIsTheBatchOfItsStep) {
  std::vector<models::ModelConfig> configs = {tiny("bert_base"), tiny("bert_squad"), tiny("transformer_big")};
  models::ModelConfig mtdnn = tiny("mtdnn");
  mtdnn.task = "mnli,sst,stsb";  // SAN's turn weights, a classifier, a regression; tasks drawn per step
  configs.push_back(mtdnn);
  for (const auto& c : configs) {
    const TrainedRun ahead = train(c, true, engine::DeviceType::cpu, 4),
                     at_step = train(c, false, engine::DeviceType::cpu, 4);
    ASSERT_EQ(ahead.losses.size(), at_step.losses.size()) << c.name;
    for (size_t i = 0; i < ahead.losses.size(); i++)
      EXPECT_EQ(ahead.losses[i], at_step.losses[i]) << c.name << " " << i;
    EXPECT_EQ(ahead.events, at_step.events) << c.name << ": the same allocations in the same order";
    // Steps 2 and 4 trained on batches made ahead. Step 3's was dropped where the eval step (in eval mode) asked
    // for data step 3 through make_batch (the BERT family; transformer_big's eval decodes its own host batch).
    EXPECT_EQ(ahead.made_ahead, c.name == "transformer_big" ? 3 : 2) << c.name;
    EXPECT_EQ(at_step.made_ahead, 0) << c.name;
    // meta runs the same allocations (make_host_batch runs there too).
    EXPECT_EQ(train(c, true, engine::DeviceType::meta, 4).events, ahead.events) << c.name;
  }
}
