// bert_test.cpp: bert_base (BertForPreTraining) and bert_squad (BertForQuestionAnswering) end to end:
// parity with Hugging Face transformers (loss and every gradient, from files tools/bench/bert_parity.py wrote,
// so CI needs no Python), learning on the cpu, determinism, meta == cpu allocations, and the full-size
// parameter counts against the formula written out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/device.h"
#include "engine/safetensors.h"
#include "graph/autograd.h"
#include "models/bert/pretraining.h"
#include "models/bert/squad.h"
#include "models/data/squad.h"
#include "models/registry.h"
#include "ops/factory.h"

using engine::Device;
using engine::DeviceType;
using engine::Tensor;
using models::bert::BertConfig;

namespace {

std::shared_ptr<Device> cpu(size_t cap = size_t(1) << 32) { return Device::create(DeviceType::cpu, cap); }
std::shared_ptr<Device> meta(size_t cap = size_t(1) << 40) { return Device::create(DeviceType::meta, cap); }

std::string data_file(const std::string& name) {
  std::string here = __FILE__;
  return here.substr(0, here.find_last_of('/')) + "/../data/bert/" + name;
}

// ---------------------------------------------------------------------------------------------------
// Parity with transformers (tools/bench/bert_parity.py: its CONFIG, dropout off)

BertConfig parity_config(ops::AttentionAlgo algo) {
  BertConfig c;
  c.vocab = 128;
  c.hidden = 32;
  c.layers = 2;
  c.heads = 4;
  c.intermediate = 128;
  c.max_positions = 64;
  c.hidden_dropout = c.attention_dropout = 0.0;
  c.algo = algo;
  return c;
}

// bool [B, T], true where transformers' attention_mask is 0.
Tensor padding_mask(const Tensor& attention_mask) {
  std::vector<int64_t> pad;
  for (double m : attention_mask.to_double()) pad.push_back(m == 0 ? 1 : 0);
  return ops::from_vector(pad, attention_mask.shape(), engine::DType::boolean);
}

double relative_error(double got, double want) { return std::abs(got - want) / std::abs(want); }

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Every parameter's gradient against "grad.<name>": max |got - want| / max |want| over each tensor (relative
// to the gradient's scale, so entries near zero, which float32 reaches only to an absolute precision, do not
// dominate). Gradients that are zero in exact arithmetic (the key biases: softmax ignores a shift shared by
// a row; qa_outputs.bias and what feeds it alone: each softmax row sums to one) are float64 noise in the
// reference (< 1e-12 of the largest gradient); ours must be float32 noise: below 1e-6 of the largest.
// Returns the worst relative error of the others.
double expect_gradients_match(const graph::Module& net, const std::map<std::string, Tensor>& expected) {
  double largest = 0;
  for (const auto& [name, t] : expected)
    if (name.rfind("grad.", 0) == 0) largest = std::max(largest, max_abs(t.to_double()));
  double worst = 0;
  int compared = 0;
  for (const auto& [name, p] : net.named_parameters()) {
    auto it = expected.find("grad." + name);
    if (it == expected.end() || !p.grad().defined()) {
      ADD_FAILURE() << "no " << (p.grad().defined() ? "reference gradient" : "gradient") << " for " << name;
      continue;
    }
    std::vector<double> got = p.grad().to_double(), want = it->second.to_double();
    double diff = 0;
    for (size_t i = 0; i < want.size(); i++) diff = std::max(diff, std::abs(got[i] - want[i]));
    double scale = max_abs(want);
    if (scale < 1e-12 * largest) {
      EXPECT_LE(max_abs(got), 1e-6 * largest) << name << ": a gradient that is zero in exact arithmetic";
    } else {
      EXPECT_LE(diff / scale, 1e-4) << name;
      worst = std::max(worst, diff / scale);
    }
    compared++;
  }
  EXPECT_EQ(compared, int(net.named_parameters().size()));
  return worst;
}

}  // namespace

TEST(BertParity, PretrainingLossAndGradientsMatchTransformers) {
  for (auto algo : {ops::AttentionAlgo::naive, ops::AttentionAlgo::flash}) {
    SCOPED_TRACE(ops::attention_algo_name(algo));
    auto dev = cpu();
    engine::DeviceGuard g(dev);
    models::bert::BertForPreTraining net(parity_config(algo));
    auto loaded = net.load_hf(engine::load_safetensors(data_file("parity_pretraining.safetensors"), dev));
    EXPECT_EQ(loaded.size(), net.named_parameters().size());
    auto e = engine::load_safetensors(data_file("parity_pretraining_expected.safetensors"), dev);
    auto l = net.forward(e.at("input_ids"), e.at("token_type_ids"), padding_mask(e.at("attention_mask")),
                         e.at("masked_positions"), e.at("masked_labels"), e.at("next_sentence_label"));
    graph::backward(l.total);
    double loss_err = relative_error(l.total.item(), e.at("loss").item());
    EXPECT_LE(loss_err, 1e-5) << l.total.item() << " vs " << e.at("loss").item();
    EXPECT_LE(relative_error(l.mlm.item(), e.at("mlm_loss").item()), 1e-5);
    EXPECT_LE(relative_error(l.nsp.item(), e.at("nsp_loss").item()), 1e-5);
    double grad_err = expect_gradients_match(net, e);
    std::printf("[ parity ] BertForPreTraining %s: loss rel err %.2e, worst gradient rel err %.2e\n",
                ops::attention_algo_name(algo), loss_err, grad_err);
  }
}

TEST(BertParity, QuestionAnsweringLossAndGradientsMatchTransformers) {
  for (auto algo : {ops::AttentionAlgo::naive, ops::AttentionAlgo::flash}) {
    SCOPED_TRACE(ops::attention_algo_name(algo));
    auto dev = cpu();
    engine::DeviceGuard g(dev);
    models::bert::BertForQuestionAnswering net(parity_config(algo));
    net.load_hf(engine::load_safetensors(data_file("parity_qa.safetensors"), dev));
    auto e = engine::load_safetensors(data_file("parity_qa_expected.safetensors"), dev);
    Tensor ids = e.at("input_ids");
    int64_t T = ids.size(1);
    auto clamped = [T](const Tensor& positions) {  // transformers clamps to [0, T]; T is ignored
      std::vector<int64_t> p;
      for (double x : positions.to_double()) p.push_back(models::data::clamp_position(int64_t(x), T));
      return ops::from_vector(p, positions.shape(), engine::DType::i64);
    };
    Tensor loss = net.loss(ids, e.at("token_type_ids"), padding_mask(e.at("attention_mask")),
                           clamped(e.at("start_positions")), clamped(e.at("end_positions")));
    graph::backward(loss);
    double loss_err = relative_error(loss.item(), e.at("loss").item());
    EXPECT_LE(loss_err, 1e-5) << loss.item() << " vs " << e.at("loss").item();
    double grad_err = expect_gradients_match(net, e);
    std::printf("[ parity ] BertForQuestionAnswering %s: loss rel err %.2e, worst gradient rel err %.2e\n",
                ops::attention_algo_name(algo), loss_err, grad_err);
  }
}

TEST(BertParity, CheckpointAliasesAndMissingTensorsAreHandled) {
  auto dev = cpu();
  engine::DeviceGuard g(dev);
  models::bert::BertForPreTraining net(parity_config(ops::AttentionAlgo::naive));
  auto t = engine::load_safetensors(data_file("parity_pretraining.safetensors"), dev);
  // the decoder bias under its other transformers name, and the tied decoder weight stored as a copy
  t["cls.predictions.decoder.bias"] = t.at("cls.predictions.bias");
  t["cls.predictions.decoder.weight"] = t.at("bert.embeddings.word_embeddings.weight");
  t.erase("cls.predictions.bias");
  net.load_hf(t);
  EXPECT_EQ(net.cls->predictions->bias.to_double(), t.at("cls.predictions.decoder.bias").to_double());
  t.erase("bert.pooler.dense.weight");
  try {
    net.load_hf(t);
    ADD_FAILURE() << "expected an error for the missing pooler weight";
  } catch (const engine::Error& err) {
    EXPECT_NE(std::string(err.what()).find("bert.pooler.dense.weight"), std::string::npos) << err.what();
  }
}

// ---------------------------------------------------------------------------------------------------
// Training

namespace {

models::ModelConfig tiny(const std::string& name) {
  models::ModelConfig c;
  c.name = name;
  c.size = "tiny";
  return c;
}

template <typename M>
std::vector<double> train(const models::bert::BertRecipe& r, int steps, std::shared_ptr<Device> dev) {
  engine::DeviceGuard g(dev);
  M model(r);
  std::vector<double> losses;
  for (int s = 1; s <= steps; s++) {
    losses.push_back(model.train_step(s).loss);
    dev->ledger().check();
  }
  return losses;
}

double mean_of_last(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); i++) s += v[i];
  return s / double(n);
}

}  // namespace

TEST(BertBase, TinyModelLearnsOnCpu) {
  auto r = models::bert::BertPretraining::recipe_for(tiny("bert_base"));
  std::vector<double> losses = train<models::bert::BertPretraining>(r, 40, cpu());
  // untrained: ln(512) for the masked words + ln(2) for the next sentence
  EXPECT_NEAR(losses.front(), std::log(512.0) + std::log(2.0), 0.5);
  EXPECT_LT(mean_of_last(losses, 5), 0.5 * losses.front()) << "first " << losses.front();
}

TEST(BertSquad, TinyModelLearnsOnCpu) {
  auto r = models::bert::BertSquad::recipe_for(tiny("bert_squad"));
  std::vector<double> losses = train<models::bert::BertSquad>(r, 40, cpu());
  EXPECT_NEAR(losses.front(), std::log(64.0), 0.5);  // uniform over the 64 positions
  EXPECT_LT(mean_of_last(losses, 5), 0.5 * losses.front()) << "first " << losses.front();
}

TEST(BertBase, SameSeedSameLossesBitForBit) {
  auto r = models::bert::BertPretraining::recipe_for(tiny("bert_base"));
  r.bert.hidden_dropout = r.bert.attention_dropout = 0.1;  // dropout masks come from the seeded generator
  auto a = train<models::bert::BertPretraining>(r, 3, cpu()), b = train<models::bert::BertPretraining>(r, 3, cpu());
  EXPECT_EQ(a, b);
  r.seed = 2;
  EXPECT_NE(train<models::bert::BertPretraining>(r, 3, cpu()), a);
}

TEST(BertSquad, SameSeedSameLossesBitForBit) {
  auto r = models::bert::BertSquad::recipe_for(tiny("bert_squad"));
  r.bert.hidden_dropout = r.bert.attention_dropout = 0.1;
  auto a = train<models::bert::BertSquad>(r, 3, cpu()), b = train<models::bert::BertSquad>(r, 3, cpu());
  EXPECT_EQ(a, b);
  r.seed = 2;
  EXPECT_NE(train<models::bert::BertSquad>(r, 3, cpu()), a);
}

TEST(BertModels, MetaMakesTheSameAllocationsAsCpu) {
  for (const char* name : {"bert_base", "bert_squad"}) {
    for (const char* algo : {"naive", "flash"}) {
      for (const char* recompute : {"none", "attention", "layer"}) {
        SCOPED_TRACE(std::string(name) + " " + algo + " recompute " + recompute);
        auto c = tiny(name);
        c.attention = algo;
        c.recompute = recompute;
        auto d_cpu = cpu(), d_meta = meta();
        for (auto dev : {d_cpu, d_meta}) {
          engine::DeviceGuard g(dev);
          auto model = models::create_model(c);
          model->train_step(1);
          model->train_step(2);  // the optimizer state exists from the first step
        }
        EXPECT_EQ(d_cpu->ledger().events_csv(), d_meta->ledger().events_csv());
        EXPECT_EQ(d_cpu->ledger().peak_bytes(), d_meta->ledger().peak_bytes());
        EXPECT_GT(d_cpu->ledger().peak_bytes(), 0u);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Full-size parameter counts (meta: nothing is computed)

namespace {

// BertModel with Hugging Face's parameters, written out.
int64_t bert_model_parameters(int64_t V, int64_t C, int64_t L, int64_t F, bool pooler) {
  const int64_t P = 512, types = 2;
  int64_t embeddings = V * C + P * C + types * C + 2 * C;  // word, position, token type, LayerNorm
  int64_t layer = 4 * (C * C + C)                           // query, key, value, attention.output.dense
                  + (C * F + F) + (F * C + C)               // intermediate.dense, output.dense
                  + 2 * (2 * C);                            // two LayerNorms
  return embeddings + L * layer + (pooler ? C * C + C : 0);
}

}  // namespace

TEST(BertBase, FullSizeParameterCountIsTheAnalyticCount) {
  auto dev = meta();
  engine::DeviceGuard g(dev);
  models::bert::BertPretraining model(models::bert::BertPretraining::recipe_for([] {
    models::ModelConfig c;
    c.name = "bert_base";
    return c;
  }()));
  const int64_t V = 30522, C = 768, L = 12, F = 3072;
  int64_t heads = (C * C + C) + 2 * C  // cls.predictions.transform: dense, LayerNorm
                  + V                  // cls.predictions.bias (the decoder weight is the word embedding)
                  + (2 * C + 2);       // cls.seq_relationship
  int64_t expected = bert_model_parameters(V, C, L, F, true) + heads;
  EXPECT_EQ(expected, 110106428);
  EXPECT_EQ(model.module().num_parameters(), expected);
}

TEST(BertSquad, FullSizeParameterCountsAreTheAnalyticCounts) {
  for (const char* size : {"base", "large"}) {
    SCOPED_TRACE(size);
    auto dev = meta();
    engine::DeviceGuard g(dev);
    models::ModelConfig c;
    c.name = "bert_squad";
    c.size = size;
    models::bert::BertSquad model(c);
    bool base = std::string(size) == "base";
    int64_t C = base ? 768 : 1024, L = base ? 12 : 24, F = 4 * C;
    EXPECT_EQ(model.module().num_parameters(), bert_model_parameters(30522, C, L, F, false) + (2 * C + 2));
  }
}
