// mtdnn_test.cpp: MT-DNN end to end and in parts: the GLUE readers (every task's sample file, and broken
// copies rejected with file and line), BERT pair encoding, the GRU cell against its equations, the SAN
// (a probability distribution; gradients against finite differences in f64), and the model: it learns
// on a tiny config, runs every task's head, is deterministic, allocates on meta exactly as on cpu, and at
// full size holds exactly the analytic number of parameters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "engine/device.h"
#include "graph/autograd.h"
#include "models/data/glue.h"
#include "models/mtdnn/mtdnn.h"
#include "models/mtdnn/san.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/error_util.h"

using engine::Device;
using engine::DeviceType;
using engine::Tensor;
using models::data::GlueExample;
using models::data::GlueTask;

namespace {

using testutil::error_of;

std::string glue_dir() {
  std::string here = __FILE__;
  return here.substr(0, here.find_last_of('/')) + "/../data/glue";
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::string write_lines(const std::string& name, const std::vector<std::string>& lines) {
  std::string path = testing::TempDir() + "/mtdnn_test_" + name + ".tsv";
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
  return path;
}

std::shared_ptr<Device> cpu(size_t cap = size_t(1) << 32) { return Device::create(DeviceType::cpu, cap); }
std::shared_ptr<Device> meta(size_t cap = size_t(1) << 36) { return Device::create(DeviceType::meta, cap); }

models::mtdnn::MtdnnConfig tiny(const std::string& tasks = "mnli") {
  models::ModelConfig mc;
  mc.size = "tiny";  // 2 layers, hidden 64, 4 heads, vocab 512
  mc.task = tasks;
  mc.seq = 32;
  mc.batch = 8;
  auto c = models::mtdnn::MtdnnConfig::from(mc);
  c.lr = 1e-3;  // a tiny model from scratch, not a fine-tuning of a pretrained one
  c.total_steps = 1000;
  c.warmup_fraction = 0.01;
  return c;
}

std::vector<double> train(const models::mtdnn::MtdnnConfig& c, int steps, std::shared_ptr<Device> dev) {
  engine::DeviceGuard g(dev);
  models::mtdnn::Mtdnn model(c);
  std::vector<double> losses;
  for (int s = 1; s <= steps; s++) {
    losses.push_back(model.train_step(s).loss);
    dev->ledger().check();
  }
  return losses;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// GLUE files

TEST(Glue, ReadsEveryTasksSampleFile) {
  std::map<std::string, size_t> rows;
  for (const GlueTask& t : models::data::glue_tasks()) {
    auto ex = models::data::read_glue_tsv(t, glue_dir() + "/" + t.folder + "/train.tsv");
    rows[t.name] = ex.size();
    for (const auto& e : ex) {
      EXPECT_FALSE(e.a.empty()) << t.name;
      EXPECT_EQ(e.b.empty(), t.kind == models::data::GlueKind::single_classification) << t.name;
    }
  }
  EXPECT_EQ(rows.size(), 8u);
  auto mnli = models::data::read_glue_tsv(models::data::glue_task("mnli"), glue_dir() + "/MNLI/train.tsv");
  ASSERT_EQ(mnli.size(), 5u);
  EXPECT_EQ(mnli[0].a, "The cat sleeps on the warm mat.");  // column 8 (sentence1), not a parse
  EXPECT_EQ(mnli[0].b, "A cat is sleeping.");
  EXPECT_EQ(mnli[0].label, 2);  // entailment; labels are contradiction, neutral, entailment
  EXPECT_EQ(mnli[1].label, 0);
  auto mrpc = models::data::read_glue_tsv(models::data::glue_task("mrpc"), glue_dir() + "/MRPC/train.tsv");
  EXPECT_EQ(mrpc[0].a, "The company reported higher profits this quarter.");
  EXPECT_EQ(mrpc[1].label, 0);
  auto cola = models::data::read_glue_tsv(models::data::glue_task("cola"), glue_dir() + "/CoLA/train.tsv");
  ASSERT_EQ(cola.size(), 4u);  // no header: the first line is an example
  EXPECT_EQ(cola[1].a, "Ball the chased dog the.");
  EXPECT_EQ(cola[1].label, 0);
  auto stsb = models::data::read_glue_tsv(models::data::glue_task("stsb"), glue_dir() + "/STS-B/train.tsv");
  EXPECT_DOUBLE_EQ(stsb[0].score, 4.8);
  EXPECT_EQ(stsb[1].b, "A child is riding a bike.");
}

TEST(Glue, RejectsBrokenCopiesNamingFileAndLine) {
  for (const GlueTask& t : models::data::glue_tasks()) {
    SCOPED_TRACE(t.name);
    std::vector<std::string> lines = read_lines(glue_dir() + "/" + t.folder + "/train.tsv");
    ASSERT_GE(lines.size(), 3u);
    // Line 3 loses its last column.
    auto short_row = lines;
    short_row[2] = short_row[2].substr(0, short_row[2].find_last_of('\t'));
    std::string path = write_lines(t.name + "_short", short_row);
    std::string msg = error_of([&] { models::data::read_glue_tsv(t, path); });
    EXPECT_NE(msg.find(path + ":3: expected"), std::string::npos) << msg;
    EXPECT_NE(msg.find("columns"), std::string::npos) << msg;
    // Line 2's target is not a label (or, for stsb, not a number).
    auto bad_label = lines;
    auto cols = [](const std::string& l) {
      std::vector<std::string> c;
      std::stringstream ss(l);
      for (std::string x; std::getline(ss, x, '\t');) c.push_back(x);
      if (!l.empty() && l.back() == '\t') c.push_back("");
      return c;
    };
    std::vector<std::string> c = cols(bad_label[1]);
    size_t target = t.name == "cola" ? 1 : t.name == "mrpc" ? 0 : c.size() - 1;  // the label or score column
    c[target] = "maybe";
    std::string joined;
    for (size_t i = 0; i < c.size(); i++) joined += (i ? "\t" : "") + c[i];
    bad_label[1] = joined;
    path = write_lines(t.name + "_label", bad_label);
    msg = error_of([&] { models::data::read_glue_tsv(t, path); });
    EXPECT_NE(msg.find(path + ":2: "), std::string::npos) << msg;
    EXPECT_NE(msg.find("'maybe'"), std::string::npos) << msg;
  }
  // A file of another task: the header lacks the columns.
  std::string msg = error_of([&] {
    models::data::read_glue_tsv(models::data::glue_task("mnli"), glue_dir() + "/RTE/train.tsv");
  });
  EXPECT_NE(msg.find("RTE/train.tsv:1: the header has no column 'gold_label'"), std::string::npos) << msg;
  msg = error_of([&] { models::data::read_glue_tsv(models::data::glue_task("rte"), "/nonexistent/train.tsv"); });
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

TEST(Glue, EncodesPairsAsBertDoes) {
  models::data::ByteTokenizer tok;
  GlueExample e{"ab", "c", 1, 0};
  auto b = models::data::encode_examples({e}, true, 8, tok);
  const int64_t A = 5 + 'a', Bb = 5 + 'b', C = 5 + 'c';
  EXPECT_EQ(b.ids, (std::vector<int64_t>{2, A, Bb, 3, C, 3, 0, 0}));  // [CLS] a b [SEP] c [SEP] [PAD] [PAD]
  EXPECT_EQ(b.token_types, (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 0, 0}));
  EXPECT_EQ(b.padding, (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(b.not_premise, (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(b.not_hypothesis, (std::vector<int64_t>{1, 1, 1, 1, 0, 0, 1, 1}));
  // Too long: the longer sentence loses its last tokens first (BERT's _truncate_seq_pair).
  e = {"abcdef", "cc", 0, 0};
  b = models::data::encode_examples({e}, true, 8, tok);
  EXPECT_EQ(b.ids, (std::vector<int64_t>{2, A, Bb, C, 3, C, C, 3}));
  b = models::data::encode_examples({e}, false, 5, tok);  // single sentence: [CLS] a [SEP]
  EXPECT_EQ(b.ids, (std::vector<int64_t>{2, A, Bb, C, 3}));
  // A GLUE directory with a vocab.txt is read with WordPiece and that vocabulary's special ids.
  std::string dir = testing::TempDir() + "/mtdnn_test_vocab";
  std::filesystem::create_directories(dir);
  {
    std::ofstream v(dir + "/vocab.txt");
    v << "[UNK]\n[CLS]\n[SEP]\n[PAD]\n[MASK]\nthe\ncat\n##s\n";
  }
  auto wp = models::data::glue_tokenizer(dir);
  b = models::data::encode_examples({{"The cats", "cat", 0, 0}}, true, 8, *wp);
  EXPECT_EQ(b.ids, (std::vector<int64_t>{1, 5, 6, 7, 2, 6, 2, 3}));  // [CLS] the cat ##s [SEP] cat [SEP] [PAD]
  EXPECT_EQ(models::data::glue_tokenizer("")->vocab_size(), 261);
}

TEST(Glue, SyntheticExamplesFollowTheirRules) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; i++) {
    auto sst = models::data::synthetic_glue_example(models::data::glue_task("sst"), 12, rng);
    int low = 0;
    for (char ch : sst.a) low += ch < 'e' ? 1 : -1;
    EXPECT_EQ(sst.label, low > 0 ? 1 : 0) << sst.a;
    auto cola = models::data::synthetic_glue_example(models::data::glue_task("cola"), 12, rng);
    EXPECT_EQ(cola.label, std::is_sorted(cola.a.begin(), cola.a.end()) ? 1 : 0) << cola.a;
    auto mnli = models::data::synthetic_glue_example(models::data::glue_task("mnli"), 12, rng);
    if (mnli.label == 2) {
      EXPECT_EQ(mnli.a, mnli.b);
    }
    auto stsb = models::data::synthetic_glue_example(models::data::glue_task("stsb"), 12, rng);
    int same = 0;
    for (size_t k = 0; k < stsb.a.size(); k++) same += stsb.a[k] == stsb.b[k];
    EXPECT_DOUBLE_EQ(stsb.score, 5.0 * same / double(stsb.a.size()));
  }
}

// ---------------------------------------------------------------------------------------------------
// GRU cell and SAN

TEST(GruCell, MatchesTheEquationsComputedByHand) {
  const int B = 2, I = 3, H = 2;
  Tensor x = testutil::rand_input({B, I}), h = testutil::rand_input({B, H});
  Tensor wi = testutil::rand_input({3 * H, I}), wh = testutil::rand_input({3 * H, H});
  Tensor bi = testutil::rand_input({3 * H}), bh = testutil::rand_input({3 * H});
  Tensor out = models::mtdnn::gru_cell(x, h, wi, wh, bi, bh);
  auto X = x.to_double(), Hh = h.to_double(), WI = wi.to_double(), WH = wh.to_double(), BI = bi.to_double(),
       BH = bh.to_double();
  auto sigmoid = [](double v) { return 1 / (1 + std::exp(-v)); };
  std::vector<double> expected;
  for (int b = 0; b < B; b++) {
    for (int j = 0; j < H; j++) {
      double gi[3], gh[3];  // rows j, H + j, 2H + j of the stacked (r, z, n) weights
      for (int g = 0; g < 3; g++) {
        int row = g * H + j;
        gi[g] = BI[size_t(row)];
        gh[g] = BH[size_t(row)];
        for (int k = 0; k < I; k++) gi[g] += WI[size_t(row * I + k)] * X[size_t(b * I + k)];
        for (int k = 0; k < H; k++) gh[g] += WH[size_t(row * H + k)] * Hh[size_t(b * H + k)];
      }
      double r = sigmoid(gi[0] + gh[0]), z = sigmoid(gi[1] + gh[1]), n = std::tanh(gi[2] + r * gh[2]);
      expected.push_back((1 - z) * n + z * Hh[size_t(b * H + j)]);
    }
  }
  std::vector<double> got = out.to_double();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); i++) EXPECT_NEAR(got[i], expected[i], 1e-14) << i;
  testutil::expect_gradcheck(
      [](const std::vector<Tensor>& in) { return models::mtdnn::gru_cell(in[0], in[1], in[2], in[3], in[4], in[5]); },
      {x, h, wi, wh, bi, bh});
  EXPECT_THROW(models::mtdnn::gru_cell(x, h, wh, wh, bi, bh), engine::Error);
}

namespace {

// A tiny f64 SAN: B 2, T 5, C 3, 3 classes, K 3 turns. Row 0: premise 0-2, hypothesis 3; row 1: premise
// 0-1, hypothesis 2-3; position 4 is padding in both.
struct TinySan {
  std::vector<Tensor> inputs;  // memory, then the SanWeights tensors in declaration order
  Tensor not_premise, not_hypothesis, turn_weights;
  static constexpr int64_t K = 3;
  TinySan() {
    const int64_t C = 3, n = 3;
    for (const engine::Shape& s : std::vector<engine::Shape>{{2, 5, C}, {1, C}, {1}, {C, C}, {C}, {3 * C, C},
                                                              {3 * C, C}, {3 * C}, {3 * C}, {n, 4 * C}, {n}})
      inputs.push_back(testutil::rand_input(s));
    not_premise = ops::from_vector(std::vector<int64_t>{0, 0, 0, 1, 1, 0, 0, 1, 1, 1}, {2, 5}, engine::DType::boolean);
    not_hypothesis =
        ops::from_vector(std::vector<int64_t>{1, 1, 1, 0, 1, 1, 1, 0, 0, 1}, {2, 5}, engine::DType::boolean);
    std::mt19937_64 rng(3);
    turn_weights = ops::from_vector(models::mtdnn::san_turn_weights(2, K, 0.4, rng), {2, K}, engine::DType::f64);
  }
  Tensor probabilities(const std::vector<Tensor>& in, double dropout, bool training) const {
    models::mtdnn::SanWeights w{in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], in[9], in[10]};
    return models::mtdnn::san_probabilities(w, in[0], not_premise, in[0], not_hypothesis, turn_weights, K, dropout,
                                            training);
  }
};

}  // namespace

TEST(San, TurnWeightsKeepATurnAndSumToOne) {
  std::mt19937_64 rng(5);
  std::vector<double> w = models::mtdnn::san_turn_weights(1000, 5, 0.5, rng);
  int dropped = 0;
  for (int b = 0; b < 1000; b++) {
    double sum = 0;
    for (int t = 0; t < 5; t++) {
      double v = w[size_t(b * 5 + t)];
      sum += v;
      dropped += v == 0;
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
  EXPECT_GT(dropped, 1500);  // about 5 * 0.5 * 1000 minus the forced turns
  EXPECT_LT(dropped, 2500);
}

TEST(San, ProbabilitiesSumToOne) {
  TinySan san;
  for (bool training : {false, true}) {
    std::vector<double> p = san.probabilities(san.inputs, 0.1, training).to_double();
    ASSERT_EQ(p.size(), 6u);
    for (int b = 0; b < 2; b++) EXPECT_NEAR(p[size_t(3 * b)] + p[size_t(3 * b + 1)] + p[size_t(3 * b + 2)], 1.0, 1e-12);
    for (double v : p) EXPECT_GT(v, 0.0);
  }
}

TEST(San, GradientsMatchFiniteDifferences) {
  TinySan san;
  auto f = [&](const std::vector<Tensor>& in) { return san.probabilities(in, 0.0, true); };
  testutil::expect_gradcheck(f, san.inputs);
  testutil::expect_double_backward(f, san.inputs);
}

TEST(San, MaskedPositionsDoNotMatter) {
  TinySan san;
  Tensor before = san.probabilities(san.inputs, 0.0, false);
  // Position 4 (padding in both rows) changes: the output must not.
  double* m = san.inputs[0].data<double>();
  for (int b = 0; b < 2; b++)
    for (int c = 0; c < 3; c++) m[(b * 5 + 4) * 3 + c] += 10.0;
  EXPECT_LT(testutil::max_abs_diff(before, san.probabilities(san.inputs, 0.0, false)), 1e-15);
}

// ---------------------------------------------------------------------------------------------------
// The model

TEST(Mtdnn, TinyModelLearnsMnli) {
  auto c = tiny("mnli");
  c.batch = 16;
  std::vector<double> losses = train(c, 60, cpu());
  double first = (losses[0] + losses[1] + losses[2] + losses[3] + losses[4]) / 5;
  double last = 0;
  for (size_t i = losses.size() - 10; i < losses.size(); i++) last += losses[i] / 10;
  EXPECT_NEAR(losses[0], std::log(3.0), 0.3) << "an untrained SAN predicts roughly uniformly";
  EXPECT_LT(last, 0.7 * first) << "first " << first << " last " << last;
}

TEST(Mtdnn, SampledTasksRunEveryHeadOnGlueFiles) {
  auto c = tiny("");
  c.task_sampling = "uniform";
  c.data = glue_dir();
  c.batch = 4;
  auto dev = cpu();
  engine::DeviceGuard g(dev);
  models::mtdnn::Mtdnn model(c);
  ASSERT_EQ(model.net().heads.size(), 8u);
  std::set<int64_t> seen;
  for (int64_t step = 1; step <= 100 && seen.size() < 8; step++) {
    int64_t task = model.task_of_step(step);
    double loss = model.train_step(step).loss;
    EXPECT_TRUE(std::isfinite(loss)) << c.tasks[size_t(task)] << " at step " << step;
    EXPECT_GE(loss, 0.0);
    seen.insert(task);
    dev->ledger().check();
  }
  EXPECT_EQ(seen.size(), 8u);
  // Evaluation runs a SAN without turn weights (1 / K each).
  EXPECT_TRUE(std::isfinite(model.eval_step(1).loss));
}

TEST(Mtdnn, ProportionalSamplingFollowsTrainingSetSizes) {
  auto dev = meta();
  engine::DeviceGuard g(dev);
  auto c = tiny("");
  c.total_steps = 0;  // the nominal 5 epochs
  models::mtdnn::Mtdnn model(c);
  std::vector<int> count(8, 0);
  for (int64_t s = 0; s < 20000; s++) count[size_t(model.task_of_step(s))]++;
  // mnli 392702 and qqp 363846 of 949098 rows; rte 2490.
  EXPECT_NEAR(count[0] / 20000.0, 0.4138, 0.015);
  EXPECT_NEAR(count[2] / 20000.0, 0.3834, 0.015);
  EXPECT_LT(count[1], 150);
  EXPECT_EQ(model.schedule_steps(), 5 * ((949098 + 7) / 8));
}

TEST(Mtdnn, SameSeedSameLossesBitForBit) {
  auto c = tiny("mnli,sst,stsb");
  c.task_sampling = "uniform";
  std::vector<double> a = train(c, 5, cpu()), b = train(c, 5, cpu());
  EXPECT_EQ(a, b);
  c.seed = 2;
  EXPECT_NE(train(c, 5, cpu()), a);
}

TEST(Mtdnn, MetaMakesTheSameAllocationsAsCpu) {
  auto c = tiny("");
  c.task_sampling = "uniform";
  auto d_cpu = cpu(), d_meta = meta(size_t(1) << 32);
  train(c, 4, d_cpu);
  train(c, 4, d_meta);
  EXPECT_EQ(d_cpu->ledger().events_csv(), d_meta->ledger().events_csv());
  EXPECT_EQ(d_cpu->ledger().peak_bytes(), d_meta->ledger().peak_bytes());
  EXPECT_GT(d_cpu->ledger().peak_bytes(), 0u);
}

TEST(Mtdnn, FullSizeParameterCountIsAnalytic) {
  auto dev = meta();
  engine::DeviceGuard g(dev);
  models::ModelConfig mc;
  mc.name = "mtdnn";
  models::mtdnn::Mtdnn model(mc);  // BERT-Large, all eight tasks, seq 512, batch 8
  const int64_t V = 30522, P = 512, C = 1024, F = 4096, L = 24;
  int64_t bert = V * C + P * C + 2 * C + 2 * C                           // embeddings + LayerNorm
                 + L * (4 * (C * C + C) + 2 * C + (C * F + F) + (F * C + C) + 2 * C)  // layers
                 + C * C + C;                                            // pooler
  EXPECT_EQ(bert, 335141888);  // BERT-Large with pooler, as transformers counts it
  auto san = [&](int64_t n) { return (C + 1) + (C * C + C) + 2 * (3 * C * C + 3 * C) + (4 * C * n + n); };
  auto linear = [&](int64_t n) { return C * n + n; };
  int64_t heads = san(3) + san(2) + san(2) + san(2) + san(2) + linear(2) + linear(2) + linear(1);
  EXPECT_EQ(model.module().num_parameters(), bert + heads);
  std::map<std::string, engine::Shape> shapes;
  for (auto& [name, t] : model.module().named_parameters()) shapes[name] = t.shape();
  EXPECT_EQ(shapes.at("bert.pooler.dense.weight"), (engine::Shape{C, C}));
  EXPECT_EQ(shapes.at("scoring_list.0.rnn.weight_ih"), (engine::Shape{3 * C, C}));
  EXPECT_EQ(shapes.at("scoring_list.0.attn.score_func.linear.weight"), (engine::Shape{C, C}));
  EXPECT_EQ(shapes.at("scoring_list.0.query_wsum.att.linear.weight"), (engine::Shape{1, C}));
  EXPECT_EQ(shapes.at("scoring_list.0.classifier.proj.weight"), (engine::Shape{3, 4 * C}));
  EXPECT_EQ(shapes.at("scoring_list.5.weight"), (engine::Shape{2, C}));  // sst
  EXPECT_EQ(shapes.at("scoring_list.7.weight"), (engine::Shape{1, C}));  // stsb
  // One full-size step on meta (the task of step 1) runs and needs more than the parameters.
  model.train_step(1);
  EXPECT_GT(dev->ledger().peak_bytes(), size_t(4 * (bert + heads)));
}

TEST(Mtdnn, UnknownTaskListsTheValidOnes) {
  models::ModelConfig mc;
  mc.size = "tiny";
  mc.task = "mnli,squad";
  std::string msg = error_of([&] { models::mtdnn::Mtdnn m(mc); });
  EXPECT_NE(msg.find("unknown task 'squad'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mnli, rte, qqp, qnli, mrpc, sst, cola, stsb"), std::string::npos) << msg;
  mc.task = "mnli";
  mc.seq = 4096;
  msg = error_of([&] { models::mtdnn::Mtdnn m(mc); });
  EXPECT_NE(msg.find("--seq 4096"), std::string::npos) << msg;
}

TEST(Mtdnn, LoadsAPretrainedBertIntoTheEncoderOnly) {
  auto dev = cpu();
  engine::DeviceGuard g(dev);
  auto c = tiny("mnli,sst");
  models::mtdnn::Mtdnn model(c);
  c.seed = 9;
  models::mtdnn::Mtdnn other(c);  // different weights everywhere
  std::map<std::string, Tensor> pretrained;
  for (auto& [name, t] : other.net().bert->named_parameters()) pretrained["bert." + name] = t;
  pretrained["cls.predictions.bias"] = ops::zeros({512});  // a pretraining head: ignored
  Tensor head_before;
  {
    graph::NoGrad ng;
    head_before = ops::clone(model.net().heads[1].linear->weight);
  }
  std::vector<std::string> loaded = model.load_weights(pretrained);
  EXPECT_EQ(loaded.size(), other.net().bert->named_parameters().size());
  EXPECT_EQ(testutil::max_abs_diff(model.net().bert->pooler->dense->weight, other.net().bert->pooler->dense->weight),
            0);
  EXPECT_EQ(testutil::max_abs_diff(model.net().heads[1].linear->weight, head_before), 0);  // heads untouched
  pretrained.erase("bert.pooler.dense.bias");
  std::string msg = error_of([&] { model.load_weights(pretrained); });
  EXPECT_NE(msg.find("missing 1 of the model's tensors: pooler.dense.bias"), std::string::npos) << msg;
  // A whole MT-DNN state (heads included) loads strictly: every tensor, buffers too.
  std::map<std::string, Tensor> full;
  for (auto& [name, t] : other.module().named_parameters()) full[name] = t;
  for (auto& [name, t] : other.module().named_buffers()) full[name] = t;
  model.load_weights(full);
  EXPECT_EQ(testutil::max_abs_diff(model.net().heads[1].linear->weight, other.net().heads[1].linear->weight), 0);
  full.erase("scoring_list.0.alpha");
  EXPECT_THROW(model.load_weights(full), engine::Error);
}
