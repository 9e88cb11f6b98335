// tour_test.cpp: engine/README.md's worked one-layer transformer. The memory of its training step is computed here
// from the formulas the README gives (parameters, Adam state, the tensors autograd saves, the batch, the moment of
// the peak), for the plain step and with --attention flash, --recompute layer and --precision bf16; each is compared
// with the engine on meta, and each figure must appear in the README as written there (so the text cannot drift
// from the engine, nor the engine from the text).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "engine/device.h"
#include "models/registry.h"
#include "tools/explain.h"

using engine::Category;

namespace {

// The tour's transformer_lm: batch B of L tokens, width d, h heads, feed-forward f, vocabulary V, n layers.
struct Dims {
  size_t B = 4, L = 128, d = 64, h = 2, f = 256, V = 512, n = 1;
};

size_t r(size_t bytes) { return (bytes + 255) / 256 * 256; }  // every block is rounded up to 256 bytes

// Parameters, each its own block of `e` bytes per element: wte [V, d] (tied with the LM head), wpe [L, d], per layer
// q/k/v/out [d, d] + [d], two LayerNorms [d] + [d], fc1 [f, d] + [f], fc2 [d, f] + [d]; the final LayerNorm.
size_t parameters(const Dims& m, size_t e) {
  size_t layer = 4 * (r(e * m.d * m.d) + r(e * m.d)) + 4 * r(e * m.d) + r(e * m.f * m.d) + r(e * m.f) +
                 r(e * m.d * m.f) + r(e * m.d);
  return r(e * m.V * m.d) + r(e * m.L * m.d) + m.n * layer + 2 * r(e * m.d);
}

// The tensors saved for backward when forward ends, `e` bytes per activation element (LayerNorm and loss statistics
// stay f32). Per layer: eight [B, L, d] (its input, LayerNorm 1's output, q, k, v, the attention context, the
// residual sum, LayerNorm 2's output), two [B, L, f] (fc1's output, GELU's), four [B, L] statistics (mean and rstd of
// both LayerNorms), and the attention's own: naive, the probabilities [B, h, L, L] and the causal mask [L, L] bool;
// flash, the log-sum-exp [B, h, L] f32 (its output [B, h, L, d/h] is the attention context itself: flash writes it
// in the heads' [B, L, h, d/h] order, so they merge as a view). With --recompute layer a layer keeps its input
// only. Then the head: the last layer's output and the final LayerNorm's (two [B, L, d], two [B, L] statistics), the
// logits [B, L, V], the loss's log-sum-exp [B, L] f32 and the loss itself (4 bytes: one block).
size_t saved(const Dims& m, size_t e, bool flash, bool recompute) {
  const size_t BL = m.B * m.L;
  size_t attention = flash ? r(4 * m.B * m.h * m.L) : r(e * m.B * m.h * m.L * m.L) + r(m.L * m.L);
  size_t layer = recompute ? r(e * BL * m.d) : 8 * r(e * BL * m.d) + 4 * r(4 * BL) + 2 * r(e * BL * m.f) + attention;
  return m.n * layer + 2 * r(e * BL * m.d) + 2 * r(4 * BL) + r(e * BL * m.V) + r(4 * BL) + r(4);
}

// The batch: token ids [B, L] and targets [B * L] (i64), positions [L] (i64).
size_t batch(const Dims& m) { return 2 * r(8 * m.B * m.L) + r(8 * m.L); }

constexpr size_t kWorkspace = size_t(32) << 20;  // the GEMM workspace, made once

struct Measured {
  size_t param = 0, optimizer = 0, saved_at_forward_end = 0, peak = 0;
  std::string peak_owner, timeline;  // timeline: step 2's SVG, as engine_train --timeline draws it
  engine::Phase peak_phase = engine::Phase::setup;
};

// Two steps on meta (Adam's state exists from step 1's update on); step 2 is measured.
Measured run(const Dims& m, const char* attention, const char* recompute, const char* precision) {
  auto device = engine::Device::create(engine::DeviceType::meta, size_t(1) << 40);
  device->ledger().set_detail(true);  // the timeline's phases of frees
  engine::DeviceGuard guard(device);
  models::ModelConfig c;
  c.name = "transformer_lm";
  c.batch = int64_t(m.B);
  c.seq = int64_t(m.L);
  c.attention = attention;
  c.recompute = recompute;
  c.precision = precision;
  c.dims.layers = int64_t(m.n);
  c.dims.hidden = int64_t(m.d);
  c.dims.heads = int64_t(m.h);
  c.dims.ffn = int64_t(m.f);
  c.dims.vocab = int64_t(m.V);
  c.dims.positions = int64_t(m.L);
  c.dims.dropout = 0;
  c.dims.attention_dropout = 0;
  auto model = models::create_model(c);
  model->train_step(1);
  engine::Ledger& ledger = device->ledger();
  const int64_t from = ledger.sequence();
  ledger.reset_peak();
  model->train_step(2);
  Measured out;
  out.param = ledger.live_bytes(Category::param);
  out.optimizer = ledger.live_bytes(Category::optimizer);
  out.peak = ledger.peak_bytes();
  const engine::Ledger::PeakGroups g = ledger.peak_groups();
  out.peak_owner = g.moment.owner;
  out.peak_phase = g.moment.phase;
  // The end of forward: the last event of step 2 that happened in the forward phase.
  const std::vector<engine::BlockInfo> history = ledger.history();
  int64_t end = from;
  for (const engine::BlockInfo& b : history) {
    if (b.alloc_seq > from && b.phase == engine::Phase::forward) end = std::max(end, b.alloc_seq);
    if (b.free_seq > from && b.free_phase == engine::Phase::forward) end = std::max(end, b.free_seq);
  }
  for (const engine::BlockInfo& b : history)
    if (b.category == Category::activation && b.alloc_seq <= end && (b.free_seq < 0 || b.free_seq > end))
      out.saved_at_forward_end += b.rounded;
  out.timeline = tools::memory_timeline_svg(ledger, from, "transformer_lm on meta, step 2: live bytes by category");
  return out;
}

std::string read_text(const char* path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// 1234567 -> "1,234,567 B", as the README writes bytes.
std::string bytes_text(size_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); i++) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out + " B";
}

void expect_in_readme(const std::string& text, size_t v, const char* what) {
  EXPECT_NE(text.find(bytes_text(v)), std::string::npos)
      << "engine/README.md should say " << what << ": " << bytes_text(v);
}

}  // namespace

TEST(Tour, TheOneLayerTransformerByHand) {
  const Dims m;
  const std::string text = read_text("engine/README.md");
  ASSERT_FALSE(text.empty()) << "run from the repository root";

  // fp32, naive attention: the peak is backward's first allocation, the logits' gradient, while everything forward
  // saved is still alive (the gradients of step 1 are gone: zero_grad dropped them).
  const Measured plain = run(m, "naive", "none", "fp32");
  const size_t P = parameters(m, 4), S = saved(m, 4, false, false);
  EXPECT_EQ(plain.param, P);
  EXPECT_EQ(plain.optimizer, 2 * P);
  EXPECT_EQ(plain.saved_at_forward_end, S);
  const size_t dlogits = r(4 * m.B * m.L * m.V), scalars = 2 * r(4);  // and the loss and backward's seed
  const size_t peak = 3 * P + kWorkspace + batch(m) + S + dlogits + scalars;
  EXPECT_EQ(plain.peak, peak);
  EXPECT_EQ(plain.peak_phase, engine::Phase::backward);
  EXPECT_EQ(plain.peak_owner, "loss/cross_entropy_backward");
  for (auto [v, what] : {std::pair<size_t, const char*>{P, "the parameters"},
                         {2 * P, "Adam's state"},
                         {S, "the saved tensors"},
                         {batch(m), "the batch"},
                         {dlogits, "the logits' gradient"},
                         {peak, "the peak"}})
    expect_in_readme(text, v, what);

  // --attention flash: no probabilities or mask; its output and log-sum-exp instead. Same moment of the peak.
  const Measured flash = run(m, "flash", "none", "fp32");
  const size_t S_flash = saved(m, 4, true, false);
  EXPECT_EQ(flash.saved_at_forward_end, S_flash);
  EXPECT_EQ(flash.peak, peak - S + S_flash);
  EXPECT_EQ(flash.peak_owner, "loss/cross_entropy_backward");
  expect_in_readme(text, S_flash, "flash attention's saved tensors");
  expect_in_readme(text, peak - S + S_flash, "flash attention's peak");

  // --recompute layer: forward keeps each layer's input only; backward rebuilds the layer's saved set, so the peak
  // is no longer at the logits' gradient but inside the layer's backward.
  const Measured recompute = run(m, "naive", "layer", "fp32");
  const size_t S_recompute = saved(m, 4, false, true);
  EXPECT_EQ(recompute.saved_at_forward_end, S_recompute);
  EXPECT_LT(recompute.peak, peak);
  EXPECT_EQ(recompute.peak_phase, engine::Phase::backward);
  expect_in_readme(text, S_recompute, "--recompute layer's saved tensors");
  expect_in_readme(text, recompute.peak, "--recompute layer's peak");

  // --precision bf16: bf16 parameters and activations, f32 master weights beside Adam's two f32 moments.
  const Measured bf16 = run(m, "naive", "none", "bf16");
  const size_t P16 = parameters(m, 2), S16 = saved(m, 2, false, false);
  EXPECT_EQ(bf16.param, P16);
  EXPECT_EQ(bf16.optimizer, 3 * P);
  EXPECT_EQ(bf16.saved_at_forward_end, S16);
  const size_t peak16 = P16 + 3 * P + kWorkspace + batch(m) + S16 + r(2 * m.B * m.L * m.V) + scalars;
  EXPECT_EQ(bf16.peak, peak16);
  EXPECT_EQ(bf16.peak_owner, "loss/cross_entropy_backward");
  for (auto [v, what] : {std::pair<size_t, const char*>{P16, "bf16 parameters"},
                         {3 * P, "masters and Adam"},
                         {S16, "bf16's saved tensors"},
                         {peak16, "bf16's peak"}})
    expect_in_readme(text, v, what);
}

// The formulas are formulas, not one config's numbers: two layers, another width and sequence.
TEST(Tour, TheFormulasHoldForOtherShapes) {
  Dims m;
  m.n = 2;
  m.L = 64;
  m.d = 128;
  m.h = 4;
  m.f = 512;
  m.B = 2;
  for (const char* attention : {"naive", "flash"}) {
    const Measured x = run(m, attention, "none", "fp32");
    EXPECT_EQ(x.param, parameters(m, 4));
    EXPECT_EQ(x.saved_at_forward_end, saved(m, 4, std::string(attention) == "flash", false)) << attention;
  }
  EXPECT_EQ(run(m, "naive", "layer", "fp32").saved_at_forward_end, saved(m, 4, false, true));
  EXPECT_EQ(run(m, "naive", "none", "bf16").saved_at_forward_end, saved(m, 2, false, false));
}

// The plot engine/README.md shows is what the engine draws today (tools/bench/update_docs.sh writes it).
TEST(Tour, TheReadmesTimelineIsTodays) {
  const std::string committed = read_text("tools/bench/plots/tour_timeline.svg");
  ASSERT_FALSE(committed.empty()) << "run from the repository root";
  EXPECT_EQ(committed, run(Dims(), "naive", "none", "fp32").timeline)
      << "tools/bench/plots/tour_timeline.svg is stale: run tools/bench/update_docs.sh";
  EXPECT_NE(read_text("engine/README.md").find("](../tools/bench/plots/tour_timeline.svg)"), std::string::npos);
}
