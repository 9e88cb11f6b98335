// convs2s_test.cpp: weight normalization's gradients; the tiny convs2s learns to reverse sentences and greedy
// decoding then reproduces held-out reversals; fairseq's parameter names; the full fconv_wmt_en_de on the
// meta device holds exactly the analytic parameter and optimizer bytes; meta makes the cpu's allocations; the
// attention over the source padded to 16 bytes is the unpadded formula.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "engine/allocator.h"
#include "engine/device.h"
#include "graph/autograd.h"
#include "models/convs2s/convs2s.h"
#include "models/convs2s/fconv.h"
#include "models/nn/weight_norm.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/norm.h"
#include "ops/reduce.h"
#include "ops/view.h"
#include "tests/util/gradcheck_util.h"

using engine::Device;
using engine::DeviceType;
using engine::Tensor;
using models::convs2s::Convs2s;
using models::convs2s::Convs2sRecipe;

namespace {

std::shared_ptr<Device> cpu(size_t cap = size_t(1) << 32) { return Device::create(DeviceType::cpu, cap); }
std::shared_ptr<Device> meta(size_t cap = size_t(1) << 40) { return Device::create(DeviceType::meta, cap); }

Convs2sRecipe tiny() {
  models::ModelConfig c;
  c.size = "tiny";
  return Convs2sRecipe::from(c);
}

// NAG (lr 0.5, momentum 0.99, clip 0.1) as in the full recipe: about 28 of 32 held-out reversals exact after
// 180 steps (27 after 150), in ~8 s on one core.
constexpr int kTinySteps = 180;

Convs2sRecipe wmt() { return Convs2sRecipe::from(models::ModelConfig{}); }

// Parameters of fconv_wmt_en_de counted from fairseq's module list, one tensor at a time (each is one block
// of the arena, rounded up to 256 bytes): the count the test holds the model to.
struct ParameterCount {
  int64_t elements = 0;
  size_t bytes = 0;  // f32, rounded per tensor
  void tensor(int64_t n) {
    elements += n;
    bytes += engine::Allocator::round_up(size_t(n) * 4);
  }
  void weight_norm_linear(int64_t in, int64_t out) {  // bias, weight_g [out, 1], weight_v [out, in]
    tensor(out);
    tensor(out);
    tensor(out * in);
  }
  void weight_norm_conv(int64_t k, int64_t in, int64_t out) {  // bias, weight_g [1, 1, out], weight_v [k, in, out]
    tensor(out);
    tensor(out);
    tensor(k * in * out);
  }
  void side(const models::convs2s::FConvConfig& c, bool decoder) {
    tensor((decoder ? c.tgt_vocab : c.src_vocab) * c.embed_dim);  // embed_tokens
    tensor(c.max_positions * c.embed_dim);                         // embed_positions
    int64_t in = c.layers.front().first;
    weight_norm_linear(c.embed_dim, in);  // fc1
    for (auto [channels, k] : c.layers) {
      if (in != channels) weight_norm_linear(in, channels);  // projection
      weight_norm_conv(k, in, 2 * channels);
      if (decoder) {
        weight_norm_linear(channels, c.embed_dim);  // attention in_projection
        weight_norm_linear(c.embed_dim, channels);  // attention out_projection
      }
      in = channels;
    }
    if (decoder) {
      weight_norm_linear(in, c.out_embed_dim);     // fc2
      weight_norm_linear(c.out_embed_dim, c.tgt_vocab);  // fc3
    } else {
      weight_norm_linear(in, c.embed_dim);  // fc2
    }
  }
};

}  // namespace

TEST(WeightNorm, ValuesGradAndDoubleBackward) {
  Tensor v = testutil::rand_input({3, 4, 2}), g = testutil::rand_input({1, 1, 2}, 0.5, 1.5);
  std::vector<double> w = ops::weight_norm(v, g, 2).to_double(), vv = v.to_double(), gv = g.to_double();
  for (int64_t o = 0; o < 2; o++) {
    double norm = 0;
    for (int64_t i = 0; i < 12; i++) norm += vv[size_t(i * 2 + o)] * vv[size_t(i * 2 + o)];
    for (int64_t i = 0; i < 12; i++)
      EXPECT_NEAR(w[size_t(i * 2 + o)], gv[size_t(o)] * vv[size_t(i * 2 + o)] / std::sqrt(norm), 1e-14);
  }
  auto f = [](const std::vector<Tensor>& in) { return ops::weight_norm(in[0], in[1], 2); };
  testutil::expect_gradcheck(f, {v, g});
  testutil::expect_double_backward(f, {v, g});
  Tensor v0 = testutil::rand_input({4, 3}), g0 = testutil::rand_input({4, 1}, 0.5, 1.5);
  testutil::expect_gradcheck([](const std::vector<Tensor>& in) { return ops::weight_norm(in[0], in[1], 0); }, {v0, g0});
  EXPECT_THROW(ops::weight_norm(v, ops::ones({1, 4, 1}, engine::DType::f64), 2), engine::Error);
}

TEST(Convs2s, ParameterNamesAreFairseqs) {
  engine::DeviceGuard guard(meta());
  Convs2s model(wmt());
  std::map<std::string, engine::Shape> shapes;
  for (const auto& [name, t] : model.module().named_parameters()) shapes[name] = t.shape();
  const std::map<std::string, engine::Shape> expected = {
      {"encoder.embed_tokens.weight", {40000, 768}},
      {"encoder.embed_positions.weight", {1024, 768}},
      {"encoder.fc1.weight_g", {512, 1}},
      {"encoder.fc1.weight_v", {512, 768}},
      {"encoder.convolutions.0.weight_v", {3, 512, 1024}},
      {"encoder.convolutions.0.weight_g", {1, 1, 1024}},
      {"encoder.projections.9.weight_v", {1024, 512}},
      {"encoder.projections.13.bias", {2048}},
      {"encoder.convolutions.14.weight_v", {1, 2048, 4096}},
      {"encoder.fc2.weight_v", {768, 2048}},
      {"decoder.attention.0.in_projection.weight_v", {768, 512}},
      {"decoder.attention.14.out_projection.weight_v", {2048, 768}},
      {"decoder.convolutions.3.bias", {1024}},
      {"decoder.fc2.weight_v", {512, 2048}},
      {"decoder.fc3.weight_v", {40000, 512}},
      {"decoder.fc3.weight_g", {40000, 1}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(shapes.count(name)) << name << " is missing";
    EXPECT_EQ(shapes[name], shape) << name;
  }
  EXPECT_FALSE(shapes.count("encoder.projections.0.weight_v")) << "no projection where the width does not change";
  EXPECT_FALSE(shapes.count("encoder.projections.10.weight_v"));
}

TEST(Convs2s, FullSizeMetaHoldsTheAnalyticParameterAndOptimizerBytes) {
  auto dev = meta();
  engine::DeviceGuard guard(dev);
  Convs2s model(wmt());
  ParameterCount expected;
  expected.side(model.recipe().net, false);
  expected.side(model.recipe().net, true);
  EXPECT_EQ(model.module().num_parameters(), expected.elements);
  EXPECT_EQ(dev->ledger().live_bytes(engine::Category::param), expected.bytes);
  // Two steps (NAG's momentum buffers exist after the first): one f32 buffer per parameter tensor.
  model.train_step(1);
  model.train_step(2);
  EXPECT_EQ(dev->ledger().live_bytes(engine::Category::param), expected.bytes);
  EXPECT_EQ(dev->ledger().live_bytes(engine::Category::optimizer), expected.bytes);
  EXPECT_GT(dev->ledger().peak_bytes(), 2 * expected.bytes);
  dev->ledger().check();
}

TEST(Convs2s, IncrementalStepEqualsTheLastRowOfTheFullDecoder) {
  // Untrained tiny model, f32, with padding in the source: step-by-step logits against forward() over the prefix.
  engine::DeviceGuard guard(cpu());
  Convs2s model(tiny());
  models::convs2s::FConvModel& net = model.net();
  net.eval();
  graph::NoGrad ng;
  models::data::TranslationBatch hb = model.host_batch(1);
  models::Batch b = Convs2s::batch_tensors(hb, 1);
  auto enc = net.encoder->forward(b.at("src"), b.at("src_positions"), b.at("src_padding_mask"));
  auto state = net.decoder->start_incremental(enc, b.at("src_padding_mask"));
  const int64_t B = hb.batch, T = hb.tgt_len;
  Tensor full = net.decoder->forward(b.at("prev_output"), b.at("tgt_positions"), enc, b.at("src_padding_mask"));
  std::vector<double> full_v = full.to_double();  // [B, T, V]
  const int64_t V = full.size(2);
  for (int64_t t = 0; t < T; t++) {
    std::vector<int64_t> tok(static_cast<size_t>(B)), pos(static_cast<size_t>(B));
    for (int64_t r = 0; r < B; r++) {
      tok[size_t(r)] = hb.prev_output[size_t(r * T + t)];
      pos[size_t(r)] = tok[size_t(r)] == 1 ? 1 : 2 + t;
    }
    std::vector<double> step_v = net.decoder->step(ops::from_vector(tok, {B, 1}), ops::from_vector(pos, {B, 1}), enc,
                                                   b.at("src_padding_mask"), state).to_double();
    double worst = 0;
    for (int64_t r = 0; r < B; r++)
      for (int64_t v = 0; v < V; v++)
        worst = std::max(worst, std::abs(step_v[size_t(r * V + v)] - full_v[size_t((r * T + t) * V + v)]));
    EXPECT_LT(worst, 1e-4) << "position " << t;
  }
}

TEST(Convs2s, AttentionOverThePaddedSourceIsTheUnpaddedFormula) {
  // attention_inputs pads the source to a multiple of 8 positions in bf16 (5 -> 8; 8 stays 8), not in f32; the
  // layer's output and its gradients must be those of the formula over the S real and padded positions alone.
  engine::DeviceGuard guard(cpu());
  const int64_t B = 3, T = 4, C = 6, E = 8;
  for (int64_t S : {5, 8}) {
    for (engine::DType dt : {engine::DType::f32, engine::DType::bf16}) {
      std::unique_ptr<models::convs2s::AttentionLayer> layer;
      {
        graph::ParameterDtypeScope scope(dt);
        layer = std::make_unique<models::convs2s::AttentionLayer>(C, E);
      }
      Tensor h = ops::rand({B, T, C}, -1, 1, dt), te = ops::rand({B, T, E}, -1, 1, dt);
      models::convs2s::FConvEncoder::Output enc{ops::rand({B, S, E}, -1, 1, dt), ops::rand({B, S, E}, -1, 1, dt)};
      std::vector<double> pad(size_t(B * S), 0.0);
      pad[size_t(0 * S + S - 1)] = pad[size_t(2 * S + S - 2)] = pad[size_t(2 * S + S - 1)] = 1;  // right padding
      Tensor mask = ops::from_vector(pad, {B, S}, engine::DType::boolean);
      for (Tensor* t : {&h, &enc.x, &enc.y}) t->set_requires_grad(true);
      auto run = [&](const models::convs2s::AttentionInputs& a) {
        Tensor out = layer->forward(h, te, a);
        std::vector<Tensor> g = graph::grad({ops::sum(ops::mul(out, out))}, {h, enc.x, enc.y});
        return std::vector<std::vector<double>>{out.to_double(), g[0].to_double(), g[1].to_double(), g[2].to_double()};
      };
      const models::convs2s::AttentionInputs padded = models::convs2s::attention_inputs(enc, mask);
      const int64_t Sp = dt == engine::DType::bf16 ? 8 : S;
      EXPECT_EQ(padded.keys_t.size(2), Sp);
      EXPECT_EQ(padded.values.size(1), Sp);
      models::convs2s::AttentionInputs plain{ops::contiguous(ops::transpose(enc.x, 1, 2)), enc.y, mask,
                                             padded.value_scale};
      const auto want = run(plain), got = run(padded);
      const double tol = dt == engine::DType::f32 ? 1e-6 : 0.0;  // bf16: the same sums in the same order
      for (size_t i = 0; i < want.size(); i++) {
        ASSERT_EQ(want[i].size(), got[i].size());
        for (size_t j = 0; j < want[i].size(); j++)
          ASSERT_NEAR(want[i][j], got[i][j], tol + 1e-6 * std::abs(want[i][j]))
              << "S " << S << " " << engine::dtype_name(dt) << " output " << i << " element " << j;
      }
    }
  }
}

TEST(Convs2s, MetaMakesTheSameAllocationsAsCpu) {
  auto r = tiny();
  r.net.dropout = 0.2;  // masks from the seeded counter-based generator: the same program on both devices
  auto d_cpu = cpu(), d_meta = meta(size_t(1) << 32);
  for (auto dev : {d_cpu, d_meta}) {
    engine::DeviceGuard guard(dev);
    Convs2s model(r);
    for (int s = 1; s <= 2; s++) {
      model.train_step(s);
      dev->ledger().check();
    }
  }
  EXPECT_EQ(d_cpu->ledger().events_csv(), d_meta->ledger().events_csv());
  EXPECT_EQ(d_cpu->ledger().peak_bytes(), d_meta->ledger().peak_bytes());
  EXPECT_GT(d_cpu->ledger().peak_bytes(), 0u);
}

TEST(Convs2s, TinyModelLearnsToReverseAndGreedyDecodingReproducesHeldOutSentences) {
  auto r = tiny();
  engine::DeviceGuard guard(cpu());
  Convs2s model(r);
  std::vector<double> losses;
  for (int s = 1; s <= kTinySteps; s++) losses.push_back(model.train_step(s).loss);
  double last = 0;
  for (int s = kTinySteps - 5; s < kTinySteps; s++) last += losses[size_t(s)] / 5;
  EXPECT_LT(last, 0.5 * losses.front()) << "first " << losses.front() << " last " << last;

  // Held-out sentences (another seed), decoded greedily from </s>.
  auto pairs = models::data::synthetic_reversal_pairs(32, r.synthetic_words, r.lengths, 777);
  std::vector<int64_t> all(pairs.size());
  for (size_t i = 0; i < all.size(); i++) all[i] = int64_t(i);
  models::data::TranslationBatch hb = models::data::make_translation_batch(pairs, all);
  models::Batch b = Convs2s::batch_tensors(hb, r.net.padding_idx);
  auto decoded = models::convs2s::greedy_decode(model.net(), b.at("src"), b.at("src_positions"),
                                                b.at("src_padding_mask"), hb.src_len + 3);
  int exact = 0;
  for (size_t i = 0; i < pairs.size(); i++) exact += decoded.sentences[i] == pairs[i].tgt;
  EXPECT_GE(exact, int(pairs.size()) * 3 / 4) << exact << " of " << pairs.size() << " reversed exactly";
  // Incremental decoding (the last K-1 conv inputs per layer) is the same function as recomputing the prefix.
  auto recomputed = models::convs2s::greedy_decode(model.net(), b.at("src"), b.at("src_positions"),
                                                   b.at("src_padding_mask"), hb.src_len + 3, false);
  EXPECT_EQ(decoded.sentences, recomputed.sentences);
  EXPECT_EQ(decoded.steps, recomputed.steps);
}
