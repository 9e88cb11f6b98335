// attention_test.cpp: naive and flash attention are the same function: both against plain loops written
// here (forward and gradients), against each other (f64, ~1e-12) over masks, dropout and ragged tile sizes;
// gradient and second-derivative checks; memory: flash saves O(L) bytes for backward, naive O(L^2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "engine/counters.h"
#include "engine/rng.h"
#include "graph/autograd.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/view.h"
#include "tests/util/dropout_reference.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using ops::AttentionAlgo;
using ops::AttentionOptions;
using testutil::rand_input;

namespace {

struct Case {
  const char* name;
  int64_t B, H, Lq, Lk, D, Dv;
  bool causal = false;
  bool padding = false;  // a key padding mask: batch 0 pads its last keys, batch 1 (if any) pads every key
  double dropout_p = 0;
};

// The padding mask of a Case as 0/1 values [B, Lk]: batch 0 pads its last third, batch 1 everything
// (fully masked rows), later batches their first key.
std::vector<double> padding_values(const Case& c) {
  std::vector<double> m(size_t(c.B * c.Lk), 0.0);
  for (int64_t b = 0; b < c.B; b++)
    for (int64_t j = 0; j < c.Lk; j++)
      m[b * c.Lk + j] = b == 0 ? (j >= c.Lk - c.Lk / 3) : b == 1 ? 1.0 : (j == 0);
  return m;
}

Tensor padding_mask(const Case& c) {
  if (!c.padding) return Tensor();
  return ops::compare(ops::CompareOp::gt, ops::from_vector(padding_values(c), {c.B, c.Lk}, DType::f32), 0.5);
}

struct Values {
  std::vector<double> out, dq, dk, dv;
};

// Attention and its gradients as plain loops over the whole score matrix of each row (no tiling, no online
// softmax, the softmax backward written as dS = P (dP - sum_k P_k dP_k)). dout is the gradient of out.
Values reference(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                 uint64_t seed, uint64_t offset) {
  std::vector<double> Q = q.to_double(), K = k.to_double(), V = v.to_double(), G = dout.to_double();
  std::vector<double> pad = c.padding ? padding_values(c) : std::vector<double>(size_t(c.B * c.Lk), 0.0);
  const int64_t H = c.H, Lq = c.Lq, Lk = c.Lk, D = c.D, Dv = c.Dv;
  const double scale = 1.0 / std::sqrt(double(D));
  Values r;
  r.out.assign(size_t(c.B * H * Lq * Dv), 0.0);
  r.dq.assign(Q.size(), 0.0);
  r.dk.assign(K.size(), 0.0);
  r.dv.assign(V.size(), 0.0);
  for (int64_t b = 0; b < c.B; b++)
    for (int64_t h = 0; h < H; h++) {
      const int64_t qh = (b * H + h) * Lq, kh = (b * H + h) * Lk;  // first row of this head
      for (int64_t i = 0; i < Lq; i++) {
        const size_t n = size_t(Lk);
        std::vector<double> s(n), p(n, 0.0), z(n, 1.0), dp(n);
        std::vector<bool> seen(n);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Lk; j++) {
          seen[j] = !(c.causal && j > i + Lk - Lq) && pad[b * Lk + j] == 0;
          double dot = 0;
          for (int64_t d = 0; d < D; d++) dot += Q[(qh + i) * D + d] * K[(kh + j) * D + d];
          s[j] = scale * dot;
          if (seen[j]) m = std::max(m, s[j]);
          if (c.dropout_p > 0) {
            uint64_t flat = uint64_t(((b * H + h) * Lq + i) * Lk + j);
            z[j] = testutil::dropout_reference(1.0, c.dropout_p, seed, offset, flat);
          }
        }
        if (m == -std::numeric_limits<double>::infinity()) continue;  // no key: output 0, gradient 0
        double sum = 0;
        for (int64_t j = 0; j < Lk; j++) sum += seen[j] ? std::exp(s[j] - m) : 0.0;
        for (int64_t j = 0; j < Lk; j++) p[j] = seen[j] ? std::exp(s[j] - m) / sum : 0.0;
        double p_dot_dp = 0;
        for (int64_t j = 0; j < Lk; j++) {
          double g_dot_v = 0;
          for (int64_t e = 0; e < Dv; e++) {
            r.out[(qh + i) * Dv + e] += p[j] * z[j] * V[(kh + j) * Dv + e];
            r.dv[(kh + j) * Dv + e] += p[j] * z[j] * G[(qh + i) * Dv + e];
            g_dot_v += G[(qh + i) * Dv + e] * V[(kh + j) * Dv + e];
          }
          dp[j] = g_dot_v * z[j];
          p_dot_dp += p[j] * dp[j];
        }
        for (int64_t j = 0; j < Lk; j++) {
          double ds = p[j] * (dp[j] - p_dot_dp) * scale;
          for (int64_t d = 0; d < D; d++) {
            r.dq[(qh + i) * D + d] += ds * K[(kh + j) * D + d];
            r.dk[(kh + j) * D + d] += ds * Q[(qh + i) * D + d];
          }
        }
      }
    }
  return r;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); i++) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

AttentionOptions options_for(const Case& c, AttentionAlgo algo) {
  AttentionOptions o;
  o.algo = algo;
  o.causal = c.causal;
  o.dropout_p = c.dropout_p;
  return o;
}

// Runs one algorithm from the given generator state: output and d(sum(out * dout))/d(q, k, v).
Values run(const Case& c, AttentionAlgo algo, const Tensor& q, const Tensor& k, const Tensor& v,
           const Tensor& mask, const Tensor& dout, const engine::Generator& at) {
  engine::generator() = at;
  Tensor out = ops::attention(q, k, v, mask, options_for(c, algo));
  EXPECT_EQ(out.shape(), (Shape{c.B, c.H, c.Lq, c.Dv}));
  std::vector<Tensor> g = graph::grad({ops::sum(ops::mul(out, dout))}, {q, k, v});
  return {out.to_double(), g[0].to_double(), g[1].to_double(), g[2].to_double()};
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"no mask, ragged single tile", 2, 3, 7, 13, 5, 5},
      {"no mask, several tiles, Dv != D", 1, 2, 37, 45, 8, 6},
      {"causal Lq == Lk", 1, 2, 37, 37, 4, 4, true},
      {"causal Lq < Lk", 2, 1, 7, 40, 5, 3, true},
      {"causal Lq > Lk (fully masked rows)", 1, 2, 20, 9, 4, 4, true},
      {"key padding (batch 1 fully padded)", 3, 2, 19, 21, 5, 5, false, true},
      {"causal + key padding", 3, 1, 17, 23, 3, 4, true, true},
      {"dropout", 2, 2, 18, 35, 5, 5, false, false, 0.3},
      {"dropout + causal + padding", 2, 2, 21, 17, 4, 4, true, true, 0.25},
  };
  return all;
}

}  // namespace

TEST(Attention, FlashEqualsNaiveEqualsReference) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    engine::manual_seed(1234);
    Tensor q = rand_input({c.B, c.H, c.Lq, c.D}, -2, 2);
    Tensor k = rand_input({c.B, c.H, c.Lk, c.D}, -2, 2);
    Tensor v = rand_input({c.B, c.H, c.Lk, c.Dv});
    Tensor dout = rand_input({c.B, c.H, c.Lq, c.Dv}, -1, 1, false);
    Tensor mask = padding_mask(c);
    const engine::Generator at = engine::generator();
    Values naive = run(c, AttentionAlgo::naive, q, k, v, mask, dout, at);
    const engine::Generator after_naive = engine::generator();
    Values flash = run(c, AttentionAlgo::flash, q, k, v, mask, dout, at);
    EXPECT_EQ(engine::generator().offset, after_naive.offset) << "both reserve the same random numbers";
    Values ref = reference(c, q, k, v, dout, at.seed, at.offset);
    const double tol = 1e-12;
    EXPECT_LT(max_diff(flash.out, naive.out), tol);
    EXPECT_LT(max_diff(flash.dq, naive.dq), tol);
    EXPECT_LT(max_diff(flash.dk, naive.dk), tol);
    EXPECT_LT(max_diff(flash.dv, naive.dv), tol);
    for (const Values* x : {&naive, &flash}) {
      EXPECT_LT(max_diff(x->out, ref.out), tol);
      EXPECT_LT(max_diff(x->dq, ref.dq), tol);
      EXPECT_LT(max_diff(x->dk, ref.dk), tol);
      EXPECT_LT(max_diff(x->dv, ref.dv), tol);
    }
  }
}

TEST(Attention, FullyMaskedRowsGiveZeroNotNaN) {
  Case c{"all keys padded", 2, 2, 5, 6, 3, 3, false, true};  // batch 1 is fully padded
  engine::manual_seed(5);
  Tensor q = rand_input({c.B, c.H, c.Lq, c.D}), k = rand_input({c.B, c.H, c.Lk, c.D});
  Tensor v = rand_input({c.B, c.H, c.Lk, c.Dv});
  Tensor dout = rand_input({c.B, c.H, c.Lq, c.Dv}, -1, 1, false);
  for (AttentionAlgo algo : {AttentionAlgo::naive, AttentionAlgo::flash}) {
    SCOPED_TRACE(ops::attention_algo_name(algo));
    Values r = run(c, algo, q, k, v, padding_mask(c), dout, engine::generator());
    const int64_t half_out = c.H * c.Lq * c.Dv, half_kv = c.H * c.Lk * c.D;
    for (int64_t i = 0; i < half_out; i++) EXPECT_EQ(r.out[half_out + i], 0.0);
    for (int64_t i = 0; i < c.H * c.Lq * c.D; i++) EXPECT_EQ(r.dq[c.H * c.Lq * c.D + i], 0.0);
    for (int64_t i = 0; i < half_kv; i++) EXPECT_EQ(r.dk[half_kv + i], 0.0);
    for (double x : r.out) EXPECT_FALSE(std::isnan(x));
  }
  // flash's log-sum-exp of such a row is +inf (so backward's exp(s - lse) is 0).
  ops::FlashAttentionParams p;
  std::vector<Tensor> o = ops::flash_attention_forward(q, k, v, padding_mask(c), p);
  std::vector<double> lse = o[1].to_double();
  EXPECT_TRUE(std::isinf(lse.back()) && lse.back() > 0);
  EXPECT_TRUE(std::isfinite(lse.front()));
}

TEST(Attention, NonContiguousInputsAndFloat32) {
  // q, k, v as [B, L, H, D] projections viewed as [B, H, L, D] (what a model passes), in f32.
  engine::manual_seed(9);
  Tensor q = ops::permute(ops::rand({2, 19, 3, 8}, -1, 1), {0, 2, 1, 3});
  Tensor k = ops::permute(ops::rand({2, 33, 3, 8}, -1, 1), {0, 2, 1, 3});
  Tensor v = ops::permute(ops::rand({2, 33, 3, 8}, -1, 1), {0, 2, 1, 3});
  AttentionOptions o;
  o.causal = true;
  Tensor naive = ops::attention(q, k, v, Tensor(), o);
  o.algo = AttentionAlgo::flash;
  Tensor flash = ops::attention(q, k, v, Tensor(), o);
  EXPECT_EQ(flash.dtype(), DType::f32);
  EXPECT_LT(testutil::max_abs_diff(naive, flash), 1e-5);
}

TEST(Attention, GradcheckBothAlgorithms) {
  std::vector<Case> small = {
      {"plain", 1, 2, 3, 5, 3, 2},
      {"causal Lq > Lk + padding", 2, 1, 4, 3, 2, 2, true, true},
      {"dropout", 1, 2, 3, 4, 2, 3, false, false, 0.4},
  };
  for (const Case& c : small) {
    for (AttentionAlgo algo : {AttentionAlgo::naive, AttentionAlgo::flash}) {
      SCOPED_TRACE(std::string(c.name) + " " + ops::attention_algo_name(algo));
      engine::manual_seed(3);
      Tensor q = rand_input({c.B, c.H, c.Lq, c.D}), k = rand_input({c.B, c.H, c.Lk, c.D});
      Tensor v = rand_input({c.B, c.H, c.Lk, c.Dv});
      Tensor mask = padding_mask(c);
      const engine::Generator at = engine::generator();
      // Every evaluation draws its dropout mask from the same generator state.
      testutil::Fn f = [&](const std::vector<Tensor>& in) {
        engine::generator() = at;
        return ops::attention(in[0], in[1], in[2], mask, options_for(c, algo));
      };
      testutil::expect_gradcheck(f, {q, k, v});
      testutil::expect_double_backward(f, {q, k, v});
    }
  }
}

TEST(Attention, FlashBackwardOpHasLseGradientAndGraph) {
  // The lse output is differentiable: d lse_i / d s_ij = P_ij. Check it alone by finite differences.
  engine::manual_seed(11);
  Tensor q = rand_input({1, 2, 4, 3}), k = rand_input({1, 2, 5, 3}), v = rand_input({1, 2, 5, 2});
  ops::FlashAttentionParams p;
  p.causal = true;
  testutil::Fn lse = [&](const std::vector<Tensor>& in) {
    return ops::flash_attention_forward(in[0], in[1], in[2], Tensor(), p)[1];
  };
  testutil::expect_gradcheck(lse, {q, k, v});
  testutil::expect_double_backward(lse, {q, k, v});
}

TEST(Attention, SavesLinearVersusQuadraticMemory) {
  // Activation bytes (saved for backward) after the forward, on a meta device: nothing runs, every byte
  // is counted. Doubling L: naive's saved probabilities grow 4x, flash's saved tensors 2x.
  auto activation_after_forward = [](AttentionAlgo algo, int64_t L) {
    auto meta = engine::Device::create(engine::DeviceType::meta, size_t(1) << 34);
    engine::DeviceGuard guard(meta);
    const int64_t B = 2, H = 4, D = 8;
    Tensor q = ops::zeros({B, H, L, D}).set_requires_grad(true);
    Tensor k = ops::zeros({B, H, L, D}).set_requires_grad(true);
    Tensor v = ops::zeros({B, H, L, D}).set_requires_grad(true);
    AttentionOptions o;
    o.algo = algo;
    o.dropout_p = 0.1;
    Tensor out = ops::attention(q, k, v, Tensor(), o);
    size_t bytes = meta->ledger().live_bytes(engine::Category::activation);
    // What each algorithm must hold: flash q, k, v, out (f32) and lse; naive adds two [B, H, L, L] f32
    // (the probabilities, and their dropped-out copy that the last matmul saves).
    size_t linear = size_t(4 * B * H * L * D * 4);
    if (algo == AttentionAlgo::flash) EXPECT_EQ(bytes, linear + size_t(B * H * L * 4));
    else EXPECT_GE(bytes, size_t(3 * B * H * L * D * 4) + size_t(2 * B * H * L * L * 4));
    return double(bytes);
  };
  double naive_ratio = activation_after_forward(AttentionAlgo::naive, 128) /
                       activation_after_forward(AttentionAlgo::naive, 64);
  double flash_ratio = activation_after_forward(AttentionAlgo::flash, 128) /
                       activation_after_forward(AttentionAlgo::flash, 64);
  EXPECT_GT(naive_ratio, 3.5);
  EXPECT_LE(naive_ratio, 4.0);
  EXPECT_DOUBLE_EQ(flash_ratio, 2.0);
}

namespace {

// The workspace blocks (their requested bytes) that flash's backward allocates and frees on meta for zero inputs q
// [2, 3, Lq, D], k and v [2, 3, Lk, D] of type t.
std::vector<size_t> workspaces_of_backward(DType t, int64_t Lq, int64_t Lk, int64_t D) {
  auto meta = engine::Device::create(engine::DeviceType::meta, size_t(1) << 34);
  engine::DeviceGuard guard(meta);
  Tensor q = ops::zeros({2, 3, Lq, D}, t), k = ops::zeros({2, 3, Lk, D}, t), v = ops::zeros({2, 3, Lk, D}, t);
  std::vector<Tensor> f = ops::flash_attention_forward(q, k, v, Tensor(), {});
  Tensor dout = ops::zeros(f[0].shape(), t);
  const int64_t from = meta->ledger().sequence();
  ops::flash_attention_backward(dout, Tensor(), q, k, v, f[0], f[1], Tensor(), {});
  std::vector<size_t> found;
  for (const engine::BlockInfo& b : meta->ledger().history())
    if (b.alloc_seq > from && b.free_seq >= 0 && b.category == engine::Category::workspace)
      found.push_back(b.requested);
  return found;
}

bool holds(const std::vector<size_t>& blocks, size_t bytes) {
  return std::find(blocks.begin(), blocks.end(), bytes) != blocks.end();
}

}  // namespace

TEST(Attention, FlashBackwardKeepsDsOnlyForShortKeys) {
  // The dS buffer of flash's backward (ops/attention.h): [B*H, Lq, Lk] rounded up to 64, of q's type, allocated
  // by the backward call when the GPU's kernels keep it (bf16/f16 with D == Dv in {64, 128}, f32 with 64) and it
  // takes at most 8 times q's bytes; never for other head dims or long keys. On meta, as on every device.
  auto ds_bytes_of_backward = [](DType t, int64_t Lq, int64_t Lk, int64_t D) -> size_t {
    const size_t want = size_t(2 * 3 * ((Lq + 63) / 64 * 64) * ((Lk + 63) / 64 * 64)) * engine::dtype_size(t);
    return holds(workspaces_of_backward(t, Lq, Lk, D), want) ? want : 0;
  };
  EXPECT_EQ(ds_bytes_of_backward(DType::bf16, 512, 512, 64), size_t(2 * 3 * 512 * 512 * 2)) << "BERT's 512 keys";
  EXPECT_EQ(ds_bytes_of_backward(DType::f16, 77, 131, 128), size_t(2 * 3 * 128 * 192 * 2)) << "rounded up to 64";
  EXPECT_EQ(ds_bytes_of_backward(DType::bf16, 512, 520, 64), 0u) << "more than 8 times q: dQ recomputed";
  EXPECT_EQ(ds_bytes_of_backward(DType::f32, 384, 384, 64), size_t(2 * 3 * 384 * 384 * 4))
      << "f32 at head dim 64: the fp32 CUDA-core kernels keep it";
  EXPECT_EQ(ds_bytes_of_backward(DType::f32, 64, 64, 128), 0u) << "f32 at head dim 128: the generic kernels";
  EXPECT_EQ(ds_bytes_of_backward(DType::bf16, 64, 64, 32), 0u) << "head dim 32: no tensor cores";
  // ENGINE_FLASH_KEEP_DS=0 turns it off (on meta as on the GPU); a value other than 0 or 1 is an error naming it.
  setenv("ENGINE_FLASH_KEEP_DS", "0", 1);
  EXPECT_EQ(ds_bytes_of_backward(DType::bf16, 512, 512, 64), 0u) << "ENGINE_FLASH_KEEP_DS=0";
  setenv("ENGINE_FLASH_KEEP_DS", "1", 1);
  EXPECT_EQ(ds_bytes_of_backward(DType::bf16, 512, 512, 64), size_t(2 * 3 * 512 * 512 * 2))
      << "ENGINE_FLASH_KEEP_DS=1";
  setenv("ENGINE_FLASH_KEEP_DS", "no", 1);
  try {
    ds_bytes_of_backward(DType::bf16, 512, 512, 64);
    ADD_FAILURE() << "ENGINE_FLASH_KEEP_DS=no accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("ENGINE_FLASH_KEEP_DS=\"no\""), std::string::npos) << e.what();
  }
  unsetenv("ENGINE_FLASH_KEEP_DS");
}

TEST(Attention, FlashBackwardHoldsDqSumsWhereDsIsNotKept) {
  // dQ's f32 sums (ops/attention.h): [B*H, Lq, D] f32 and [B*H, ceil(Lq / 64)] i32, held through the backward call
  // with ENGINE_FLASH_DQ_SUMS=1 for bf16/f16 at D == Dv == 128 when dS is not kept; never otherwise. On meta, as on
  // every device.
  auto sums_bytes_of_backward = [](DType t, int64_t Lq, int64_t Lk, int64_t D) -> size_t {
    const std::vector<size_t> blocks = workspaces_of_backward(t, Lq, Lk, D);
    const size_t sums = size_t(2 * 3 * Lq * D * 4), turns = size_t(2 * 3 * ((Lq + 63) / 64) * 4);
    EXPECT_EQ(holds(blocks, sums), holds(blocks, turns)) << "the sums come with their turn counters";
    return holds(blocks, sums) ? sums : 0;
  };
  EXPECT_EQ(sums_bytes_of_backward(DType::bf16, 40, 1100, 128), 0u) << "off by default";
  setenv("ENGINE_FLASH_DQ_SUMS", "1", 1);
  EXPECT_EQ(sums_bytes_of_backward(DType::bf16, 40, 1100, 128), size_t(2 * 3 * 40 * 128 * 4)) << "long keys";
  EXPECT_EQ(sums_bytes_of_backward(DType::f16, 130, 1100, 128), size_t(2 * 3 * 130 * 128 * 4)) << "f16";
  EXPECT_EQ(sums_bytes_of_backward(DType::bf16, 512, 512, 128), 0u) << "short keys: dS kept instead";
  EXPECT_EQ(sums_bytes_of_backward(DType::bf16, 40, 1100, 64), 0u) << "head dim 64: a dQ pass";
  EXPECT_EQ(sums_bytes_of_backward(DType::f32, 40, 1100, 128), 0u) << "f32: the generic kernels";
  setenv("ENGINE_FLASH_KEEP_DS", "0", 1);
  EXPECT_EQ(sums_bytes_of_backward(DType::bf16, 512, 512, 128), size_t(2 * 3 * 512 * 128 * 4))
      << "ENGINE_FLASH_KEEP_DS=0: no dS, so the sums";
  unsetenv("ENGINE_FLASH_KEEP_DS");
  setenv("ENGINE_FLASH_DQ_SUMS", "0", 1);
  EXPECT_EQ(sums_bytes_of_backward(DType::bf16, 40, 1100, 128), 0u) << "ENGINE_FLASH_DQ_SUMS=0";
  unsetenv("ENGINE_FLASH_DQ_SUMS");
}

TEST(Attention, FlashForwardKeepsDropoutDecisionsForShortKeys) {
  // With dropout and short keys (those for which dS is kept: bf16/f16 at head dim 64 or 128, f32 at 64) and Lk a
  // multiple of 8, the forward returns its keep bits [B, H, Lq, Lk rounded up to 64 / 8] u8 (ops/attention.h): bit
  // j % 8 of byte j / 8 of row (b, h, i) is the draw's decision on element (b, h, i, j), tested here against the
  // draw's definition (tests/util).
  ops::FlashAttentionParams p;
  p.dropout_p = 0.3;
  p.seed = 0x5eed;
  p.offset = 4096;
  auto keep_of = [&](DType t, int64_t Lq, int64_t Lk, int64_t D, const ops::FlashAttentionParams& params) {
    engine::manual_seed(3);
    Tensor q = ops::to(ops::randn({2, 3, Lq, D}), t), k = ops::to(ops::randn({2, 3, Lk, D}), t);
    Tensor v = ops::to(ops::randn({2, 3, Lk, D}), t);
    return ops::flash_attention_forward(q, k, v, Tensor(), params)[2];
  };
  const int64_t Lq = 70, Lk = 136;
  Tensor keep = keep_of(DType::bf16, Lq, Lk, 64, p);
  ASSERT_TRUE(keep.defined());
  EXPECT_EQ(keep.dtype(), DType::u8);
  ASSERT_EQ(keep.shape(), (Shape{2, 3, Lq, 24})) << "136 keys rounded up to 192, 8 per byte";
  const std::vector<double> bytes = keep.to_double();
  int64_t wrong = 0, kept = 0;
  for (int64_t row = 0; row < 2 * 3 * Lq; row++)
    for (int64_t j = 0; j < 24 * 8; j++) {
      const bool bit = (uint32_t(bytes[size_t(row * 24 + j / 8)]) >> (j % 8)) & 1u;
      const bool want = j < Lk && testutil::dropout_keeps(p.seed, p.offset, uint64_t(row * Lk + j), p.dropout_p);
      wrong += bit != want;
      kept += bit;
    }
  EXPECT_EQ(wrong, 0) << "bits that differ from the draw (keys past Lk: 0)";
  EXPECT_NEAR(double(kept) / double(2 * 3 * Lq * Lk), 0.7, 0.02);
  EXPECT_TRUE(keep_of(DType::f16, 64, 1024, 128, p).defined()) << "head dim 128: 1024 keys are short";
  EXPECT_FALSE(keep_of(DType::bf16, Lq, Lk, 64, {}).defined()) << "no dropout";
  EXPECT_TRUE(keep_of(DType::f32, Lq, Lk, 64, p).defined()) << "f32 at head dim 64 (the fp32 CUDA-core kernels)";
  EXPECT_FALSE(keep_of(DType::f32, Lq, Lk, 32, p).defined()) << "f32 at head dim 32: the generic kernels";
  EXPECT_FALSE(keep_of(DType::bf16, Lq, 132, 64, p).defined()) << "Lk not a multiple of 8";
  EXPECT_FALSE(keep_of(DType::bf16, 64, 520, 64, p).defined()) << "long keys (dQ recomputes)";
  ops::FlashAttentionParams odd = p;
  odd.offset = 4098;
  EXPECT_FALSE(keep_of(DType::bf16, Lq, Lk, 64, odd).defined()) << "an offset that is not a multiple of 4";
  // ENGINE_FLASH_KEEP_DROPOUT=0 turns it off (every device alike); a value other than 0 or 1 is an error naming it.
  setenv("ENGINE_FLASH_KEEP_DROPOUT", "0", 1);
  EXPECT_FALSE(keep_of(DType::bf16, Lq, Lk, 64, p).defined()) << "ENGINE_FLASH_KEEP_DROPOUT=0";
  setenv("ENGINE_FLASH_KEEP_DROPOUT", "yes", 1);
  try {
    keep_of(DType::bf16, Lq, Lk, 64, p);
    ADD_FAILURE() << "ENGINE_FLASH_KEEP_DROPOUT=yes accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("ENGINE_FLASH_KEEP_DROPOUT=\"yes\""), std::string::npos) << e.what();
  }
  unsetenv("ENGINE_FLASH_KEEP_DROPOUT");
}

TEST(Attention, MetaAllocatesLikeCpu) {
  for (AttentionAlgo algo : {AttentionAlgo::naive, AttentionAlgo::flash}) {
    SCOPED_TRACE(ops::attention_algo_name(algo));
    testutil::expect_meta_allocates_like_cpu([algo] {
      engine::manual_seed(1);
      Tensor q = ops::rand({2, 2, 9, 4}).set_requires_grad(true);
      Tensor k = ops::rand({2, 2, 11, 4}).set_requires_grad(true);
      Tensor v = ops::rand({2, 2, 11, 3}).set_requires_grad(true);
      Tensor mask = ops::compare(ops::CompareOp::gt, ops::rand({2, 11}), 0.7);
      AttentionOptions o;
      o.algo = algo;
      o.causal = true;
      o.dropout_p = 0.2;
      graph::backward(ops::sum(ops::attention(q, k, v, mask, o)));
    });
  }
  // bf16 at head dim 64 with dropout: the forward keeps its keep bits for backward and the backward keeps dS.
  testutil::expect_meta_allocates_like_cpu([] {
    engine::manual_seed(1);
    Tensor qkv = ops::to(ops::rand({2, 16, 3 * 128}), DType::bf16).set_requires_grad(true);
    AttentionOptions o;
    o.algo = AttentionAlgo::flash;
    o.dropout_p = 0.1;
    graph::backward(ops::sum(ops::attention_packed(qkv, 2, Tensor(), o)));
  });
}

TEST(Attention, FlopsCounted) {
  engine::manual_seed(2);
  const int64_t B = 2, H = 3, Lq = 10, Lk = 12, D = 4;
  Tensor q = rand_input({B, H, Lq, D}), k = rand_input({B, H, Lk, D}), v = rand_input({B, H, Lk, D});
  for (bool causal : {false, true}) {
    engine::counters().reset();
    AttentionOptions o;
    o.algo = AttentionAlgo::flash;
    o.causal = causal;
    Tensor out = ops::attention(q, k, v, Tensor(), o);
    graph::backward(ops::sum(out));
    const double forward = 4.0 * B * H * Lq * Lk * D * (causal ? 0.5 : 1.0);
    EXPECT_DOUBLE_EQ(engine::counters().by_op["flash_attention"].flops, forward);
    EXPECT_DOUBLE_EQ(engine::counters().by_op["flash_attention_backward"].flops, 2.5 * forward);
  }
}

TEST(Attention, ShapeErrorsNameTheArgument) {
  Tensor q = ops::zeros({2, 3, 5, 4}), k = ops::zeros({2, 3, 6, 4}), v = ops::zeros({2, 3, 6, 7});
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const engine::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  for (AttentionAlgo algo : {AttentionAlgo::naive, AttentionAlgo::flash}) {
    AttentionOptions o;
    o.algo = algo;
    expect_error([&] { ops::attention(q, ops::zeros({2, 3, 6, 5}), v, Tensor(), o); }, "k must be");
    expect_error([&] { ops::attention(q, k, ops::zeros({2, 3, 5, 7}), Tensor(), o); }, "v must be");
    expect_error([&] { ops::attention(q, k, v, ops::zeros({2, 6}), o); }, "key_padding_mask");
    Tensor bad_mask = ops::compare(ops::CompareOp::gt, ops::zeros({2, 5}), 0.5);
    expect_error([&] { ops::attention(q, k, v, bad_mask, o); }, "[2, 6]");
    expect_error([&] { ops::attention(ops::zeros({3, 5, 4}), k, v, Tensor(), o); }, "'q' must have 4 dimensions");
    o.dropout_p = 1.0;
    expect_error([&] { ops::attention(q, k, v, Tensor(), o); }, "dropout_p");
  }
  EXPECT_EQ(ops::attention_algo_from_name("flash"), AttentionAlgo::flash);
  expect_error([] { ops::attention_algo_from_name("fast"); }, "naive or flash");
}

TEST(Attention, DropoutOnlyWhileTraining) {
  engine::manual_seed(4);
  Tensor q = rand_input({1, 2, 6, 3}), k = rand_input({1, 2, 6, 3}), v = rand_input({1, 2, 6, 3});
  AttentionOptions o;
  o.algo = AttentionAlgo::flash;
  o.dropout_p = 0.5;
  o.training = false;
  const uint64_t before = engine::generator().offset;
  Tensor eval = ops::attention(q, k, v, Tensor(), o);
  EXPECT_EQ(engine::generator().offset, before) << "no numbers drawn outside training";
  o.dropout_p = 0;
  EXPECT_EQ(testutil::max_abs_diff(eval, ops::attention(q, k, v, Tensor(), o)), 0.0);
}

TEST(Attention, FlashOutputsKeepTheHeadsLayoutSoMergingThemIsAView) {
  // Heads split from [B, L, C] rows are [B, H, L, D] views with the L stride outside the H stride. Flash attention
  // writes its output and the gradients of q, k, v in that same layout (new_empty_in_layout_of), so merging the heads
  // back to [B, L, C] and the gradients' way back to the rows are views: no copies, no second activation.
  engine::manual_seed(4);
  const int64_t B = 2, L = 7, H = 3, D = 4, C = H * D;
  auto split = [&](const Tensor& rows) { return ops::permute(ops::reshape(rows, {B, L, H, D}), {0, 2, 1, 3}); };
  Tensor xq = rand_input({B, L, C}), xk = rand_input({B, L, C}), xv = rand_input({B, L, C});
  AttentionOptions o;
  o.algo = AttentionAlgo::flash;
  o.dropout_p = 0.25;
  const engine::Generator at = engine::generator();
  Tensor out = ops::attention(split(xq), split(xk), split(xv), Tensor(), o);  // [B, H, L, D]
  EXPECT_EQ(out.strides(), (engine::Shape{L * C, D, C, 1})) << "out in the [B, L, H, D] order of q";
  auto& ledger = engine::default_device()->ledger();
  const int64_t allocations = ledger.alloc_count();
  Tensor merged = ops::reshape(ops::permute(out, {0, 2, 1, 3}), {B, L, C});
  EXPECT_EQ(ledger.alloc_count(), allocations) << "merging the heads must be a view";
  EXPECT_EQ(merged.data_ptr(), out.data_ptr());
  Tensor g = ops::rand({B, L, C}, -1, 1, DType::f64);
  graph::backward(merged, g);
  // The same values and gradients as with contiguous heads (the same dropout draw).
  auto heads_of = [&](const Tensor& rows) { return ops::contiguous(split(rows.detach())).set_requires_grad(true); };
  Tensor q2 = heads_of(xq), k2 = heads_of(xk), v2 = heads_of(xv);
  engine::generator() = at;
  Tensor out2 = ops::attention(q2, k2, v2, Tensor(), o);
  EXPECT_EQ(out2.strides(), (engine::Shape{H * L * D, L * D, D, 1})) << "contiguous heads: a contiguous output";
  EXPECT_EQ(ops::contiguous(out).to_double(), out2.to_double());
  graph::backward(out2, ops::contiguous(split(g)));
  for (const auto& [rows, heads] : {std::pair{xq, q2}, std::pair{xk, k2}, std::pair{xv, v2}})
    EXPECT_EQ(ops::contiguous(split(rows.grad())).to_double(), heads.grad().to_double());
}

namespace {

// Part `part` of qkv [B, L, 3C] as heads [B, H, L, C / H], through engine ops (what separate projections give).
Tensor heads_of_packed(const Tensor& qkv, int part, int64_t heads) {
  const int64_t B = qkv.size(0), L = qkv.size(1), C = qkv.size(2) / 3;
  return ops::permute(ops::reshape(ops::slice(qkv, 2, part * C, (part + 1) * C), {B, L, heads, C / heads}),
                      {0, 2, 1, 3});
}

}  // namespace

TEST(Attention, PackedIsAttentionOnItsThreeParts) {
  // attention_packed(qkv) = attention(q, k, v) on the head views of qkv's three parts, with the same dropout draw:
  // the values and qkv's gradient, by both algorithms, over the cases' batch sizes, lengths (as self-attention: Lk =
  // Lq), masks and dropout (f64).
  const int64_t H = 2, D = 3;
  for (const Case& c : cases()) {
    for (AttentionAlgo algo : {AttentionAlgo::naive, AttentionAlgo::flash}) {
      SCOPED_TRACE(std::string(c.name) + " " + ops::attention_algo_name(algo));
      engine::manual_seed(21);
      Tensor qkv = rand_input({c.B, c.Lq, 3 * H * D}, -2, 2);
      Tensor g = ops::rand({c.B, H, c.Lq, D}, -1, 1, DType::f64);
      Case sc = c;
      sc.H = H;
      sc.Lk = c.Lq;
      Tensor mask = padding_mask(sc);
      const AttentionOptions o = options_for(sc, algo);
      const engine::Generator at = engine::generator();
      Tensor packed = ops::attention_packed(qkv, H, mask, o);
      Tensor d_packed = graph::grad({packed}, {qkv}, {g})[0];
      engine::generator() = at;
      Tensor split =
          ops::attention(heads_of_packed(qkv, 0, H), heads_of_packed(qkv, 1, H), heads_of_packed(qkv, 2, H), mask, o);
      Tensor d_split = graph::grad({split}, {qkv}, {g})[0];
      EXPECT_LT(testutil::max_abs_diff(packed, split), 1e-12);
      EXPECT_LT(testutil::max_abs_diff(d_packed, d_split), 1e-12);
      EXPECT_EQ(d_packed.shape(), qkv.shape());
    }
  }
}

TEST(Attention, PackedFlashHasOneGradientAndSecondDerivatives) {
  // flash: the op's one input is qkv, and its backward allocates one [B, L, 3C] gradient (no per-part tensors, no
  // sums: two allocations fewer than the unpacked op's); the output stays in the [B, L, H, D] order, so merging the
  // heads is a view. Gradients and second derivatives by finite differences (the second through the engine-op
  // backward).
  engine::manual_seed(22);
  const int64_t B = 2, L = 5, H = 2, D = 3;
  Tensor qkv = rand_input({B, L, 3 * H * D});
  AttentionOptions o;
  o.algo = AttentionAlgo::flash;
  o.causal = true;
  auto& ledger = engine::default_device()->ledger();
  auto backward_allocations = [&](const Tensor& out) {  // of the backward of the merged heads' sum
    const int64_t before = ledger.alloc_count();
    graph::backward(ops::sum(ops::reshape(ops::permute(out, {0, 2, 1, 3}), {B, L, H * D})));
    return ledger.alloc_count() - before;
  };
  Tensor out = ops::attention_packed(qkv, H, Tensor(), o);
  EXPECT_EQ(out.strides(), (Shape{L * H * D, D, H * D, 1}));
  const int64_t packed = backward_allocations(out);
  EXPECT_EQ(qkv.grad().shape(), qkv.shape());
  // The same attention on heads split from three [B, L, C] tensors allocates dq, dk and dv: two tensors more.
  auto split = [&](const Tensor& rows) { return ops::permute(ops::reshape(rows, {B, L, H, D}), {0, 2, 1, 3}); };
  Tensor q = rand_input({B, L, H * D}), k = rand_input({B, L, H * D}), v = rand_input({B, L, H * D});
  EXPECT_EQ(backward_allocations(ops::attention(split(q), split(k), split(v), Tensor(), o)), packed + 2);
  Tensor mask = ops::compare(ops::CompareOp::gt, ops::rand({B, L}), 0.6);
  o.dropout_p = 0.3;
  const engine::Generator at = engine::generator();
  testutil::Fn f = [&](const std::vector<Tensor>& in) {
    engine::generator() = at;
    return ops::attention_packed(in[0], H, mask, o);
  };
  testutil::expect_gradcheck(f, {qkv.detach().set_requires_grad(true)});
  testutil::expect_double_backward(f, {qkv.detach().set_requires_grad(true)});
}

TEST(Attention, PackedMetaAllocatesLikeCpuAndErrors) {
  testutil::expect_meta_allocates_like_cpu([] {
    engine::manual_seed(1);
    Tensor qkv = ops::rand({2, 9, 24}).set_requires_grad(true);
    Tensor mask = ops::compare(ops::CompareOp::gt, ops::rand({2, 9}), 0.7);
    AttentionOptions o;
    o.algo = AttentionAlgo::flash;
    o.dropout_p = 0.2;
    graph::backward(ops::sum(ops::attention_packed(qkv, 2, mask, o)));
  });
  try {
    ops::attention_packed(ops::zeros({2, 9, 20}), 2, Tensor(), AttentionOptions{});
    ADD_FAILURE() << "expected an error";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 x heads"), std::string::npos) << e.what();
  }
}
