// checkpoint_test.cpp: save -> load -> continue equals an uninterrupted run bit for bit (cpu, dropout on);
// weights-only (Hugging Face style) files; errors that name the tensor or the file; meta refuses to save;
// the command line's config is rebuilt from the checkpoint.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/json.h"
#include "engine/rng.h"
#include "engine/safetensors.h"
#include "models/registry.h"
#include "models/transformer_lm.h"
#include "tools/checkpoint.h"
#include "tests/util/error_util.h"

namespace {

using testutil::error_of;

constexpr size_t kCapacity = size_t(256) << 20;

// Tiny and quick, with dropout so that the random stream's position matters.
models::TransformerLMConfig tiny_with_dropout(uint64_t seed = 7) {
  models::TransformerLMConfig c;
  c.seq = 16;
  c.batch = 4;
  c.dropout = 0.1;
  c.seed = seed;
  return c;
}

models::ModelConfig recorded_config() {  // what engine_train would record for it
  models::ModelConfig c;
  c.name = "transformer_lm";
  c.size = "tiny";
  c.seq = 16;
  c.batch = 4;
  c.seed = 7;
  return c;
}

std::shared_ptr<engine::Device> fresh_cpu() { return engine::Device::create(engine::DeviceType::cpu, kCapacity); }

std::vector<double> losses(models::Model& m, int64_t first, int64_t last) {
  std::vector<double> out;
  for (int64_t s = first; s <= last; s++) out.push_back(m.train_step(s).loss);
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/checkpoint_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

}  // namespace

TEST_F(Checkpoint, SaveLoadContinueEqualsAnUninterruptedRunBitForBit) {
  std::vector<double> uninterrupted;
  {
    engine::DeviceGuard g(fresh_cpu());
    models::TransformerLM m(tiny_with_dropout());
    uninterrupted = losses(m, 1, 4);
  }
  std::vector<double> resumed;
  {
    engine::DeviceGuard g(fresh_cpu());
    models::TransformerLM m(tiny_with_dropout());
    resumed = losses(m, 1, 2);
    tools::save_checkpoint(path("run.safetensors"), m, recorded_config(), 2);
  }
  {
    engine::DeviceGuard g(fresh_cpu());  // a new process, in effect: new arena, model rebuilt from its seed
    models::TransformerLM m(tiny_with_dropout());
    tools::CheckpointLoad l = tools::load_checkpoint(path("run.safetensors"), m);
    EXPECT_TRUE(l.engine_checkpoint);
    EXPECT_TRUE(l.optimizer_restored);
    EXPECT_EQ(l.step, 2);
    EXPECT_EQ(l.weights, m.module().named_parameters().size());
    EXPECT_EQ(m.optimizer().step_count(), 2);
    auto rest = losses(m, 3, 4);
    resumed.insert(resumed.end(), rest.begin(), rest.end());
  }
  ASSERT_EQ(resumed.size(), uninterrupted.size());
  for (size_t i = 0; i < resumed.size(); i++)
    EXPECT_EQ(resumed[i], uninterrupted[i]) << "step " << i + 1 << " differs after the resume";

  // The restored random stream matters: from the start of the stream, dropout draws other masks.
  engine::DeviceGuard g(fresh_cpu());
  models::TransformerLM m(tiny_with_dropout());
  tools::load_checkpoint(path("run.safetensors"), m);
  engine::manual_seed(7);
  EXPECT_NE(m.train_step(3).loss, uninterrupted[2]) << "dropout is on, so the generator's offset must be saved";
}

TEST_F(Checkpoint, TheFileHoldsWeightsOptimizerStateAndMetadata) {
  engine::DeviceGuard g(fresh_cpu());
  models::TransformerLM m(tiny_with_dropout());
  losses(m, 1, 1);
  tools::save_checkpoint(path("a.safetensors"), m, recorded_config(), 1);
  auto header = engine::read_safetensors_header(path("a.safetensors"));
  std::set<std::string> names;
  for (const auto& e : header.entries) names.insert(e.name);
  EXPECT_TRUE(names.count("wte.weight"));
  EXPECT_TRUE(names.count("h.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(names.count("wte.weight.exp_avg"));
  EXPECT_TRUE(names.count("wte.weight.exp_avg_sq"));
  EXPECT_EQ(names.size(), 3 * m.module().named_parameters().size());
  const auto& md = header.metadata;
  EXPECT_EQ(md.at("engine.model"), "transformer_lm");
  EXPECT_EQ(md.at("engine.size"), "tiny");
  EXPECT_EQ(md.at("engine.step"), "1");
  EXPECT_EQ(md.at("engine.seed"), "7");
  EXPECT_EQ(md.at("engine.batch"), "4");
  EXPECT_EQ(md.at("engine.generator.seed"), std::to_string(engine::generator().seed));
  EXPECT_EQ(md.at("engine.generator.offset"), std::to_string(engine::generator().offset));
  EXPECT_EQ(md.at("optimizer"), "adamw");
}

TEST_F(Checkpoint, ConfigIsRebuiltFromTheCheckpoint) {
  {
    engine::DeviceGuard g(fresh_cpu());
    models::TransformerLM m(tiny_with_dropout());
    losses(m, 1, 1);
    tools::save_checkpoint(path("c.safetensors"), m, recorded_config(), 1);
  }
  models::ModelConfig c;
  c.batch = 2;  // given on the command line: kept
  tools::fill_config_from_checkpoint(path("c.safetensors"), c, [](const std::string& f) { return f == "batch"; });
  EXPECT_EQ(c.name, "transformer_lm");
  EXPECT_EQ(c.size, "tiny");
  EXPECT_EQ(c.seq, 16);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.batch, 2);
  models::ModelConfig other;
  other.name = "bert_base";
  std::string e = error_of([&] {
    tools::fill_config_from_checkpoint(path("c.safetensors"), other, [](const std::string& f) { return f == "model"; });
  });
  EXPECT_NE(e.find("written by model 'transformer_lm', not 'bert_base'"), std::string::npos) << e;
}

TEST_F(Checkpoint, WeightsOnlyFilesLoadStrictly) {
  engine::DeviceGuard g(fresh_cpu());
  models::TransformerLM source(tiny_with_dropout(11));
  // A Hugging Face style file: the weights under their names, no optimizer, no engine metadata.
  engine::save_safetensors(path("hf.safetensors"), source.module().named_parameters(), {{"format", "pt"}});
  models::TransformerLM m(tiny_with_dropout(12));
  ASSERT_NE(m.net().wte->weight.to_double(), source.net().wte->weight.to_double());
  tools::CheckpointLoad l = tools::load_checkpoint(path("hf.safetensors"), m);
  EXPECT_FALSE(l.engine_checkpoint);
  EXPECT_FALSE(l.optimizer_restored);
  EXPECT_EQ(l.step, 0);
  auto a = source.module().named_parameters(), b = m.module().named_parameters();
  for (size_t i = 0; i < a.size(); i++) EXPECT_EQ(a[i].second.to_double(), b[i].second.to_double()) << a[i].first;

  // A missing tensor, and a mis-shaped one, are errors that name the tensor and the file.
  auto params = source.module().named_parameters();
  auto missing = params;
  missing.erase(missing.begin() + 3);
  engine::save_safetensors(path("missing.safetensors"), missing);
  std::string e = error_of([&] { tools::load_checkpoint(path("missing.safetensors"), m); });
  EXPECT_NE(e.find(path("missing.safetensors")), std::string::npos) << e;
  EXPECT_NE(e.find(params[3].first), std::string::npos) << e;

  models::TransformerLMConfig wide = tiny_with_dropout(11);
  wide.dim = 32;
  wide.ffn = 64;
  models::TransformerLM narrow(wide);
  engine::save_safetensors(path("shape.safetensors"), narrow.module().named_parameters());
  e = error_of([&] { tools::load_checkpoint(path("shape.safetensors"), m); });
  EXPECT_NE(e.find("'wte.weight' has shape"), std::string::npos) << e;
  EXPECT_NE(e.find(path("shape.safetensors")), std::string::npos) << e;
}

TEST_F(Checkpoint, ATruncatedFileIsRefusedNamingIt) {
  engine::DeviceGuard g(fresh_cpu());
  models::TransformerLM m(tiny_with_dropout());
  losses(m, 1, 1);
  tools::save_checkpoint(path("t.safetensors"), m, recorded_config(), 1);
  std::filesystem::resize_file(path("t.safetensors"), std::filesystem::file_size(path("t.safetensors")) - 100);
  std::string e = error_of([&] { tools::load_checkpoint(path("t.safetensors"), m); });
  EXPECT_NE(e.find(path("t.safetensors")), std::string::npos) << e;
  EXPECT_FALSE(e.empty());
  e = error_of([&] { tools::load_checkpoint(path("no_such_file.safetensors"), m); });
  EXPECT_NE(e.find("no_such_file.safetensors"), std::string::npos) << e;
}

TEST_F(Checkpoint, MetaHasNothingToSave) {
  engine::DeviceGuard g(engine::Device::create(engine::DeviceType::meta, kCapacity));
  models::TransformerLM m(tiny_with_dropout());
  std::string e = error_of([&] { tools::save_checkpoint(path("meta.safetensors"), m, recorded_config(), 0); });
  EXPECT_NE(e.find("meta device"), std::string::npos) << e;
  EXPECT_NE(e.find("nothing to save"), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(path("meta.safetensors")));
}

// --export-hf: DIR/model.safetensors holds exactly the parameters under their (Hugging Face) names, f32 (a bf16
// run's masters), with transformers' format = pt metadata, and DIR/config.json names the architecture and the
// shape. Loaded back as a weights-only file, the same eval loss. (tools/bench/hf_export_check.py loads such a
// folder with transformers itself, on a machine that has it.)
TEST_F(Checkpoint, HuggingFaceExportHoldsTheWeightsAndAConfig) {
  models::ModelConfig c;
  c.name = "bert_squad";
  c.size = "tiny";
  double loss = 0;
  {
    engine::DeviceGuard g(fresh_cpu());
    c.precision = "bf16";
    auto m = models::create_model(c);
    losses(*m, 1, 2);
    tools::export_hf(path("bf16"), *m);
    auto file = engine::load_safetensors(path("bf16/model.safetensors"), engine::default_device());
    EXPECT_EQ(engine::read_safetensors_metadata(path("bf16/model.safetensors")).at("format"), "pt");
    auto params = m->module().named_parameters();
    EXPECT_EQ(file.size(), params.size());
    for (const auto& [name, p] : params) {
      ASSERT_TRUE(file.count(name)) << name;
      EXPECT_EQ(file.at(name).dtype(), engine::DType::f32) << name;
      EXPECT_EQ(file.at(name).to_double(), m->optimizer().master_weight(name).to_double()) << name;
    }
    engine::json::Value cfg = engine::json::parse_json(read_text(path("bf16/config.json")), "config.json");
    EXPECT_EQ(cfg.at("architectures", "config").items.at(0).text, "BertForQuestionAnswering");
    EXPECT_EQ(cfg.at("model_type", "config").text, "bert");
    EXPECT_EQ(cfg.at("hidden_size", "config").text, "64");
    EXPECT_EQ(cfg.at("num_hidden_layers", "config").text, "2");
  }
  {
    engine::DeviceGuard g(fresh_cpu());
    c.precision = "fp32";
    auto m = models::create_model(c);
    losses(*m, 1, 2);
    tools::export_hf(path("fp32"), *m);
    loss = m->eval_step(3).loss;
  }
  {
    engine::DeviceGuard g(fresh_cpu());
    auto m = models::create_model(c);
    tools::CheckpointLoad l = tools::load_checkpoint(path("fp32/model.safetensors"), *m);
    EXPECT_FALSE(l.engine_checkpoint);
    EXPECT_EQ(m->eval_step(3).loss, loss);
  }
  engine::DeviceGuard g(fresh_cpu());
  models::TransformerLM lm(tiny_with_dropout());
  EXPECT_NE(error_of([&] { tools::export_hf(path("lm"), lm); }).find("no Hugging Face transformers architecture"),
            std::string::npos);
  engine::DeviceGuard meta(engine::Device::create(engine::DeviceType::meta, size_t(1) << 30));
  auto on_meta = models::create_model(c);
  EXPECT_NE(error_of([&] { tools::export_hf(path("meta"), *on_meta); }).find("meta device"), std::string::npos);
}
