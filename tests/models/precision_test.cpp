// precision_test.cpp: --precision on cpu and meta. The mixed-precision update against the f32 update of
// the master (bit for bit), fp16 loss-scale arithmetic, the ledger's copies (bf16 parameters, f32 masters
// under `optimizer`), a bf16 and an fp16 run tracking fp32's loss curve, an overflowing fp16 step skipped,
// a bf16 checkpoint resumed bit for bit, and every registered model stepping in every precision on meta
// (meta runs every op's dtype checks, so a model that mixes an f32 buffer into bf16 activations fails here).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <filesystem>

#include "engine/device.h"
#include "engine/rng.h"
#include "models/registry.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/optimizer.h"
#include "tools/checkpoint.h"

using engine::DType;
using engine::Tensor;

namespace {

std::shared_ptr<engine::Device> cpu() { return engine::Device::create(engine::DeviceType::cpu, size_t(1) << 30); }
std::shared_ptr<engine::Device> meta() { return engine::Device::create(engine::DeviceType::meta, size_t(1) << 40); }

models::ModelConfig tiny_lm(const std::string& precision) {
  models::ModelConfig c;
  c.name = "transformer_lm";
  c.size = "tiny";
  c.seq = 16;
  c.batch = 8;
  c.seed = 3;
  c.precision = precision;
  return c;
}

std::vector<double> train(models::Model& m, int64_t first, int64_t last) {
  std::vector<double> out;
  for (int64_t s = first; s <= last; s++) out.push_back(m.train_step(s).loss);
  return out;
}

std::vector<double> bits(const Tensor& t) { return t.to_double(); }

}  // namespace

TEST(Precision, NamesAndDtypes) {
  EXPECT_EQ(models::compute_dtype(models::precision_from_name("fp32")), DType::f32);
  EXPECT_EQ(models::compute_dtype(models::precision_from_name("tf32")), DType::f32);
  EXPECT_EQ(models::compute_dtype(models::precision_from_name("bf16")), DType::bf16);
  EXPECT_EQ(models::compute_dtype(models::precision_from_name("fp16")), DType::f16);
  try {
    models::precision_from_name("fp8");
    FAIL() << "fp8 accepted";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown precision 'fp8': valid precisions are fp32, tf32, bf16, fp16"),
              std::string::npos) << e.what();
  }
}

// The mixed update is the f32 update of the master, whose result is also rounded into the bf16 weight; the
// gradient enters as bf16 times grad_scale (a power of two here, so the scaling itself is exact).
TEST(Precision, MasterWeightUpdateIsTheF32UpdateOfTheMaster) {
  engine::DeviceGuard g(cpu());
  engine::manual_seed(11);
  for (DType low : {DType::bf16, DType::f16}) {
    Tensor master = ops::randn({1000});
    Tensor param = ops::to(master, low);
    Tensor grad = ops::to(ops::randn({1000}), low);
    std::vector<Tensor> slots = {ops::zeros({1000}, DType::f32), ops::zeros({1000}, DType::f32)};
    Tensor ref = ops::clone(master), ref_grad = ops::mul(ops::to(grad, DType::f32), 0.25);
    std::vector<Tensor> ref_slots = {ops::zeros({1000}, DType::f32), ops::zeros({1000}, DType::f32)};
    for (int64_t step = 1; step <= 3; step++) {
      ops::AdamStep h;
      h.lr = 1e-2;
      h.weight_decay = 0.01;
      h.decoupled_weight_decay = true;
      h.step = step;
      ops::adam_update({ops::ParamUpdate{param, grad, slots, master, 0.25}}, h);
      ops::adam_update({ops::ParamUpdate{ref, ref_grad, ref_slots, Tensor()}}, h);
    }
    EXPECT_EQ(bits(master), bits(ref)) << engine::dtype_name(low);
    EXPECT_EQ(bits(slots[1]), bits(ref_slots[1])) << engine::dtype_name(low);
    EXPECT_EQ(bits(param), bits(ops::to(ref, low))) << "the weight is the master rounded to nearest even";
    // A master of the wrong dtype is refused with a message that says what is expected.
    try {
      ops::adam_update({ops::ParamUpdate{param, grad, ref_slots, param}}, ops::AdamStep{});
      FAIL();
    } catch (const engine::Error& e) {
      EXPECT_NE(std::string(e.what()).find("master weight must be f32"), std::string::npos) << e.what();
    }
  }
}

TEST(Precision, LossScalerHalvesOnOverflowAndGrowsAfterTheInterval) {
  models::LossScaler s;
  s.growth_interval = 3;
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale, 32768.0);
  EXPECT_EQ(s.skipped, 1);
  for (int i = 0; i < 3; i++) EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale, 65536.0);
}

// bf16: parameters 2 bytes each under `param`, one f32 master each under `optimizer` ("<name>/master"),
// f32 Adam slots; the same on cpu and meta, allocation for allocation.
TEST(Precision, TheLedgerShowsBf16WeightsAndF32Masters) {
  for (const char* p : {"bf16", "fp16"}) {
    std::string csv[2];
    int k = 0;
    for (auto dev : {cpu(), meta()}) {
      engine::DeviceGuard g(dev);
      auto m = models::create_model(tiny_lm(p));
      // Bytes per element summed over the parameters, each block rounded to the allocator's 256 bytes.
      auto bytes = [&](size_t per_element) {
        size_t total = 0;
        for (auto& [n, t] : m->module().named_parameters())
          total += (size_t(t.numel()) * per_element + 255) / 256 * 256;
        return total;
      };
      EXPECT_EQ(dev->ledger().live_bytes(engine::Category::param), bytes(2)) << p;
      EXPECT_EQ(dev->ledger().live_bytes(engine::Category::optimizer), bytes(4)) << "masters before step 1";
      m->train_step(1);
      EXPECT_EQ(dev->ledger().live_bytes(engine::Category::optimizer), 3 * bytes(4)) << "master + Adam's 2 slots";
      auto [name, w] = m->module().named_parameters().front();
      EXPECT_EQ(w.dtype(), models::compute_dtype(models::precision_from_name(p)));
      EXPECT_EQ(m->optimizer().master_weight(name).dtype(), DType::f32);
      EXPECT_NE(dev->ledger().events_csv().find(name + "/master"), std::string::npos);
      csv[k++] = dev->ledger().events_csv();
    }
    EXPECT_TRUE(csv[0] == csv[1]) << p << ": meta's allocations differ from cpu's";
  }
}

// Mixed precision trains like fp32: same data and initialization, losses close step by step and falling.
TEST(Precision, Bf16AndFp16TrackTheFp32LossCurve) {
  std::map<std::string, std::vector<double>> curve;
  for (const char* p : {"fp32", "bf16", "fp16"}) {
    engine::DeviceGuard g(cpu());
    auto m = models::create_model(tiny_lm(p));
    curve[p] = train(*m, 1, 30);
  }
  const auto& ref = curve["fp32"];
  EXPECT_LT(ref.back(), 0.8 * ref.front()) << "fp32 itself does not learn: the comparison would mean nothing";
  for (const char* p : {"bf16", "fp16"}) {
    for (size_t i = 0; i < ref.size(); i++)
      EXPECT_NEAR(curve[p][i], ref[i], 0.03 * ref[i] + 0.02) << p << " step " << i + 1;
    EXPECT_NE(curve[p], ref) << p << " computed exactly like fp32: the precision was not applied";
  }
}

// A loss scale that overflows f16 (65504 is its largest value) makes the gradients inf: the step must be
// skipped (weights unchanged), the scale halved, and the step line told.
TEST(Precision, AnOverflowingFp16StepIsSkipped) {
  engine::DeviceGuard g(cpu());
  auto m = models::create_model(tiny_lm("fp16"));
  m->set_loss_scale(1e30);
  auto [name, w] = m->module().named_parameters().front();
  std::vector<double> before = bits(w), master_before = bits(m->optimizer().master_weight(name));
  models::StepResult r = m->train_step(1);
  EXPECT_EQ(bits(w), before);
  EXPECT_EQ(bits(m->optimizer().master_weight(name)), master_before);
  EXPECT_EQ(m->loss_scaler().scale, 5e29);
  EXPECT_EQ(m->loss_scaler().skipped, 1);
  ASSERT_EQ(r.details.size(), 1u);
  EXPECT_NE(r.details[0].find("overflowed"), std::string::npos) << r.details[0];
  EXPECT_EQ(m->optimizer().step_count(), 0);
  m->set_loss_scale(1024);
  m->train_step(2);
  EXPECT_NE(bits(w), before) << "a finite step updates the weights";
}

// A skipped step still allocates the optimizer state (Optimizer::allocate_state), so the arena's layout does
// not depend on whether a gradient overflowed: after an overflowing step 1 the live blocks (offset, size,
// category, owner) are those after an applied step 1, and step 2's peak is the same. This is what lets meta,
// where nothing overflows, predict a cuda fp16 run whose first steps overflow. And the slots only appeared
// early: step 2 then gives the weights of a model that never ran step 1.
TEST(Precision, ASkippedFp16StepLeavesTheLayoutOfAnAppliedOne) {
  struct Run {
    std::shared_ptr<engine::Device> device = cpu();
    std::unique_ptr<models::Model> model;
  };
  auto start = [](Run& r) {
    engine::DeviceGuard g(r.device);
    r.model = models::create_model(tiny_lm("fp16"));
  };
  Run skipped, applied, fresh;
  for (Run* r : {&skipped, &applied, &fresh}) start(*r);
  auto step = [](Run& r, int64_t n, double scale) {
    engine::DeviceGuard g(r.device);
    r.model->set_loss_scale(scale);
    return r.model->train_step(n);
  };
  ASSERT_EQ(step(skipped, 1, 1e30).details.size(), 1u);  // "gradients overflowed"
  ASSERT_TRUE(step(applied, 1, 1024).details.empty());
  EXPECT_EQ(skipped.model->optimizer().step_count(), 0);
  EXPECT_TRUE(skipped.model->optimizer().params_without_state().empty());
  auto layout = [](const Run& r) {
    std::vector<std::tuple<size_t, size_t, int, std::string>> blocks;
    for (const auto& b : r.device->ledger().live_blocks())
      blocks.emplace_back(b.offset, b.rounded, int(b.category), b.owner);
    std::sort(blocks.begin(), blocks.end());
    return blocks;
  };
  EXPECT_EQ(layout(skipped), layout(applied));
  EXPECT_GT(skipped.device->ledger().live_bytes(engine::Category::optimizer),
            applied.device->ledger().live_bytes(engine::Category::param));  // masters and Adam's two slots
  step(skipped, 2, 1024);
  step(applied, 2, 1024);
  step(fresh, 2, 1024);
  EXPECT_EQ(skipped.device->ledger().peak_bytes(), applied.device->ledger().peak_bytes());
  auto [name, w] = skipped.model->module().named_parameters().front();
  EXPECT_EQ(bits(w), bits(fresh.model->module().named_parameters().front().second));
}

// Save a bf16 run after 2 steps, load it into a new model, continue: the same losses as without a break
// (the f32 masters and the precision are in the file).
TEST(Precision, ABf16CheckpointResumesBitForBit) {
  char tmpl[] = "/tmp/precision_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/bf16.safetensors";
  std::vector<double> straight, resumed;
  {
    engine::DeviceGuard g(cpu());
    auto m = models::create_model(tiny_lm("bf16"));
    straight = train(*m, 1, 4);
  }
  {
    engine::DeviceGuard g(cpu());
    auto m = models::create_model(tiny_lm("bf16"));
    resumed = train(*m, 1, 2);
    tools::save_checkpoint(path, *m, tiny_lm("bf16"), 2);
  }
  {
    engine::DeviceGuard g(cpu());
    models::ModelConfig c;
    tools::fill_config_from_checkpoint(path, c, [](const std::string&) { return false; });
    EXPECT_EQ(c.precision, "bf16");
    auto m = models::create_model(c);
    tools::load_checkpoint(path, *m);
    auto rest = train(*m, 3, 4);
    resumed.insert(resumed.end(), rest.begin(), rest.end());
  }
  {
    engine::DeviceGuard g(cpu());  // resuming it as fp32 is refused, naming the fix
    auto m = models::create_model(tiny_lm("fp32"));
    try {
      tools::load_checkpoint(path, *m);
      ADD_FAILURE() << "a bf16 checkpoint loaded into an fp32 run";
    } catch (const engine::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--precision"), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(tmpl);
  EXPECT_EQ(resumed, straight);
}

// Every registered model, full size, 2 steps per precision on meta (mt-dnn on a regression task and a SAN
// task too). Meta checks every op's dtypes, so a model that mixes f32 tensors into bf16 activations fails.
TEST(Precision, EveryModelStepsInEveryPrecisionOnMeta) {
  std::vector<models::ModelConfig> configs;
  for (const std::string& name : models::model_names()) {
    models::ModelConfig c;
    c.name = name;
    configs.push_back(c);
    if (name == "mtdnn")
      for (const char* task : {"stsb", "mnli"}) {
        c.task = task;
        configs.push_back(c);
      }
  }
  for (models::ModelConfig c : configs) {
    for (const char* p : {"tf32", "bf16", "fp16"}) {
      SCOPED_TRACE(c.name + " " + c.task + " " + p);
      c.precision = p;
      engine::DeviceGuard g(meta());
      try {
        auto m = models::create_model(c);
        m->train_step(1);
        m->train_step(2);
        m->eval_step(3);
      } catch (const engine::Error& e) {
        ADD_FAILURE() << e.what();
      }
    }
  }
}
