// attention_cuda_test.cpp: the flash attention kernels on the GPU against the cpu.
//
// Accuracy rule (flash-attention's): for every output (out, dq, dk, dv) the cuda kernel's largest error
// against an f64 reference (the cpu flash op on the same inputs upcast to f64, itself equal to naive
// attention to 1e-12: attention_test.cpp) must be at most twice the error of naive attention computed in
// the same dtype, plus a small floor. Naive runs on the cuda device when its ops have cuda kernels, else on
// the cpu (same dtype, same rounding of stored intermediates); the message says which. Cases cover odd
// sizes, causal (Lq < Lk and Lq > Lk, whose first rows see no key), key padding with a fully padded batch,
// dropout (the same seed gives the same mask as the cpu), both kernel paths (tensor cores: bf16/f16 with
// head dim 64/128; generic: f32, f64, other head dims, strided rows), and [B, L, H, D] views.
// Also: determinism (two backward runs give the same bits), the ledger (cuda allocates exactly as meta),
// gradients through autograd, and the benchmark AttentionCudaBench.DISABLED_* (B x H x L x D = 32x12x512x64
// and 8x16x4096x128; run with --gtest_also_run_disabled_tests --gtest_filter='AttentionCudaBench*').
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>

#include "engine/cuda/runtime.h"
#include "engine/device.h"
#include "engine/rng.h"
#include "graph/autograd.h"
#include "ops/attention.h"
#include "ops/cuda/attention.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/view.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;

namespace {

std::shared_ptr<engine::Device> gpu() {
  static auto dev = engine::Device::create(engine::DeviceType::cuda, size_t(8) << 30);
  return dev;
}

struct Case {
  const char* name;
  int64_t B, H, Lq, Lk, D, Dv;
  bool causal = false;
  // batch 0 pads its last third of keys, batch 1 every key, batch 2 its first half and the key after it (whole key
  // tiles that the kernels skip, at either end; a dense row's inner tiles need no mask), later batches every fifth
  // key (holes: every tile masked)
  bool padding = false;
  double dropout_p = 0;
  int layout = 0;          // 0 contiguous [B, H, L, D]; 1 views of [B, L, H, D]; 2 rows with stride L (generic)
  bool dq_sums = false;    // ENGINE_FLASH_DQ_SUMS=1 during the case (ops/attention.h: head dim 128, dS not kept)
};

// ENGINE_FLASH_DQ_SUMS=1 while it lives, when asked for.
struct DqSumsOn {
  explicit DqSumsOn(bool on) : on(on) {
    if (on) setenv("ENGINE_FLASH_DQ_SUMS", "1", 1);
  }
  ~DqSumsOn() {
    if (on) unsetenv("ENGINE_FLASH_DQ_SUMS");
  }
  bool on;
};

std::string describe(const Case& c, DType t) {
  return engine::str(c.name, " ", engine::dtype_name(t), " B", c.B, " H", c.H, " Lq", c.Lq, " Lk", c.Lk, " D", c.D,
                     " Dv", c.Dv, c.causal ? " causal" : "", c.padding ? " padding" : "",
                     c.dropout_p > 0 ? engine::str(" dropout ", c.dropout_p) : std::string(),
                     c.layout == 1   ? " [B,L,H,D] views"
                     : c.layout == 2 ? " strided rows"
                                     : "",
                     c.dq_sums ? " ENGINE_FLASH_DQ_SUMS=1" : "");
}

// A [B, H, L, W] tensor of dtype t on the cpu with the case's layout, values normal(0, 1).
Tensor make_input(const Case& c, int64_t L, int64_t W, DType t) {
  if (c.layout == 1) return ops::permute(ops::to(ops::randn({c.B, L, c.H, W}), t), {0, 2, 1, 3});
  if (c.layout == 2) return ops::transpose(ops::to(ops::randn({c.B, c.H, W, L}), t), -1, -2);
  return ops::to(ops::randn({c.B, c.H, L, W}), t);
}

Tensor padding_mask(const Case& c, std::shared_ptr<engine::Device> dev) {
  if (!c.padding) return Tensor();
  std::vector<double> m(size_t(c.B * c.Lk), 0.0);
  for (int64_t b = 0; b < c.B; b++)
    for (int64_t j = 0; j < c.Lk; j++)
      m[size_t(b * c.Lk + j)] = b == 0   ? (j >= c.Lk - c.Lk / 3)
                                : b == 1 ? 1.0
                                : b == 2 ? (j <= c.Lk / 2)
                                         : (j % 5 == 0);
  Tensor mask = ops::compare(ops::CompareOp::gt, ops::from_vector(m, {c.B, c.Lk}, DType::f32), 0.5);
  return dev ? ops::to_device(mask, dev) : mask;
}

// A tensor moved to the device keeping its view: the storage is copied contiguous, then viewed again.
Tensor on_device(const Case& c, const Tensor& x) {
  if (c.layout == 0) return ops::to_device(x, gpu());
  if (c.layout == 1) return ops::permute(ops::to_device(ops::permute(x, {0, 2, 1, 3}), gpu()), {0, 2, 1, 3});
  return ops::transpose(ops::to_device(ops::transpose(x, -1, -2), gpu()), -1, -2);
}

struct Inputs {
  Tensor q, k, v, dout, mask;
};

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

ops::FlashAttentionParams params_of(const Case& c) {
  ops::FlashAttentionParams p;
  p.causal = c.causal;
  if (c.dropout_p > 0) {
    p.dropout_p = c.dropout_p;
    p.seed = 0x5eed1234abcdull;
    p.offset = 4096;
  }
  return p;
}

// The flash op's forward and backward (dlse undefined) on whatever device the inputs are on.
Result run_flash(const Case& c, const Inputs& in) {
  ops::FlashAttentionParams p = params_of(c);
  std::vector<Tensor> f = ops::flash_attention_forward(in.q, in.k, in.v, in.mask, p);
  std::vector<Tensor> g = ops::flash_attention_backward(in.dout, Tensor(), in.q, in.k, in.v, f[0], f[1], in.mask, p);
  return {f[0].to_double(), f[1].to_double(), g[0].to_double(), g[1].to_double(), g[2].to_double()};
}

// Naive attention through engine ops, drawing its dropout where flash does; gradients through autograd.
Result run_naive(const Case& c, const Inputs& in) {
  Tensor q = in.q.detach().set_requires_grad(true), k = in.k.detach().set_requires_grad(true);
  Tensor v = in.v.detach().set_requires_grad(true);
  ops::AttentionOptions o;
  o.causal = c.causal;
  o.dropout_p = c.dropout_p;
  ops::FlashAttentionParams p = params_of(c);
  engine::generator() = engine::Generator{p.seed, p.offset};
  Tensor out = ops::attention(q, k, v, in.mask, o);
  std::vector<Tensor> g = graph::grad({out}, {q, k, v}, {in.dout});
  return {out.to_double(), {}, g[0].to_double(), g[1].to_double(), g[2].to_double()};
}

double max_err(const std::vector<double>& x, const std::vector<double>& ref) {
  EXPECT_EQ(x.size(), ref.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < ref.size(); i++) {
    if (std::isnan(x[i])) return std::numeric_limits<double>::infinity();
    m = std::max(m, std::fabs(x[i] - ref[i]));
  }
  return m;
}

double floor_for(DType t) { return t == DType::f64 ? 1e-12 : t == DType::f32 ? 1e-5 : 1e-3; }

// The accuracy rule on every output, and lse (no naive counterpart) within a fixed tolerance.
void expect_accurate(const std::string& what, DType t, const Result& cuda, const Result& naive, const char* naive_where,
                     const Result& ref) {
  const char* names[] = {"out", "dq", "dk", "dv"};
  const std::vector<double>* got[] = {&cuda.out, &cuda.dq, &cuda.dk, &cuda.dv};
  const std::vector<double>* base[] = {&naive.out, &naive.dq, &naive.dk, &naive.dv};
  const std::vector<double>* want[] = {&ref.out, &ref.dq, &ref.dk, &ref.dv};
  for (int n = 0; n < 4; n++) {
    const double e_cuda = max_err(*got[n], *want[n]), e_naive = max_err(*base[n], *want[n]);
    const double bound = 2 * e_naive + floor_for(t);
    EXPECT_LE(e_cuda, bound) << what << ": " << names[n] << " max error vs the f64 reference " << e_cuda
                             << " > 2 x naive's (" << naive_where << ", " << e_naive << ") + " << floor_for(t);
  }
  ASSERT_EQ(cuda.lse.size(), ref.lse.size());
  double e_lse = 0;
  for (size_t i = 0; i < ref.lse.size(); i++) {
    if (std::isinf(ref.lse[i])) {
      EXPECT_TRUE(std::isinf(cuda.lse[i]) && cuda.lse[i] > 0) << what << ": lse[" << i << "] = " << cuda.lse[i]
                                                               << ", expected +inf (a row that sees no key)";
      continue;
    }
    e_lse = std::max(e_lse, std::isnan(cuda.lse[i]) ? INFINITY : std::fabs(cuda.lse[i] - ref.lse[i]));
  }
  const double lse_tol = t == DType::f64 ? 1e-10 : 1e-4;
  EXPECT_LE(e_lse, lse_tol) << what << ": lse max error vs the f64 reference";
}

// One case in one dtype: cuda flash vs the f64 reference, vs naive in the same dtype, vs cpu flash.
void check_case(const Case& c, DType t, uint64_t seed) {
  const std::string what = describe(c, t);
  SCOPED_TRACE(what);
  const DqSumsOn sums(c.dq_sums);
  engine::manual_seed(seed);
  Inputs cpu{make_input(c, c.Lq, c.D, t), make_input(c, c.Lk, c.D, t), make_input(c, c.Lk, c.Dv, t),
             ops::to(ops::randn({c.B, c.H, c.Lq, c.Dv}), t), padding_mask(c, nullptr)};
  Inputs dev{on_device(c, cpu.q), on_device(c, cpu.k), on_device(c, cpu.v), ops::to_device(cpu.dout, gpu()),
             padding_mask(c, gpu())};
  Inputs f64{ops::to(cpu.q, DType::f64), ops::to(cpu.k, DType::f64), ops::to(cpu.v, DType::f64),
             ops::to(cpu.dout, DType::f64), cpu.mask};

  const Result ref = run_flash(c, f64);
  const Result cuda = run_flash(c, dev);
  const Result naive = run_naive(c, dev);  // every op of naive attention has a cuda kernel: an error fails
  expect_accurate(what, t, cuda, naive, "naive on cuda", ref);

  // The cpu's flash kernel in the same dtype: the same function, so the same dropout mask and masks.
  const double same_dtype_tol = t == DType::f64 ? 1e-12 : t == DType::f32 ? 2e-5 : 0.0;
  if (same_dtype_tol > 0) {  // (bf16/f16: the GPU rounds P and dS to bf16 for the tensor cores, the cpu does not)
    const Result cpu_flash = run_flash(c, cpu);
    EXPECT_LE(max_err(cuda.out, cpu_flash.out), same_dtype_tol) << what << ": out, cuda vs cpu flash";
    EXPECT_LE(max_err(cuda.dq, cpu_flash.dq), same_dtype_tol) << what << ": dq, cuda vs cpu flash";
    EXPECT_LE(max_err(cuda.dk, cpu_flash.dk), same_dtype_tol) << what << ": dk, cuda vs cpu flash";
    EXPECT_LE(max_err(cuda.dv, cpu_flash.dv), same_dtype_tol) << what << ": dv, cuda vs cpu flash";
  }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"odd sizes", 2, 3, 77, 131, 64, 64},
      {"causal Lq < Lk", 2, 3, 77, 131, 64, 64, true},
      {"causal Lq > Lk (first rows see no key)", 2, 2, 131, 77, 64, 64, true},
      {"key padding (batch 1 fully padded)", 4, 2, 77, 131, 64, 64, false, true},
      {"dropout", 2, 2, 77, 131, 64, 64, false, false, 0.2},
      {"dropout + causal + padding", 3, 2, 77, 131, 64, 64, true, true, 0.3},
      // Lk a multiple of 8 (and the offset's 4096): the tensor-core kernels share each Philox block in a warp.
      {"dropout, shared draws", 2, 2, 77, 136, 64, 64, false, false, 0.2},
      {"dropout, Lk a multiple of 4 only (drawn per element)", 2, 2, 77, 132, 64, 64, false, false, 0.2},
      {"dropout + causal + padding, shared draws", 4, 2, 130, 128, 64, 64, true, true, 0.3},
      {"head dim 128, dropout, shared draws", 2, 1, 70, 200, 128, 128, false, false, 0.1},
      {"head dim 128, causal", 2, 2, 130, 200, 128, 128, true},
      {"head dim 128, dropout + padding", 3, 1, 70, 150, 128, 128, false, true, 0.1},
      {"several full tiles, causal", 1, 2, 512, 512, 64, 64, true},
      // dS is kept (ops/attention.h) in the cases above; past 8 D keys the dQ pass recomputes it.
      {"keys past 8 D (dQ recomputed), dropout + padding", 1, 2, 64, 600, 64, 64, false, true, 0.2},
      {"keys past 8 D (dQ recomputed), causal", 1, 2, 70, 600, 64, 64, true},
      // No keep bits kept past 8 D either: f32 draws by 16 lanes a query row there (a partial query tile here).
      {"keys past 8 D, dropout + causal, shared draws", 1, 2, 77, 600, 64, 64, true, false, 0.2},
      // Head dim 128 past 8 D: a dQ pass, or dQ's f32 sums added to in key order by the Hopper dK dV pass
      // (ops/attention.h: ENGINE_FLASH_DQ_SUMS=1).
      {"head dim 128, keys past 8 D, dropout + padding", 2, 2, 200, 1100, 128, 128, false, true, 0.1},
      {"head dim 128, keys past 8 D (dQ sums), dropout + padding", 2, 2, 200, 1100, 128, 128, false, true, 0.1, 0,
       true},
      {"head dim 128, keys past 8 D (dQ sums), causal, Lq > Lk", 1, 2, 1200, 1090, 128, 128, true, false, 0, 0, true},
      {"[B, L, H, D] views", 2, 3, 77, 131, 64, 64, true, false, 0, 1},
      {"strided rows (generic path)", 2, 2, 45, 67, 64, 64, false, true, 0, 2},
      {"head dim 40 (generic path)", 2, 2, 45, 67, 40, 40, true},
      {"D != Dv (generic path)", 2, 2, 33, 50, 32, 48, false, false, 0.25},
  };
  return all;
}

}  // namespace

TEST(AttentionCuda, MatchesReferenceBf16) {
  uint64_t seed = 100;
  for (const Case& c : cases()) check_case(c, DType::bf16, seed++);
}

TEST(AttentionCuda, MatchesReferenceF32) {
  uint64_t seed = 200;
  for (const Case& c : cases()) check_case(c, DType::f32, seed++);
}

TEST(AttentionCuda, MatchesReferenceF16AndF64) {
  const std::vector<Case> some = {
      {"f16 causal + dropout", 2, 2, 77, 131, 64, 64, true, false, 0.2},
      {"f16 head dim 128 + padding", 3, 1, 64, 96, 128, 128, false, true},
      {"odd sizes", 2, 2, 37, 45, 16, 16, true, true, 0.3},
  };
  check_case(some[0], DType::f16, 300);
  check_case(some[1], DType::f16, 301);
  check_case(some[2], DType::f64, 302);
}

TEST(AttentionCuda, EveryTileConfigurationIsAccurate) {
  // The benchmark's alternative tile configurations (bf16, no dropout) obey the same rule as the defaults.
  uint64_t seed = 400;
  for (int64_t D : {64, 128}) {
    const int nf = ops::cuda::flash_forward_variants(int(D)), nb = ops::cuda::flash_backward_variants(int(D));
    for (int v = 0; v < std::max(nf, nb); v++) {
      ops::cuda::set_flash_tuning({v < nf ? v : -1, v < nb ? v : -1});
      for (bool causal : {false, true}) {
        Case c{"tile configuration", 2, 2, 77, 131, D, D, causal, true};
        SCOPED_TRACE(engine::str("variant ", v, ": forward ", ops::cuda::flash_forward_variant_name(int(D), v),
                                 ", backward ", ops::cuda::flash_backward_variant_name(int(D), v)));
        check_case(c, DType::bf16, seed++);
      }
    }
  }
  ops::cuda::set_flash_tuning({});
}

// The Hopper forwards (ops/cuda/attention_fwd_wgmma.cu and the warp-specialized attention_fwd_tma.cu, each without and
// with overlapped tiles) on every tensor-core case of the list, dropout by shared and by per-element draws included, in
// bf16 and f16: where the build and the device have wgmma, the forward's variants named "wgmma ...".
TEST(AttentionCuda, WgmmaForwardMatchesReference) {
  std::vector<int> wgmma;
  for (int v = 0; v < ops::cuda::flash_forward_variants(64); v++)
    if (ops::cuda::flash_forward_variant_name(64, v).rfind("wgmma", 0) == 0) wgmma.push_back(v);
  if (wgmma.empty()) GTEST_SKIP() << "no wgmma forward here (a build for sm_90a on a compute capability 9.0 device)";
  EXPECT_EQ(wgmma.size(), 4u) << "four wgmma forward configurations (two copying by every thread, two by TMA)";
  uint64_t seed = 500;
  for (int variant : wgmma) {
    SCOPED_TRACE(ops::cuda::flash_forward_variant_name(64, variant));
    ops::cuda::set_flash_tuning({variant, -1});
    for (const Case& c : cases()) {
      if (c.layout == 2 || c.D != c.Dv || (c.D != 64 && c.D != 128)) continue;  // the generic path's cases
      for (DType t : {DType::bf16, DType::f16}) check_case(c, t, seed++);
    }
  }
  ops::cuda::set_flash_tuning({});
}

// The Hopper backward (ops/cuda/attention_bwd_wgmma.cu, one and two warpgroups per block) on every tensor-core case of
// the list (dS kept and dQ recomputed, masks, both ways of drawing dropout) in bf16 and f16: where the build and the
// device have wgmma, the backward's last two variants of each head dim (named "wgmma ...").
TEST(AttentionCuda, WgmmaBackwardMatchesReference) {
  std::vector<std::pair<int, int>> wgmma;  // (head dim, variant)
  for (int d : {64, 128})
    for (int v = 0; v < ops::cuda::flash_backward_variants(d); v++)
      if (ops::cuda::flash_backward_variant_name(d, v).rfind("wgmma", 0) == 0) wgmma.push_back({d, v});
  if (wgmma.empty()) GTEST_SKIP() << "no wgmma backward here (a build for sm_90a on a compute capability 9.0 device)";
  EXPECT_EQ(wgmma.size(), 4u) << "two wgmma configurations per head dim";
  uint64_t seed = 600;
  for (auto [d, variant] : wgmma) {
    SCOPED_TRACE(engine::str("head dim ", d, ": ", ops::cuda::flash_backward_variant_name(d, variant)));
    ops::cuda::set_flash_tuning({-1, variant});
    for (const Case& c : cases()) {
      if (c.layout == 2 || c.D != d || c.Dv != d) continue;  // the generic path's cases, the other head dim's
      for (DType t : {DType::bf16, DType::f16}) check_case(c, t, seed++);
    }
  }
  ops::cuda::set_flash_tuning({});
}

// The forward's dropout keep bits (ops/attention.h) on the GPU: every forward configuration writes the draw's bits of
// every visible pair (the cpu's, which tests/ops/attention_test.cpp checks against the draw's definition), the generic
// path included, and a backward given them (the Hopper kernels read them) gives the bits of one that draws again.
TEST(AttentionCuda, KeepBitsAreTheDrawAndChangeNoGradient) {
  const std::vector<Case> keep_cases = {
      {"dropout, shared draws", 2, 2, 77, 136, 64, 64, false, false, 0.2},
      {"dropout + causal + padding, shared draws", 4, 2, 130, 128, 64, 64, true, true, 0.3},
      {"head dim 128, dropout + padding", 3, 1, 70, 200, 128, 128, false, true, 0.1},
      {"strided rows (generic path), dropout", 2, 2, 45, 72, 64, 64, false, true, 0.2, 2},
  };
  uint64_t seed = 900;
  for (const Case& c : keep_cases) {
    const DType t = DType::bf16;
    SCOPED_TRACE(describe(c, t));
    engine::manual_seed(seed++);
    Inputs cpu{make_input(c, c.Lq, c.D, t), make_input(c, c.Lk, c.D, t), make_input(c, c.Lk, c.Dv, t),
               ops::to(ops::randn({c.B, c.H, c.Lq, c.Dv}), t), padding_mask(c, nullptr)};
    Inputs dev{on_device(c, cpu.q), on_device(c, cpu.k), on_device(c, cpu.v), ops::to_device(cpu.dout, gpu()),
               padding_mask(c, gpu())};
    const ops::FlashAttentionParams p = params_of(c);
    const Tensor want = ops::flash_attention_forward(cpu.q, cpu.k, cpu.v, cpu.mask, p)[2];
    ASSERT_TRUE(want.defined()) << "the case keeps its keep bits";
    const std::vector<double> want_bytes = want.to_double(), pad = cpu.mask.defined() ? cpu.mask.to_double()
                                                                                        : std::vector<double>();
    const int64_t W = want.size(3);
    const int variants = c.layout == 2 ? 1 : ops::cuda::flash_forward_variants(int(c.D));
    for (int variant = 0; variant < variants; variant++) {
      SCOPED_TRACE(c.layout == 2 ? std::string("generic") : ops::cuda::flash_forward_variant_name(int(c.D), variant));
      ops::cuda::set_flash_tuning({variant, -1});
      const std::vector<Tensor> f = ops::flash_attention_forward(dev.q, dev.k, dev.v, dev.mask, p);
      ASSERT_TRUE(f[2].defined());
      const std::vector<double> got = f[2].to_double();
      int64_t wrong = 0;
      for (int64_t b = 0; b < c.B; b++)
        for (int64_t row = b * c.H * c.Lq; row < (b + 1) * c.H * c.Lq; row++)
          for (int64_t j = 0; j < c.Lk; j++) {
            const int64_t i = row % c.Lq;
            if ((c.causal && j > i + c.Lk - c.Lq) || (!pad.empty() && pad[size_t(b * c.Lk + j)] != 0)) continue;
            const size_t byte = size_t(row * W + j / 8);
            wrong += ((uint32_t(got[byte]) ^ uint32_t(want_bytes[byte])) >> (j % 8)) & 1u;
          }
      EXPECT_EQ(wrong, 0) << "keep bits of visible pairs that differ from the cpu's";
    }
    ops::cuda::set_flash_tuning({});
    // The backward with the keep bits and without them (drawn again), with each backward configuration.
    const std::vector<Tensor> f = ops::flash_attention_forward(dev.q, dev.k, dev.v, dev.mask, p);
    const int backward_variants = c.layout == 2 ? 1 : ops::cuda::flash_backward_variants(int(c.D));
    for (int variant = 0; variant < backward_variants; variant++) {
      SCOPED_TRACE(c.layout == 2 ? std::string("generic")
                                 : ops::cuda::flash_backward_variant_name(int(c.D), variant));
      ops::cuda::set_flash_tuning({-1, variant});
      auto grads = [&](const Tensor& keep) {
        std::vector<Tensor> g = ops::flash_attention_backward(dev.dout, Tensor(), dev.q, dev.k, dev.v, f[0], f[1],
                                                              dev.mask, p, keep);
        return std::vector<std::vector<double>>{g[0].to_double(), g[1].to_double(), g[2].to_double()};
      };
      for (const char* keep_ds : {"1", "0"}) {  // dS kept, and dQ recomputing it (which then reads them too)
        SCOPED_TRACE(engine::str("ENGINE_FLASH_KEEP_DS=", keep_ds));
        setenv("ENGINE_FLASH_KEEP_DS", keep_ds, 1);
        const auto with = grads(f[2]), without = grads(Tensor());
        EXPECT_EQ(with[0], without[0]) << "dq";
        EXPECT_EQ(with[1], without[1]) << "dk";
        EXPECT_EQ(with[2], without[2]) << "dv";
      }
      unsetenv("ENGINE_FLASH_KEEP_DS");
    }
    ops::cuda::set_flash_tuning({});
  }
}

TEST(AttentionCuda, BackwardIsDeterministicAndUsesDlse) {
  // Two runs give the same bits (no atomics), and a gradient on lse enters through delta as on the cpu.
  const Case cases_of[] = {{"determinism", 2, 3, 200, 300, 64, 64, true, true, 0.1},
                           {"determinism, dQ sums", 2, 2, 150, 1100, 128, 128, true, true, 0.1, 0, true}};
  for (const Case& c : cases_of)
    for (DType t : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(describe(c, t));
      const DqSumsOn sums(c.dq_sums);
      engine::manual_seed(7);
      Tensor q = ops::to(ops::randn({c.B, c.H, c.Lq, c.D}), t), k = ops::to(ops::randn({c.B, c.H, c.Lk, c.D}), t);
      Tensor v = ops::to(ops::randn({c.B, c.H, c.Lk, c.Dv}), t), dout = ops::to(ops::randn({c.B, c.H, c.Lq, c.Dv}), t);
      Tensor dlse = ops::randn({c.B, c.H, c.Lq});
      Tensor mask = padding_mask(c, nullptr);
      ops::FlashAttentionParams p = params_of(c);
      auto run = [&](std::shared_ptr<engine::Device> dev) {
        auto mv = [&](const Tensor& x) { return dev ? ops::to_device(x, dev) : x; };
        Tensor qd = mv(q), kd = mv(k), vd = mv(v), m = mask.defined() ? mv(mask) : Tensor();
        std::vector<Tensor> f = ops::flash_attention_forward(qd, kd, vd, m, p);
        std::vector<Tensor> g = ops::flash_attention_backward(mv(dout), mv(dlse), qd, kd, vd, f[0], f[1], m, p);
        return std::vector<std::vector<double>>{g[0].to_double(), g[1].to_double(), g[2].to_double()};
      };
      auto first = run(gpu()), second = run(gpu()), cpu = run(nullptr);
      const char* names[] = {"dq", "dk", "dv"};
      const double tol = t == DType::f32 ? 2e-5 : 0.05;  // bf16: one rounding of dS to bf16 apart
      for (int n = 0; n < 3; n++) {
        EXPECT_EQ(first[n], second[n]) << names[n] << " differs between two identical runs";
        EXPECT_LE(max_err(first[n], cpu[n]), tol) << names[n] << " with dlse: cuda vs cpu flash";
      }
    }
}

TEST(AttentionCuda, PaddedKeyTilesAreSkippedWithoutChangingABit) {
  // Key tiles past the last unpadded key are skipped (attention_common.cuh's key_tiles): attention with the keys
  // past `valid` padded must give the bits of attention over the first `valid` keys alone, and zero dK, dV for the
  // padded keys. Both head dims, bf16 and f16, with dS kept (short keys) and recomputed (long keys on both sides).
  struct Shape3 {
    int64_t D, Lk, valid;
  };
  for (const Shape3& sh : {Shape3{64, 300, 100}, Shape3{64, 600, 450}, Shape3{128, 300, 100}, Shape3{128, 1200, 900}})
    for (DType t : {DType::bf16, DType::f16}) {
      const int64_t B = 1, H = 2, Lq = 150, D = sh.D, Lk = sh.Lk, valid = sh.valid;
      SCOPED_TRACE(engine::str(engine::dtype_name(t), " D ", D, " Lk ", Lk, ", keys past ", valid, " padded"));
      engine::manual_seed(uint64_t(D + Lk));
      auto input = [&](int64_t L) { return ops::to_device(ops::to(ops::randn({B, H, L, D}), t), gpu()); };
      Tensor q = input(Lq), k = input(Lk), v = input(Lk), dout = input(Lq);
      std::vector<double> m(size_t(Lk), 0.0);
      for (int64_t j = valid; j < Lk; j++) m[size_t(j)] = 1;
      Tensor mask =
          ops::to_device(ops::compare(ops::CompareOp::gt, ops::from_vector(m, {B, Lk}, DType::f32), 0.5), gpu());
      Tensor k_valid = ops::contiguous(ops::slice(k, 2, 0, valid)),
             v_valid = ops::contiguous(ops::slice(v, 2, 0, valid));
      auto run = [&](const Tensor& kk, const Tensor& vv, const Tensor& pad) {
        std::vector<Tensor> f = ops::flash_attention_forward(q, kk, vv, pad, {});
        std::vector<Tensor> g = ops::flash_attention_backward(dout, Tensor(), q, kk, vv, f[0], f[1], pad, {});
        return std::vector<Tensor>{f[0], f[1], g[0], g[1], g[2]};
      };
      std::vector<Tensor> padded = run(k, v, mask), alone = run(k_valid, v_valid, Tensor());
      EXPECT_EQ(padded[0].to_double(), alone[0].to_double()) << "out";
      EXPECT_EQ(padded[1].to_double(), alone[1].to_double()) << "lse";
      EXPECT_EQ(padded[2].to_double(), alone[2].to_double()) << "dq";
      for (int x : {3, 4}) {
        const char* name = x == 3 ? "dk" : "dv";
        EXPECT_EQ(ops::slice(padded[size_t(x)], 2, 0, valid).to_double(), alone[size_t(x)].to_double()) << name;
        const std::vector<double> rest = ops::slice(padded[size_t(x)], 2, valid, Lk).to_double();
        EXPECT_EQ(std::count(rest.begin(), rest.end(), 0.0), int64_t(rest.size())) << name << " of padded keys";
      }
    }
}

TEST(AttentionCuda, GradientsThroughAutograd) {
  // attention(flash) recorded on the tape and differentiated by graph::grad, on cuda and on cpu.
  Case c{"autograd", 2, 2, 40, 70, 64, 64, true};
  engine::manual_seed(8);
  Tensor q = ops::to(ops::randn({c.B, c.H, c.Lq, c.D}), DType::f32), k = ops::randn({c.B, c.H, c.Lk, c.D});
  Tensor v = ops::randn({c.B, c.H, c.Lk, c.Dv}), dout = ops::randn({c.B, c.H, c.Lq, c.Dv});
  auto run = [&](std::shared_ptr<engine::Device> dev) {
    auto mv = [&](const Tensor& x) { return (dev ? ops::to_device(x, dev) : x.detach()).set_requires_grad(true); };
    Tensor qd = mv(q), kd = mv(k), vd = mv(v);
    ops::AttentionOptions o;
    o.algo = ops::AttentionAlgo::flash;
    o.causal = true;
    Tensor out = ops::attention(qd, kd, vd, Tensor(), o);
    std::vector<Tensor> g = graph::grad({out}, {qd, kd, vd}, {dev ? ops::to_device(dout, dev) : dout});
    return std::vector<std::vector<double>>{out.to_double(), g[0].to_double(), g[1].to_double(), g[2].to_double()};
  };
  std::vector<std::vector<double>> cuda = run(gpu());  // every op it needs has a cuda kernel: an error fails
  auto cpu = run(nullptr);
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (int n = 0; n < 4; n++) EXPECT_LE(max_err(cuda[n], cpu[n]), 2e-5) << names[n] << ": cuda vs cpu through autograd";
}

TEST(AttentionCuda, AllocatesLikeMeta) {
  // Short keys at head dim 64 (dS kept) and long keys at 128 (dQ's sums, ENGINE_FLASH_DQ_SUMS=1).
  for (auto [Lq, Lk, D] : {std::array<int64_t, 3>{33, 47, 64}, std::array<int64_t, 3>{40, 1100, 128}}) {
    const DqSumsOn sums(D == 128);
    auto meta = engine::Device::create(engine::DeviceType::meta, size_t(1) << 30);
    auto cuda = engine::Device::create(engine::DeviceType::cuda, size_t(1) << 30);
    engine::manual_seed(9);
    Tensor q = ops::to(ops::randn({2, 2, Lq, D}), DType::bf16), k = ops::to(ops::randn({2, 2, Lk, D}), DType::bf16);
    Tensor v = ops::to(ops::randn({2, 2, Lk, D}), DType::bf16), dout = ops::to(ops::randn({2, 2, Lq, D}), DType::bf16);
    Tensor mask = padding_mask({"ledger", 2, 2, Lq, Lk, D, D, false, true}, nullptr);
    for (auto dev : {meta, cuda}) {
      engine::DeviceGuard guard(dev);
      ops::FlashAttentionParams p;
      p.causal = true;
      Tensor qd = ops::to_device(q, dev), kd = ops::to_device(k, dev), vd = ops::to_device(v, dev);
      Tensor md = ops::to_device(mask, dev);
      std::vector<Tensor> f = ops::flash_attention_forward(qd, kd, vd, md, p);
      std::vector<Tensor> g =
          ops::flash_attention_backward(ops::to_device(dout, dev), Tensor(), qd, kd, vd, f[0], f[1], md, p);
    }
    EXPECT_EQ(cuda->ledger().events_csv(), meta->ledger().events_csv()) << "Lk " << Lk << ", head dim " << D;
  }
}

TEST(AttentionCuda, PackedIsTheUnpackedOpOnItsViews) {
  // attention_packed on the GPU runs the same kernels as attention on the head views of qkv's three parts (the same
  // strides), so the output and qkv's gradient must be the same bits; the views' gradients reach qkv through slice
  // backward and sums of zeros, the packed op's directly. f32 also against the cpu's packed op.
  const int64_t B = 3, L = 77, H = 2, D = 64;
  Case c{"packed", B, H, L, L, D, D, false, true};
  for (DType t : {DType::bf16, DType::f32}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(engine::str(engine::dtype_name(t), causal ? " causal" : ""));
      engine::manual_seed(31);
      Tensor qkv = ops::to(ops::randn({B, L, 3 * H * D}), t), g = ops::to(ops::randn({B, H, L, D}), t);
      ops::AttentionOptions o;
      o.algo = ops::AttentionAlgo::flash;
      o.causal = causal;
      o.dropout_p = 0.2;
      auto run = [&](std::shared_ptr<engine::Device> dev, bool packed) {
        Tensor x = ops::to_device(qkv, dev).set_requires_grad(true), mask = padding_mask(c, dev);
        engine::generator() = engine::Generator{77, 4096};
        Tensor out;
        if (packed) {
          out = ops::attention_packed(x, H, mask, o);
        } else {
          auto part = [&](int i) {
            return ops::permute(ops::reshape(ops::slice(x, 2, i * H * D, (i + 1) * H * D), {B, L, H, D}), {0, 2, 1, 3});
          };
          out = ops::attention(part(0), part(1), part(2), mask, o);
        }
        Tensor dx = graph::grad({out}, {x}, {ops::to_device(g, dev)})[0];
        return std::vector<std::vector<double>>{out.to_double(), dx.to_double()};
      };
      auto packed = run(gpu(), true), views = run(gpu(), false);
      EXPECT_EQ(packed[0], views[0]) << "out";
      EXPECT_EQ(packed[1], views[1]) << "d qkv";
      if (t == DType::f32) {
        auto cpu = run(engine::default_device(), true);
        EXPECT_LE(max_err(packed[0], cpu[0]), 2e-5) << "out, cuda vs cpu";
        EXPECT_LE(max_err(packed[1], cpu[1]), 2e-5) << "d qkv, cuda vs cpu";
      }
    }
  }
}

TEST(AttentionCuda, PackedAllocatesLikeMeta) {
  auto meta = engine::Device::create(engine::DeviceType::meta, size_t(1) << 30);
  auto cuda = engine::Device::create(engine::DeviceType::cuda, size_t(1) << 30);
  engine::manual_seed(9);
  Tensor qkv = ops::to(ops::randn({2, 47, 3 * 128}), DType::bf16);
  Tensor mask = padding_mask({"ledger", 2, 2, 47, 47, 64, 64, false, true}, nullptr);
  for (auto dev : {meta, cuda}) {
    engine::DeviceGuard guard(dev);
    engine::generator() = engine::Generator{5, 0};
    ops::AttentionOptions o;
    o.algo = ops::AttentionAlgo::flash;
    o.dropout_p = 0.1;
    Tensor x = ops::to_device(qkv, dev).set_requires_grad(true);
    graph::backward(ops::sum(ops::attention_packed(x, 2, ops::to_device(mask, dev), o)));
  }
  EXPECT_EQ(cuda->ledger().events_csv(), meta->ledger().events_csv());
}

// ---------------------------------------------------------------------------------------------------
// Benchmark: TFLOP/s of the forward and the backward, bf16, each tile configuration the kernels have.

namespace {

// Median time in ms of `fn` over `reps` timings after `warmup` runs, each timing an event pair on the engine's
// stream around `calls` back-to-back calls (calls > 1 hides the op's host-side work behind the kernels).
template <typename F>
double median_ms(F&& fn, int calls = 1, int warmup = 3, int reps = 20) {
  cudaStream_t s = engine::cuda::stream();
  cudaEvent_t start, stop;
  ENGINE_CUDA_CHECK(cudaEventCreate(&start));
  ENGINE_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; i++) fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; i++) {
    ENGINE_CUDA_CHECK(cudaEventRecord(start, s));
    for (int c = 0; c < calls; c++) fn();
    ENGINE_CUDA_CHECK(cudaEventRecord(stop, s));
    ENGINE_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    ENGINE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t / calls);
  }
  ENGINE_CUDA_CHECK(cudaEventDestroy(start));
  ENGINE_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// One line per pass and tile configuration: the median of 20 single calls (the brief's figure) and of 20
// timings of 10 back-to-back calls.
void bench_shape(int64_t B, int64_t H, int64_t L, int64_t D) {
  auto dev = gpu();
  engine::manual_seed(10);
  auto input = [&] { return ops::to_device(ops::to(ops::randn({B, H, L, D}), DType::bf16), dev); };
  Tensor q = input(), k = input(), v = input(), dout = input();
  const std::string shape = engine::str(B, "x", H, "x", L, "x", D);
  std::printf("flash attention, bf16; forward 4*B*H*L^2*D FLOPs, backward 2.5x that, halved causal; median of 20\n");
  std::printf("%-14s %-6s %-45s %8s %8s %8s\n", "B x H x L x D", "causal", "pass, configuration", "ms", "TFLOP/s",
              "10 calls");
  // Padded: batch row b keeps its first L (b + 1) / B keys (lengths spread evenly, as in a batch of GLUE pairs), with
  // BERT's dropout; its TFLOP/s count the padded keys too (the op's count), so they show the skipped tiles' gain.
  std::vector<double> pad(size_t(B * L), 0.0);
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = L * (b + 1) / B; j < L; j++) pad[size_t(b * L + j)] = 1;
  const Tensor padding =
      ops::to_device(ops::compare(ops::CompareOp::gt, ops::from_vector(pad, {B, L}, DType::f32), 0.5), dev);
  for (int run = 0; run < 4; run++) {  // plain, causal, with BERT's attention dropout (0.1), and padded
    const bool causal = run == 1;
    const Tensor mask = run == 3 ? padding : Tensor();
    ops::FlashAttentionParams p;
    p.causal = causal;
    if (run >= 2) p.dropout_p = 0.1, p.seed = 42, p.offset = 0;
    const double fwd_flops = 4.0 * double(B * H) * double(L) * double(L) * double(D) * (causal ? 0.5 : 1.0);
    std::vector<Tensor> f = ops::flash_attention_forward(q, k, v, mask, p);
    auto report = [&](const char* pass, const std::string& config, double flops, const std::function<void()>& fn) {
      const double ms = median_ms(fn), ms10 = median_ms(fn, 10);
      std::printf("%-14s %-6s %s %-41s %8.3f %8.1f %8.1f\n", shape.c_str(),
                  run == 3          ? "padded"
                  : p.dropout_p > 0 ? "drop"
                  : causal          ? "yes"
                                    : "no",
                  pass, config.c_str(), ms, flops / ms / 1e9, flops / ms10 / 1e9);
    };
    if (p.dropout_p > 0) {  // the alternative configurations are built without dropout: the defaults only
      ops::cuda::set_flash_tuning({});
      report("fwd", "default", fwd_flops, [&] { ops::flash_attention_forward(q, k, v, mask, p); });
      report("bwd", "default, dropout drawn again", 2.5 * fwd_flops,
             [&] { ops::flash_attention_backward(dout, Tensor(), q, k, v, f[0], f[1], mask, p); });
      if (f[2].defined()) {  // the forward kept its keep bits (short keys: ops/attention.h), as a model's step does
        report("bwd", "default, the forward's keep bits", 2.5 * fwd_flops,
               [&] { ops::flash_attention_backward(dout, Tensor(), q, k, v, f[0], f[1], mask, p, f[2]); });
        setenv("ENGINE_FLASH_KEEP_DS", "0", 1);
        report("bwd", "keep bits, dS recomputed", 2.5 * fwd_flops,
               [&] { ops::flash_attention_backward(dout, Tensor(), q, k, v, f[0], f[1], mask, p, f[2]); });
        unsetenv("ENGINE_FLASH_KEEP_DS");
      }
      continue;
    }
    for (int variant = 0; variant < ops::cuda::flash_forward_variants(int(D)); variant++) {
      ops::cuda::set_flash_tuning({variant, -1});
      report("fwd", ops::cuda::flash_forward_variant_name(int(D), variant), fwd_flops,
             [&] { ops::flash_attention_forward(q, k, v, Tensor(), p); });
    }
    for (int variant = 0; variant < ops::cuda::flash_backward_variants(int(D)); variant++) {
      ops::cuda::set_flash_tuning({-1, variant});
      report("bwd", ops::cuda::flash_backward_variant_name(int(D), variant), 2.5 * fwd_flops,
             [&] { ops::flash_attention_backward(dout, Tensor(), q, k, v, f[0], f[1], Tensor(), p); });
    }
    ops::cuda::set_flash_tuning({});
    // The default backward with dQ recomputed where it would keep dS (short keys: ops/attention.h), and (head dim 128)
    // with dQ's sums instead of a dQ pass.
    setenv("ENGINE_FLASH_KEEP_DS", "0", 1);
    report("bwd", "default, dS recomputed", 2.5 * fwd_flops,
           [&] { ops::flash_attention_backward(dout, Tensor(), q, k, v, f[0], f[1], Tensor(), p); });
    unsetenv("ENGINE_FLASH_KEEP_DS");
    if (D == 128) {
      const DqSumsOn sums(true);
      report("bwd", "default, dQ sums (ENGINE_FLASH_DQ_SUMS=1)", 2.5 * fwd_flops,
             [&] { ops::flash_attention_backward(dout, Tensor(), q, k, v, f[0], f[1], Tensor(), p); });
    }
    std::fflush(stdout);
  }
}

}  // namespace

TEST(AttentionCudaBench, DISABLED_HeadDim64Seq512) { bench_shape(32, 12, 512, 64); }
TEST(AttentionCudaBench, DISABLED_HeadDim128Seq4096) { bench_shape(8, 16, 4096, 128); }
