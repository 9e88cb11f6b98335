// shape_levers_test.cpp: a transformer of any shape (--config FILE.json and the dimension flags) and any optimizer
// (--optimizer), at the level of models::create_model: parameter counts against transformers' own counts for the
// published config.json files (tests/data/hf_configs/README.md), overrides against the per-layer formula, the
// errors that name the inconsistent pair, and a model that trains with Adafactor and allocates the same on meta.
#include <gtest/gtest.h>

#include <functional>

#include "engine/device.h"
#include "models/hf_config.h"
#include "models/registry.h"
#include "ops/optimizer.h"
#include "tests/util/error_util.h"
#include "tests/util/meta_util.h"
#include "tests/util/temp_dir.h"

using engine::Category;
using engine::DeviceType;
using models::ModelConfig;

namespace {

std::string config_file(const std::string& name) {
  const std::string here = __FILE__;
  return here.substr(0, here.find_last_of('/')) + "/../data/hf_configs/" + name;
}

int64_t parameters_of(const ModelConfig& c) {
  auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
  engine::DeviceGuard guard(device);
  return models::create_model(c)->module().num_parameters();
}

ModelConfig with_file(const std::string& model, const std::string& file) {
  ModelConfig c;
  c.name = model;
  c.dims = models::read_hf_config(config_file(file), model);
  return c;
}

// One BERT encoder layer: Q, K, V and output projections with biases, two LayerNorms, the FFN's two linears.
int64_t bert_layer(int64_t h, int64_t f) { return 4 * (h * h + h) + 2 * 2 * h + (h * f + f) + (f * h + h); }

}  // namespace

TEST(ShapeLevers, PublishedBertConfigGivesTransformersParameterCount) {
  // transformers' BertForPreTraining(BertConfig.from_json_file(bert-base-uncased.json)): 110,106,428 parameters.
  const ModelConfig c = with_file("bert_base", "bert-base-uncased.json");
  EXPECT_EQ(c.dims.layers, 12);
  EXPECT_EQ(c.dims.hidden, 768);
  EXPECT_EQ(c.dims.vocab, 30522);
  EXPECT_EQ(parameters_of(c), 110106428);
  ModelConfig preset;
  preset.name = "bert_base";
  EXPECT_EQ(parameters_of(preset), 110106428);
  // transformers' BertForQuestionAnswering from the same file: 108,893,186 (no pooler, a 768 -> 2 span head).
  EXPECT_EQ(parameters_of(with_file("bert_squad", "bert-base-uncased.json")), 108893186);
}

TEST(ShapeLevers, PublishedGpt2ConfigGivesTransformersParameterCount) {
  // GPT2LMHeadModel(GPT2Config.from_json_file(gpt2.json)): 124,439,808 parameters (LM head tied to wte).
  const ModelConfig c = with_file("transformer_lm", "gpt2.json");
  EXPECT_EQ(c.dims.ffn, 4 * 768);  // n_inner absent: 4 x n_embd
  EXPECT_EQ(parameters_of(c), 124439808);
  ModelConfig small;
  small.name = "transformer_lm";
  small.size = "small";
  EXPECT_EQ(parameters_of(small), 124439808);
  // GPT-2 XL, the size: 1,557,611,200 parameters (gpt2-xl's GPT2LMHeadModel).
  small.size = "xl";
  EXPECT_EQ(parameters_of(small), 1557611200);
}

TEST(ShapeLevers, SingleDimensionsOverrideTheSizeOrTheFile) {
  ModelConfig base;
  base.name = "bert_base";
  const int64_t full = parameters_of(base);
  ModelConfig four = base;
  four.dims.layers = 4;
  EXPECT_EQ(full - parameters_of(four), 8 * bert_layer(768, 3072));
  ModelConfig wide_ffn = base;
  wide_ffn.dims.ffn = 4096;
  EXPECT_EQ(parameters_of(wide_ffn) - full, 12 * (bert_layer(768, 4096) - bert_layer(768, 3072)));
  // A flag over a file: the file's 12 layers, then --layers 2.
  ModelConfig file = with_file("transformer_lm", "gpt2.json");
  file.dims.layers = 2;
  const int64_t gpt2_layer = 12 * 768 * 768 + 13 * 768;  // attention 4 h^2 + 4 h, MLP 8 h^2 + 5 h, 2 LayerNorms 4 h
  EXPECT_EQ(parameters_of(file), 124439808 - 10 * gpt2_layer);
  // The seq2seq models: --layers on both sides.
  ModelConfig big;
  big.name = "transformer_big";
  ModelConfig big1 = big;
  big1.dims.layers = 1;
  EXPECT_LT(parameters_of(big1), parameters_of(big) / 3);
}

TEST(ShapeLevers, InconsistentShapesAreErrorsNamingThePair) {
  ModelConfig c;
  c.name = "bert_base";
  c.dims.heads = 10;
  EXPECT_ERROR_HAS(parameters_of(c), "hidden 768 (the size's) is not divisible by heads 10",
                   "choose --hidden a multiple of --heads");
  c.dims.hidden = 100;
  c.dims.heads = 12;
  EXPECT_ERROR_HAS(parameters_of(c), "hidden 100 is not divisible by heads 12");
  ModelConfig lm;
  lm.name = "transformer_lm";
  lm.size = "small";
  lm.dims.positions = 256;
  lm.seq = 512;
  EXPECT_ERROR_HAS(parameters_of(lm), "--seq 512 exceeds the 256 learned positions (--positions)");
  lm.seq = 0;  // the default sequence: the whole (shorter) context
  EXPECT_NO_THROW(parameters_of(lm));
  ModelConfig vision;
  vision.name = "yolov3";
  vision.dims.layers = 3;
  EXPECT_ERROR_HAS(parameters_of(vision), "yolov3 is not a transformer", "bert_base", "--size");
  // --seq is for the models of one sequence length; an image or translation model names them instead of ignoring it.
  for (const char* name : {"deeplabv3", "yolov3", "stylegan", "nasnet_large", "maskrcnn", "pix2pixhd",
                           "transformer_big", "convs2s", "unsupmt"}) {
    ModelConfig other;
    other.name = name;
    other.seq = 64;
    EXPECT_ERROR_HAS(parameters_of(other),
                     "--seq sets the sequence length of transformer_lm, bert_base, bert_squad, "
                     "mtdnn",
                     std::string(name) + " takes none");
  }
  // So is every field only some models take (models/registry.h's Takes), each naming the models that take it.
  auto with = [](const char* name, const std::function<void(ModelConfig&)>& set) {
    ModelConfig c;
    c.name = name;
    set(c);
    return c;
  };
  EXPECT_ERROR_HAS(parameters_of(with("bert_base", [](ModelConfig& c) { c.tokens = 4096; })),
                   "--tokens counts the batches of transformer_big, unsupmt, convs2s", "bert_base's batch is --batch");
  EXPECT_ERROR_HAS(parameters_of(with("deeplabv3", [](ModelConfig& c) { c.attention = "flash"; })),
                   "--attention flash is for transformer_lm", "deeplabv3 has no multi-head attention");
  EXPECT_ERROR_HAS(parameters_of(with("convs2s", [](ModelConfig& c) { c.attention = "flash"; })),
                   "convs2s has no multi-head attention with a flash path");
  EXPECT_ERROR_HAS(parameters_of(with("stylegan", [](ModelConfig& c) { c.task = "mnli"; })),
                   "--task chooses the tasks of mtdnn", "stylegan has one task");
  EXPECT_ERROR_HAS(parameters_of(with("yolov3", [](ModelConfig& c) { c.r1_every = 4; })), "--r1-every is stylegan's",
                   "yolov3 has none");
  for (const auto& e : models::registry()) {  // a model that takes flash attention builds with it
    if (e.has(models::kFlash)) {
      EXPECT_NO_THROW(parameters_of(with(e.name.c_str(), [](ModelConfig& c) { c.attention = "flash"; }))) << e.name;
    }
  }
  EXPECT_ERROR_HAS(models::read_hf_config(config_file("gpt2.json"), "bert_base"), "model_type is \"gpt2\"",
                   "bert_base reads \"bert\"");
  EXPECT_ERROR_HAS(models::read_hf_config(config_file("gpt2.json"), "deeplabv3"), "not for deeplabv3");
  testutil::TempDir dir;
  std::string path = dir.write("relu.json", R"({"model_type": "bert", "hidden_act": "relu", "num_hidden_layers": 2})");
  EXPECT_ERROR_HAS(models::read_hf_config(path, "mtdnn"), "hidden_act is \"relu\"", "builds gelu only");
  path = dir.write("half_layer.json", R"({"model_type": "bert", "num_hidden_layers": 2.5})");
  EXPECT_ERROR_HAS(models::read_hf_config(path, "bert_base"), "num_hidden_layers");
  path = dir.write("array.json", "[1, 2]");
  EXPECT_ERROR_HAS(models::read_hf_config(path, "bert_base"), "holds one JSON object");
}

TEST(ShapeLevers, AnyOptimizerReplacesTheRecipeAndAdafactorTrains) {
  ModelConfig c;
  c.name = "transformer_lm";  // tiny: AdamW in its recipe
  c.optimizer = "adafactor";
  auto device = engine::Device::create(DeviceType::cpu, size_t(1) << 30);
  engine::DeviceGuard guard(device);
  auto model = models::create_model(c);
  EXPECT_STREQ(model->optimizer().name(), "adafactor");
  double first = 0, last = 0;
  for (int64_t step = 1; step <= 60; step++) {
    const double loss = model->train_step(step).loss;
    if (step == 1) first = loss;
    last = loss;
  }
  EXPECT_LT(last, first - 0.3) << "Adafactor did not train transformer_lm";
  c.optimizer = "lamb";
  EXPECT_ERROR_HAS(models::create_model(c), "unknown optimizer 'lamb'", "adafactor");
}

TEST(ShapeLevers, EveryOptimizerAllocatesTheSameOnMetaAsOnCpu) {
  for (const std::string& name : ops::optimizer_names()) {
    SCOPED_TRACE(name);
    testutil::expect_meta_allocates_like_cpu([&] {
      ModelConfig c;
      c.name = "bert_base";
      c.size = "tiny";
      c.precision = "bf16";  // f32 masters: the state's dtype follows them
      c.optimizer = name;
      auto model = models::create_model(c);
      for (int64_t step = 1; step <= 2; step++) model->train_step(step);
    });
  }
}
