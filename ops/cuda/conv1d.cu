// cuda/conv1d.cu: the 1-D convolution over [B, T, C] and GLU on the GPU.
//
// Forward and input gradient follow fairseq's ConvTBC: K GEMMs over shifted views, each accumulating into
// the output (cuBLASLt with beta = 1, matmul_accumulate): tap k adds rows [t0 + k - pad_left, t1 + k - pad_left)
// of every sentence of x, times w[k], into rows [t0, t1) of y. No im2col buffer exists. Where the convolution keeps
// the length (To == T), a tap is one GEMM over the sentences' rows laid end to end (the first with beta = 0 and the
// bias in its epilogue), and the few rows at each sentence's edges that this pairs with a neighbouring sentence are
// then set to the bias rows and recomputed, a GEMM per edge row over that row of every sentence (accumulate_taps);
// other shapes set the output to the bias rows (or zeros) by one memory-bound pass, then batch a GEMM per tap over
// the B sentences (M = a sentence's rows).
// The weight gradient reduces over (sentence, time) pairs. The unshifted tap pairs every row of g with the
// same row of x: one cuBLASLt GEMM over the flattened rows. A shifted tap (x row t + s with g row t) skips
// padding at each sentence's edges, which a batch-first layout cannot flatten into one GEMM dimension
// (ConvTBC's time-major layout can). Where the convolution keeps the length (To == T: convs2s's encoder (1, 1)
// and causal decoder (K - 1, 0)), the flattened rows still pair row r of g with row r + s of x everywhere, and
// the only wrong pairs are the |s| rows at each boundary between two sentences, a row every T rows of each tensor:
// dw[k] = (flat GEMM over B T - |s| rows) - (|s| GEMMs over those B - 1 boundary rows), on cuBLASLt's tensor
// cores, the corrections first (alpha = -1) so that the large sum is rounded once, into dw itself: no workspace,
// no copy. Other paddings (To != T) run this file's own tiled kernel on CUDA cores, which maps each reduction row
// to (b, t) itself. Both are deterministic (cuBLASLt's chosen kernel, or a fixed order).
// GLU: one pass forward (reads x, writes y), one pass backward (reads g and x, writes dx).
#include <algorithm>
#include <vector>

#include "engine/cuda/runtime.h"
#include "ops/conv1d.h"
#include "ops/cuda/conv1d.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/matmul.h"
#include "ops/elementwise_math.h"

namespace ops::cuda {

using engine::Tensor;

namespace {

// ---------------------------------------------------------------------------------------------------
// Kernels

// y[b, t, c] = bias[c] (or 0) for the rows t in [t0, t0 + count) of every sentence b of y [B, T, C] (all of them:
// t0 = 0, count = T). Grid-stride, one element per thread per step: it moves B * count * C * sizeof(T) bytes (plus
// the bias row from cache) and is bound by write bandwidth.
template <typename T>
__global__ void fill_bias_rows_kernel(T* y, const T* bias, int64_t B, int64_t T_, int64_t t0, int64_t count,
                                      int64_t C) {
  const int64_t n = B * count * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / C, b = row / count, t = t0 + row % count;
    y[(b * T_ + t) * C + i % C] = bias ? bias[i % C] : from_acc<T>(acc_t<T>(0));
  }
}

// dw[k, i, o] = sum over r = (b, t), t in tap k's rows [t0, t1), of x[b, t + k - pad_left, i] * g[b, t, o].
// Tiling: a block of 256 threads owns a 64 (Cin) x 64 (Cout) tile of tap k (grid: Cout tiles, Cin tiles, taps). It
// walks the reduction 16 rows at a time: both operand tiles [16][64] are staged in shared memory
// with coalesced loads (each row is contiguous in channels), then each thread accumulates a 4 x 4 block of
// outputs in registers (acc_t: f32, f64 for f64). FLOP-bound on CUDA cores (no tensor cores): 2 * 4 * 4
// FLOPs per 8 shared-memory reads; every output is written once, so it is deterministic.
constexpr int kWgTile = 64, kWgRows = 16, kWgThreads = 256;

// The taps one launch computes (blockIdx.z picks one): the shifted taps of a convolution together, so that
// their tiles fill the GPU at once (a 512 x 1024 tap alone is 128 blocks for 132 SMs).
constexpr int kMaxTapsPerLaunch = 8;
struct TapList {
  int64_t k[kMaxTapsPerLaunch];
};

template <typename T>
__global__ void conv1d_weight_grad_kernel(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ dw,
                                          int64_t B, int64_t T_in, int64_t Cin, int64_t To, int64_t Cout,
                                          int64_t pad_left, TapList taps) {
  using A = acc_t<T>;
  const int64_t k = taps.k[blockIdx.z];
  __shared__ A xs[kWgRows][kWgTile];  // [rows, Cin tile]
  __shared__ A gs[kWgRows][kWgTile];  // [rows, Cout tile]
  const int64_t i0 = int64_t(blockIdx.y) * kWgTile, o0 = int64_t(blockIdx.x) * kWgTile;
  const int64_t t0 = pad_left - k > 0 ? pad_left - k : 0;                  // conv1d_tap_rows, on the device
  const int64_t t1 = T_in + pad_left - k < To ? T_in + pad_left - k : To;
  const int64_t n = t1 > t0 ? t1 - t0 : 0, R = B * n;                       // reduction rows of this tap
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  A acc[4][4] = {};
  for (int64_t r0 = 0; r0 < R; r0 += kWgRows) {
#pragma unroll
    for (int j = 0; j < kWgRows * kWgTile / kWgThreads; j++) {
      const int e = tid + j * kWgThreads, rr = e / kWgTile, cc = e % kWgTile;
      const int64_t r = r0 + rr;
      A xv = A(0), gv = A(0);
      if (r < R) {
        const int64_t b = r / n, t = t0 + r % n;
        if (i0 + cc < Cin) xv = to_acc<A>(x[(b * T_in + t + k - pad_left) * Cin + i0 + cc]);
        if (o0 + cc < Cout) gv = to_acc<A>(g[(b * To + t) * Cout + o0 + cc]);
      }
      xs[rr][cc] = xv;
      gs[rr][cc] = gv;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kWgRows; rr++) {
      A a[4], bb[4];
#pragma unroll
      for (int q = 0; q < 4; q++) {
        a[q] = xs[rr][ty * 4 + q];
        bb[q] = gs[rr][tx * 4 + q];
      }
#pragma unroll
      for (int p = 0; p < 4; p++)
#pragma unroll
        for (int q = 0; q < 4; q++) acc[p][q] += a[p] * bb[q];
    }
    __syncthreads();
  }
#pragma unroll
  for (int p = 0; p < 4; p++)
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const int64_t i = i0 + ty * 4 + p, o = o0 + tx * 4 + q;
      if (i < Cin && o < Cout) dw[(k * Cin + i) * Cout + o] = from_acc<T>(acc[p][q]);
    }
}

// GLU over x viewed [outer, 2, half] (half = H * inner elements are contiguous): y[o, j] = a * sigmoid(b),
// a = x[o, 0, j], b = x[o, 1, j]. VEC elements per thread step with 16-byte loads when half is a multiple of
// VEC and the pointers are aligned. Reads 2n, writes n elements: bound by memory bandwidth.
template <typename T, int VEC>
__global__ void glu_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t half) {
  using A = acc_t<T>;
  const int64_t chunks = outer * half / VEC;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < chunks; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = c * VEC, o = i / half, j = i - o * half;
    const T* pa = x + o * 2 * half + j;
    A a[VEC], b[VEC], out[VEC];
    load_vec<VEC>(pa, a);
    load_vec<VEC>(pa + half, b);
#pragma unroll
    for (int v = 0; v < VEC; v++) out[v] = a[v] * unary_f<A>(UnaryOp::sigmoid, b[v], A(0), A(0));
    store_vec<VEC>(y + i, out);
  }
}

// dx = [g s | g a s (1 - s)], s = sigmoid(b). Reads g (n) and x (2n), writes dx (2n): memory-bound.
template <typename T, int VEC>
__global__ void glu_backward_kernel(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ dx,
                                    int64_t outer, int64_t half) {
  using A = acc_t<T>;
  const int64_t chunks = outer * half / VEC;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < chunks; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = c * VEC, o = i / half, j = i - o * half, base = o * 2 * half + j;
    A gv[VEC], a[VEC], b[VEC], da[VEC], db[VEC];
    load_vec<VEC>(g + i, gv);
    load_vec<VEC>(x + base, a);
    load_vec<VEC>(x + base + half, b);
#pragma unroll
    for (int v = 0; v < VEC; v++) {
      const A s = unary_f<A>(UnaryOp::sigmoid, b[v], A(0), A(0));
      da[v] = gv[v] * s;
      db[v] = gv[v] * a[v] * s * (A(1) - s);
    }
    store_vec<VEC>(dx + base, da);
    store_vec<VEC>(dx + base + half, db);
  }
}

// ---------------------------------------------------------------------------------------------------
// Launchers

struct Sizes {
  int64_t B, T, Cin, To, Cout, K;
};

// Tap k as the three GEMM operands of "out rows += in rows @ matrix" over the B sentences: the rows of a
// [B, L, C] tensor from `first_row` on, `count` of them, as a [B, count, C] view.
Tensor rows_view(const Tensor& t, int64_t first_row, int64_t count) {
  const int64_t L = t.size(1), C = t.size(2);
  return Tensor::view_of(t, {t.size(0), count, C}, {L * C, C, 1}, t.offset() + first_row * C);
}

// Tap k of w [K, Cin, Cout]: [Cin, Cout], or its transpose [Cout, Cin] (a strided view, no copy).
Tensor tap_matrix(const Tensor& w, int64_t k, bool transposed) {
  const int64_t Cin = w.size(1), Cout = w.size(2), off = w.offset() + k * Cin * Cout;
  return transposed ? Tensor::view_of(w, {Cout, Cin}, {1, Cout}, off) : Tensor::view_of(w, {Cin, Cout}, {Cout, 1}, off);
}

template <typename F>
void launch_glu(const Tensor& like, int64_t outer, int64_t half, bool aligned, F&& launch) {
  ENGINE_CUDA_FLOAT_SWITCH(like.dtype(), T, {
    constexpr int V = vec16<T>();
    if (aligned && half % V == 0) launch(T(), std::integral_constant<int, V>());
    else launch(T(), std::integral_constant<int, 1>());
  });
}

void glu_sizes(const Tensor& x, int64_t dim, int64_t* outer, int64_t* half) {
  *outer = 1;
  for (int64_t d = 0; d < dim; d++) *outer *= x.size(d);
  *half = x.numel() / std::max<int64_t>(1, *outer) / 2;
}

// out rows [t0, t0 + count) of every sentence set to bias (or zeros).
void fill_rows(const Tensor& out, const Tensor& bias, int64_t t0, int64_t count) {
  const int64_t B = out.size(0), T = out.size(1), C = out.size(2);
  if (B * count * C == 0) return;
  ENGINE_CUDA_FLOAT_SWITCH(out.dtype(), E, {
    const int threads = 256;
    fill_bias_rows_kernel<E><<<grid_for(B * count * C, threads), threads, 0, engine::cuda::stream()>>>(
        static_cast<E*>(out.data_ptr()), bias.defined() ? static_cast<const E*>(bias.data_ptr()) : nullptr, B, T, t0,
        count, C);
    ENGINE_CUDA_LAUNCH_CHECK("conv1d bias rows");
  });
}

// One tap of the forward or the input gradient: out rows t in [lo, hi) of every sentence += in rows t + d of the
// same sentence @ m (the forward: in x, out y, m = w[k]; the input gradient: in g, out dx, m = w[k]^T).
struct ShiftedTap {
  int64_t lo, hi, d;
  Tensor m;
};

// Row t of every sentence of a contiguous [B, L, C] tensor: a [1, B, C] view, its rows L C apart.
Tensor sentence_rows(const Tensor& t, int64_t row) {
  const int64_t B = t.size(0), L = t.size(1), C = t.size(2);
  return Tensor::view_of(t, {1, B, C}, {B * L * C, L * C, 1}, t.offset() + row * C);
}

// out = bias (or zeros) + the taps, in tap order, over the B sentences of in [B, Ti, Cin] and out [B, To, Cout]
// (both contiguous). Where in and out have the same rows per sentence (To == Ti, convs2s's paddings), each tap is
// one flat GEMM over the sentences' rows [lo, (B - 1) T + hi) laid end to end (M = about B T rows where a GEMM per
// sentence has M = T, a few dozen words, and wastes most of each tensor-core tile): a row in [lo, hi) of its
// sentence meets its own sentence's row t + d; only the rows outside some tap's [lo, hi), the first max(lo) and the
// last T - min(hi) of each sentence, also meet a neighbouring sentence's rows. The first tap's GEMM writes its rows
// with the bias in its epilogue (beta = 0: no separate fill pass), the others add. The few edge rows are then set
// again and recomputed, one GEMM per edge row and tap over that row of every sentence (M = B, rows T apart: each
// reads the tap's matrix once, where a GEMM per sentence of one row would read it B times), so every row ends as
// bias + its own taps in tap order. Other shapes: a GEMM per tap batched over the B sentences.
void accumulate_taps(const Tensor& in, const Tensor& out, const Tensor& bias, const std::vector<ShiftedTap>& taps) {
  const int64_t B = out.size(0), T = out.size(1);
  int64_t lo_max = 0, hi_min = T;
  for (const ShiftedTap& tap : taps)
    if (tap.hi > tap.lo) lo_max = std::max(lo_max, tap.lo), hi_min = std::min(hi_min, tap.hi);
  if (B == 1 || in.size(1) != T || lo_max >= hi_min) {
    fill_rows(out, bias, 0, T);
    for (const ShiftedTap& tap : taps)
      if (tap.hi > tap.lo)
        matmul_accumulate(rows_view(in, tap.lo + tap.d, tap.hi - tap.lo), tap.m,
                          rows_view(out, tap.lo, tap.hi - tap.lo));
    return;
  }
  // The first tap writes its rows (beta = 0) with the bias added in the GEMM's epilogue, the others add to them.
  // Every row it leaves unwritten (the first sentence's first rows, the last one's last) is an edge row, set below.
  // f64 with a bias fills first instead (the engine uses no cuBLASLt epilogue in f64 elsewhere; tests only).
  bool first = true;
  if (bias.defined() && out.dtype() == engine::DType::f64) {
    fill_rows(out, bias, 0, T);
    first = false;
  }
  for (const ShiftedTap& tap : taps) {
    if (tap.hi <= tap.lo) continue;
    const int64_t R = (B - 1) * T + tap.hi - tap.lo, Cin = in.size(2), Cout = out.size(2);
    // [1, R, C] views: matmul_accumulate takes a batch of one
    matmul_accumulate(Tensor::view_of(in, {1, R, Cin}, {R * Cin, Cin, 1}, in.offset() + (tap.lo + tap.d) * Cin), tap.m,
                      Tensor::view_of(out, {1, R, Cout}, {R * Cout, Cout, 1}, out.offset() + tap.lo * Cout), 1.0,
                      first ? 0.0 : 1.0, first ? bias : Tensor());
    first = false;
  }
  auto redo_edge_rows = [&](int64_t w0, int64_t w1) {
    if (w1 <= w0) return;
    fill_rows(out, bias, w0, w1 - w0);
    for (int64_t t = w0; t < w1; t++)
      for (const ShiftedTap& tap : taps)
        if (t >= tap.lo && t < tap.hi) matmul_accumulate(sentence_rows(in, t + tap.d), tap.m, sentence_rows(out, t));
  };
  redo_edge_rows(0, lo_max);
  redo_edge_rows(hi_min, T);
}

}  // namespace

void conv1d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t pad_left, const Tensor& y) {
  const Sizes s{x.size(0), x.size(1), x.size(2), y.size(1), y.size(2), w.size(0)};
  if (y.numel() == 0) return;
  std::vector<ShiftedTap> taps;  // y rows t += x rows t + k - pad_left @ w[k]
  for (int64_t k = 0; k < s.K; k++) {
    const Conv1dTapRows rows = conv1d_tap_rows(k, pad_left, s.T, s.To);
    taps.push_back({rows.begin, rows.end, k - pad_left, tap_matrix(w, k, false)});
  }
  accumulate_taps(x, y, bias, taps);
}

void conv1d_backward_input(const Tensor& g, const Tensor& w, int64_t pad_left, const Tensor& dx) {
  const Sizes s{dx.size(0), dx.size(1), dx.size(2), g.size(1), g.size(2), w.size(0)};
  if (dx.numel() == 0) return;
  std::vector<ShiftedTap> taps;  // dx rows t + k - pad_left += g rows t @ w[k]^T
  for (int64_t k = 0; k < s.K; k++) {
    const Conv1dTapRows rows = conv1d_tap_rows(k, pad_left, s.T, s.To);
    taps.push_back({rows.begin + k - pad_left, rows.end + k - pad_left, pad_left - k, tap_matrix(w, k, true)});
  }
  accumulate_taps(g, dx, Tensor(), taps);
}

void conv1d_backward_weight(const Tensor& g, const Tensor& x, int64_t pad_left, const Tensor& dw) {
  const Sizes s{x.size(0), x.size(1), x.size(2), g.size(1), g.size(2), dw.size(0)};
  if (dw.numel() == 0) return;
  std::vector<int64_t> shifted;  // taps for the kernel
  for (int64_t k = 0; k < s.K; k++) {
    Tensor dw_k = Tensor::view_of(dw, {s.Cin, s.Cout}, {s.Cout, 1}, dw.offset() + k * s.Cin * s.Cout);  // [Cin, Cout]
    if (k == pad_left && s.To == s.T) {
      // The unshifted tap (a 1x1 convolution, the centre tap of an encoder convolution, the last one of a
      // causal decoder convolution) pairs row (b, t) of g with row (b, t) of x for every row: one plain
      // GEMM over the flattened rows, dw[k] = x^T [Cin, B T] @ g [B T, Cout], on cuBLASLt.
      Tensor x_t = Tensor::view_of(x, {s.Cin, s.B * s.T}, {1, s.Cin}, x.offset());
      Tensor g_rows = Tensor::view_of(g, {s.B * s.To, s.Cout}, {s.Cout, 1}, g.offset());
      matmul(x_t, g_rows, Tensor(), dw_k);
      continue;
    }
    const Conv1dTapRows rows = conv1d_tap_rows(k, pad_left, s.T, s.To);  // g rows [t0, t1) of every sentence
    if (rows.count() == 0) {
      ENGINE_CUDA_CHECK(cudaMemsetAsync(dw_k.data_ptr(), 0, dw_k.nbytes(), engine::cuda::stream()));  // 0.0
      continue;
    }
    if (s.To != s.T) {  // the kernel below maps the rows itself
      shifted.push_back(k);
      continue;
    }
    // A shifted tap over the flattened rows (the file's comment): g rows [t0, (B - 1) T + t1) with x rows s = k -
    // pad_left further on, less the pairs that cross a sentence boundary, g rows b T + t1 + j (j < |s|) of sentences
    // b < B - 1, T rows apart in both tensors.
    const int64_t shift = k - pad_left, t0 = rows.begin, t1 = rows.end, R = (s.B - 1) * s.T + t1 - t0;
    Tensor dw_k3 = Tensor::view_of(dw, {1, s.Cin, s.Cout}, {s.Cin * s.Cout, s.Cout, 1}, dw_k.offset());
    double beta = 0;  // dw[k] is first written, then added to
    for (int64_t j = 0; s.B > 1 && j < s.T - t1 + t0; j++, beta = 1) {
      const int64_t r = t1 + j;  // g's row of sentence 0 (past its tap rows), then every T rows
      Tensor xe = Tensor::view_of(x, {1, s.Cin, s.B - 1}, {0, 1, s.T * s.Cin}, x.offset() + (r + shift) * s.Cin);
      Tensor ge = Tensor::view_of(g, {1, s.B - 1, s.Cout}, {0, s.T * s.Cout, 1}, g.offset() + r * s.Cout);
      matmul_accumulate(xe, ge, dw_k3, -1.0, beta);
    }
    Tensor xf = Tensor::view_of(x, {1, s.Cin, R}, {0, 1, s.Cin}, x.offset() + (t0 + shift) * s.Cin);
    Tensor gf = Tensor::view_of(g, {1, R, s.Cout}, {0, s.Cout, 1}, g.offset() + t0 * s.Cout);
    matmul_accumulate(xf, gf, dw_k3, 1.0, beta);
  }
  for (size_t first = 0; first < shifted.size(); first += kMaxTapsPerLaunch) {
    TapList taps{};
    const size_t count = std::min<size_t>(kMaxTapsPerLaunch, shifted.size() - first);
    for (size_t j = 0; j < count; j++) taps.k[j] = shifted[first + j];
    const dim3 grid(unsigned((s.Cout + kWgTile - 1) / kWgTile), unsigned((s.Cin + kWgTile - 1) / kWgTile),
                    unsigned(count));
    ENGINE_CUDA_FLOAT_SWITCH(dw.dtype(), T, {
      conv1d_weight_grad_kernel<T><<<grid, kWgThreads, 0, engine::cuda::stream()>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<const T*>(g.data_ptr()), static_cast<T*>(dw.data_ptr()), s.B,
          s.T, s.Cin, s.To, s.Cout, pad_left, taps);
      ENGINE_CUDA_LAUNCH_CHECK("conv1d_backward_weight");
    });
  }
}

void glu_forward(const Tensor& x, int64_t dim, const Tensor& y) {
  int64_t outer, half;
  glu_sizes(x, dim, &outer, &half);
  if (y.numel() == 0) return;
  const bool aligned = aligned16(x.data_ptr()) && aligned16(y.data_ptr());
  launch_glu(x, outer, half, aligned, [&](auto tag, auto vec) {
    using T = decltype(tag);
    constexpr int V = decltype(vec)::value;
    const int threads = 256;
    glu_forward_kernel<T, V><<<grid_for(outer * half / V, threads), threads, 0, engine::cuda::stream()>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), outer, half);
    ENGINE_CUDA_LAUNCH_CHECK("glu");
  });
}

void glu_backward(const Tensor& g, const Tensor& x, int64_t dim, const Tensor& dx) {
  int64_t outer, half;
  glu_sizes(x, dim, &outer, &half);
  if (dx.numel() == 0) return;
  const bool aligned = aligned16(g.data_ptr()) && aligned16(x.data_ptr()) && aligned16(dx.data_ptr());
  launch_glu(x, outer, half, aligned, [&](auto tag, auto vec) {
    using T = decltype(tag);
    constexpr int V = decltype(vec)::value;
    const int threads = 256;
    glu_backward_kernel<T, V><<<grid_for(outer * half / V, threads), threads, 0, engine::cuda::stream()>>>(
        static_cast<const T*>(g.data_ptr()), static_cast<const T*>(x.data_ptr()), static_cast<T*>(dx.data_ptr()), outer,
        half);
    ENGINE_CUDA_LAUNCH_CHECK("glu_backward");
  });
}

}  // namespace ops::cuda
