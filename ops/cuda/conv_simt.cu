// cuda/conv_simt.cu: the f32 convolution as implicit GEMMs on CUDA cores (true fp32: the model's default
// precision), for channels per group that are multiples of 4 (16-byte float4 copies). The same GEMMs as
// the tensor-core kernels (conv_igemm_*.cu):
//   forward  M = N*Ho*Wo, N = Cout/g,        K = KH*KW*Cin/g   A = gathered x, B = w rows
//   data     M = N*H*W,   N = Cin/g,         K = KH*KW*Cout/g  A = gathered dy, B = w; as one GEMM per stride
//                                                              phase over only the taps that reach it (M and
//                                                              K each ~1/s^2 of these; conv_igemm_data_phases.cu)
//   weight   M = Cout/g,  N = KH*KW*Cin/g,   K = pixels        A = dy rows, B = gathered x; split-K into
//                                                              the workspace as conv_igemm_weight.cu
// Tiling: the classic SGEMM block: 256 threads (two blocks per SM: <= 128 registers, which costs the narrow
// tiles' loaders 40-104 bytes of spills) own a BM x BN tile of C (BM BN = 128 x 128, or 512 x 32 and
// 256 x 64 for narrow N, 32 x 512 and 64 x 256 for a narrow weight gradient: tile_for below), each thread an
// 8 x 8 register tile (rows ty*4 + {0..3} and BM/2 + ty*4 + {0..3}, columns likewise with tx over BN/8 threads),
// K advancing 8 at a time through two shared-memory buffers As[k][m], Bs[k][n]: each thread loads the next
// slice's A and B float4s into registers while computing the current slice, then stores them to the other
// buffer. Per k: 2 + 2 float4 shared loads for 64 FMAs. Each output element is one thread's chain of FMAs in
// increasing k whatever the tile, so the tile changes no bit of the result. Bound: FP32 issue (~67 TFLOP/s on an
// H200) and, for the gathers, address arithmetic. The 128 x 128 tile alone left 3/4 of its FMAs on zero columns
// for pix2pixHD's 32- and 4-channel layers (5.6 and 1.0 TFLOP/s, 121 ms of a 664 ms fp32 step).
// Measured (H200, 2026-12-04, ConvCudaPerf fp32 rows, TFLOP/s forward / data / weight, before -> after the narrow
// tiles): ResNet 3x3 64@128^2 20.0 / 19.4 / 10.6 -> 30.4 / 32.1 / 15.8; d2 256@32^2 37.3 / 35.2 / 21.4 -> 38.4 /
// 29.7 / 30.5; Darknet 128->256 @152^2 42.5 / 41.3 / 23.1 -> 43.3 / 36.1 / 29.9. The 128 x 128 data gradient lost
// 13-16% with the templated loaders (128 registers either way; not yet understood); every layer's three passes
// together are faster. A loader's side narrower than 128 leaves threads without a chunk: has_chunk is a
// compile-time true for the wide sides (a run-time test there had cost the data kernel 27 registers).
#include "ops/cuda/conv_igemm.cuh"

namespace ops::cuda::conv {

namespace {

using igemm::FastDims;
using igemm::FastDiv;
using igemm::PhaseTaps;
using igemm::kFarAway;

constexpr int kBK = 8, kThreads = 256;

template <int BM, int BN>
struct Smem {
  float a[2][kBK][BM];
  float b[2][kBK][BN];
};

__device__ __forceinline__ float4 load4(const float* p, bool ok) {
  return ok ? *reinterpret_cast<const float4*>(p) : make_float4(0.f, 0.f, 0.f, 0.f);
}

// Stores a chunk of 4 consecutive k at column col (k-major tile).
template <int W>
__device__ __forceinline__ void store_kt(float (*tile)[W], int k0, int col, float4 v) {
  tile[k0][col] = v.x, tile[k0 + 1][col] = v.y, tile[k0 + 2][col] = v.z, tile[k0 + 3][col] = v.w;
}
// Stores a chunk of 4 consecutive columns in row k.
template <int W>
__device__ __forceinline__ void store_row(float (*tile)[W], int k, int col0, float4 v) {
  *reinterpret_cast<float4*>(&tile[k][col0]) = v;
}

// A tile side of W columns and kBK k holds 2 W float4 chunks; thread t takes chunks t + 256 r, r < chunks<W>,
// those below 2 W (so a side narrower than 128 leaves threads without a chunk).
template <int W>
constexpr int chunks() {
  return W >= 128 ? W / 128 : 1;
}
template <int W>
__device__ __forceinline__ int chunk_of(int r) {
  return int(threadIdx.x) + kThreads * r;
}
template <int W>
__device__ __forceinline__ bool has_chunk(int r) {
  return W >= 128 || chunk_of<W>(r) < 2 * W;
}

// ---------------------------------------------------------------------------------------------------
// Loaders: load(kt) reads slice kt's A and B float4s of this thread into registers; store(buf) writes them.

// Forward: A chunk c = x at pixel column c / 2, k c % 2 * 4.. (transposed); B chunk c = weight row c / 2 at the same k.
template <int BM, int BN>
struct ForwardLoader {
  static constexpr int RA = chunks<BM>(), RB = chunks<BN>();
  const float* x;
  const float* w;
  FastDiv cg, kw;
  int K, dh, dw, h, w_, cin, coff;
  int k_off;                           // 0 or 4: the same for every chunk of the thread
  int a_base[RA], a_hb[RA], a_wb[RA];  // each A chunk's output pixel
  int b_row[RB];                       // each B chunk's weight row offset, or -1
  float4 ra[RA], rb[RB];
  __device__ void load(int kt) {
    const int k = kt * kBK + k_off;
    int tap, c, kh, kwi;
    cg.divmod(min(k, K), tap, c);
    kw.divmod(tap, kh, kwi);
#pragma unroll
    for (int r = 0; r < RA; r++) {
      const int hi = a_hb[r] + kh * dh, wi = a_wb[r] + kwi * dw;
      const bool ok = k < K && unsigned(hi) < unsigned(h) && unsigned(wi) < unsigned(w_);
      ra[r] = load4(x + (ok ? a_base[r] + (hi * w_ + wi) * cin + coff + c : 0), ok);
    }
#pragma unroll
    for (int r = 0; r < RB; r++) rb[r] = load4(w + (b_row[r] >= 0 && k < K ? b_row[r] + k : 0), b_row[r] >= 0 && k < K);
  }
  __device__ void store(Smem<BM, BN>& s, int buf) const {
#pragma unroll
    for (int r = 0; r < RA; r++) store_kt(s.a[buf], k_off, chunk_of<BM>(r) / 2, ra[r]);
#pragma unroll
    for (int r = 0; r < RB; r++)
      if (has_chunk<BN>(r)) store_kt(s.b[buf], k_off, chunk_of<BN>(r) / 2, rb[r]);
  }
};

// Data gradient, one stride phase (rh, rw) per blockIdx.z (PhaseTaps): the dx pixels (rh + s_h i, rw + s_w j) and
// only the taps that reach them, k = (v, co) over the phase's valid taps v = (vh, vw) in (kh, kw) order, so that no
// FMA multiplies a tap off the output grid (the all-taps GEMM spent 3/4 of a stride-2 layer's FMAs on zeros) and the
// sums run in the same order as over every tap. A chunk c = dy gathered for phase pixel column c / 2, k c % 2 * 4..
// (transposed); B chunk c = w at k row c / (BN / 4), columns c % (BN / 4) * 4.. (input channels). kUnit: stride 1,
// the one phase of every tap (v is the tap; the kernel's pixel decodes and the epilogue need no phase arithmetic:
// without it the stride-1 data gradient ran 6-9% slower, ptxas spilling 60 bytes).
template <int BM, int BN, bool kUnit>
struct DataLoader {
  static constexpr int RA = chunks<BM>(), RB = chunks<BN>();
  const float* dy;
  const float* w;
  FastDiv coutg, nw;                   // nw: the phase's valid taps per filter row
  int K, ho, wo, cout;
  int off_h, doff_h, off_w, doff_w;    // A: tap v = (vh, vw) reads dy at (i + off_h - vh doff_h, j + ..) (PhaseTaps)
  int co_stride, tap0, tap_dh, tap_dw;  // B: w at b_base + co co_stride + tap0 + vh tap_dh + vw tap_dw
  int k_off;                           // A's k offset, 0 or 4
  int a_base[RA], a_i[RA], a_j[RA];    // n*Ho*Wo*Cout + g*Coutg, the phase pixel's row and column
  int b_k[RB], b_base[RB];             // B: k row; g*Coutg*taps*Cin/g + the first input channel, or -1
  float4 ra[RA], rb[RB];
  __device__ void load(int kt) {
    {
      const int k = kt * kBK + k_off;
      int v, co, vh, vw;
      coutg.divmod(min(k, K), v, co);
      nw.divmod(v, vh, vw);
      const int oh = off_h - vh * doff_h, ow = off_w - vw * doff_w;
#pragma unroll
      for (int r = 0; r < RA; r++) {
        const int th = a_i[r] + oh, tw = a_j[r] + ow;
        const bool ok = k < K && unsigned(th) < unsigned(ho) && unsigned(tw) < unsigned(wo);
        ra[r] = load4(dy + (ok ? a_base[r] + (th * wo + tw) * cout + co : 0), ok);
      }
    }
#pragma unroll
    for (int r = 0; r < RB; r++) {
      const int k = kt * kBK + b_k[r];
      const bool ok = b_base[r] >= 0 && k < K;
      int v, co, tap_off;
      coutg.divmod(min(k, K), v, co);
      if constexpr (kUnit) {
        tap_off = v * tap_dw;
      } else {
        int vh, vw;
        nw.divmod(v, vh, vw);
        tap_off = tap0 + vh * tap_dh + vw * tap_dw;
      }
      rb[r] = load4(w + (ok ? b_base[r] + co * co_stride + tap_off : 0), ok);
    }
  }
  __device__ void store(Smem<BM, BN>& s, int buf) const {
#pragma unroll
    for (int r = 0; r < RA; r++) store_kt(s.a[buf], k_off, chunk_of<BM>(r) / 2, ra[r]);
#pragma unroll
    for (int r = 0; r < RB; r++)
      if (has_chunk<BN>(r)) store_row(s.b[buf], b_k[r], chunk_of<BN>(r) % (BN / 4) * 4, rb[r]);
  }
};

// Weight gradient: A chunk c = dy at pixel row c / (BM / 4), output channels c % (BM / 4) * 4..; B chunk c = x
// gathered at pixel row c / (BN / 4), columns (tap, input channel) c % (BN / 4) * 4...
template <int BM, int BN>
struct WeightLoader {
  static constexpr int RA = chunks<BM>(), RB = chunks<BN>();
  const float* x;
  const float* dy;
  FastDiv wo, ho;
  int p_begin, p_end, h, w, cin, cout, sh, sw;
  int a_row[RA], a_off[RA];                      // A: pixel row in the slice; g*Coutg + co, or -1
  int b_row[RB], b_off[RB], b_dh[RB], b_dw[RB];  // B: pixel row; g*Cg + ci (or -1), kh*d - p, kw*d - p
  float4 ra[RA], rb[RB];
  __device__ void load(int kt) {
#pragma unroll
    for (int r = 0; r < RA; r++) {
      const int p = p_begin + kt * kBK + a_row[r];
      const bool ok = p < p_end && a_off[r] >= 0;
      ra[r] = load4(dy + (ok ? p * cout + a_off[r] : 0), ok);
    }
#pragma unroll
    for (int r = 0; r < RB; r++) {
      const int p = p_begin + kt * kBK + b_row[r];
      int t, wq, n, hq;
      wo.divmod(min(p, p_end), t, wq);
      ho.divmod(t, n, hq);
      const int hi = hq * sh + b_dh[r], wi = wq * sw + b_dw[r];
      const bool ok = p < p_end && b_off[r] >= 0 && unsigned(hi) < unsigned(h) && unsigned(wi) < unsigned(w);
      rb[r] = load4(x + (ok ? ((n * h + hi) * w + wi) * cin + b_off[r] : 0), ok);
    }
  }
  __device__ void store(Smem<BM, BN>& s, int buf) const {
#pragma unroll
    for (int r = 0; r < RA; r++)
      if (has_chunk<BM>(r)) store_row(s.a[buf], a_row[r], chunk_of<BM>(r) % (BM / 4) * 4, ra[r]);
#pragma unroll
    for (int r = 0; r < RB; r++)
      if (has_chunk<BN>(r)) store_row(s.b[buf], b_row[r], chunk_of<BN>(r) % (BN / 4) * 4, rb[r]);
  }
};

// The thread's place in the BM x BN tile: tx over BN / 8 columns, ty over BM / 8 rows.
template <int BN>
__device__ __forceinline__ int tile_tx() {
  return int(threadIdx.x) % (BN / 8);
}
template <int BN>
__device__ __forceinline__ int tile_ty() {
  return int(threadIdx.x) / (BN / 8);
}

// acc[i][j]: row (i < 4 ? ty*4 + i : BM/2 + ty*4 + i - 4), column likewise with tx and BN/2.
template <int BM, int BN, typename Loader>
__device__ __forceinline__ void simt_mainloop(Loader& ld, int k_tiles, Smem<BM, BN>& s, float (&acc)[8][8]) {
  const int tx = tile_tx<BN>(), ty = tile_ty<BN>();
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
  if (k_tiles <= 0) return;
  ld.load(0);
  ld.store(s, 0);
  __syncthreads();
  for (int kt = 0; kt < k_tiles; kt++) {
    const int buf = kt & 1;
    if (kt + 1 < k_tiles) ld.load(kt + 1);
#pragma unroll
    for (int k = 0; k < kBK; k++) {
      const float4 a0 = *reinterpret_cast<const float4*>(&s.a[buf][k][ty * 4]);
      const float4 a1 = *reinterpret_cast<const float4*>(&s.a[buf][k][BM / 2 + ty * 4]);
      const float4 b0 = *reinterpret_cast<const float4*>(&s.b[buf][k][tx * 4]);
      const float4 b1 = *reinterpret_cast<const float4*>(&s.b[buf][k][BN / 2 + tx * 4]);
      const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (kt + 1 < k_tiles) ld.store(s, buf ^ 1);
    __syncthreads();
  }
}

// Calls store(row, col, float4 of columns col..col+3) for the thread's 16 chunks.
template <int BM, int BN, typename Store>
__device__ __forceinline__ void simt_epilogue(const float (&acc)[8][8], Store&& store) {
  const int tx = tile_tx<BN>(), ty = tile_ty<BN>();
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int jh = 0; jh < 2; jh++)
      store(i < 4 ? ty * 4 + i : BM / 2 + ty * 4 + i - 4, jh * (BN / 2) + tx * 4,
            make_float4(acc[i][4 * jh], acc[i][4 * jh + 1], acc[i][4 * jh + 2], acc[i][4 * jh + 3]));
}

template <int BM, int BN>
__global__ void __launch_bounds__(kThreads, 2)
    simt_forward_kernel(const FastDims f, const float* __restrict__ x, const float* __restrict__ w,
                        const float* __restrict__ bias, float* __restrict__ y, int n_tiles) {
  __shared__ __align__(16) Smem<BM, BN> s;
  const Dims& d = f.d;
  const int M = d.n * d.ho * d.wo, K = d.kh * d.kw * d.cg;
  const int m0 = int(blockIdx.x) / n_tiles * BM, n0 = int(blockIdx.x) % n_tiles * BN, grp = int(blockIdx.y);
  ForwardLoader<BM, BN> ld;
  ld.x = x, ld.w = w, ld.cg = f.cg, ld.kw = f.kw, ld.K = K, ld.dh = d.dh, ld.dw = d.dw, ld.h = d.h, ld.w_ = d.w;
  ld.cin = d.cin, ld.coff = grp * d.cg;
  ld.k_off = (int(threadIdx.x) % 2) * 4;
#pragma unroll
  for (int r = 0; r < ld.RA; r++) {
    const int m = m0 + chunk_of<BM>(r) / 2;
    if (m < M) {
      int t, wo, n, ho;
      f.wo.divmod(m, t, wo);
      f.ho.divmod(t, n, ho);
      ld.a_base[r] = n * d.h * d.w * d.cin, ld.a_hb[r] = ho * d.sh - d.ph, ld.a_wb[r] = wo * d.sw - d.pw;
    } else {
      ld.a_base[r] = 0, ld.a_hb[r] = kFarAway, ld.a_wb[r] = kFarAway;
    }
  }
#pragma unroll
  for (int r = 0; r < ld.RB; r++) {
    const int co = n0 + chunk_of<BN>(r) / 2;
    ld.b_row[r] = has_chunk<BN>(r) && co < d.coutg ? (grp * d.coutg + co) * K : -1;
  }
  float acc[8][8];
  simt_mainloop(ld, (K + kBK - 1) / kBK, s, acc);
  simt_epilogue<BM, BN>(acc, [&](int r, int c, float4 v) {
    const int mm = m0 + r, cc = n0 + c;
    if (mm >= M || cc >= d.coutg) return;
    const int oc = grp * d.coutg + cc;
    if (bias) v.x += bias[oc], v.y += bias[oc + 1], v.z += bias[oc + 2], v.w += bias[oc + 3];
    *reinterpret_cast<float4*>(y + int64_t(mm) * d.cout + oc) = v;
  });
}

// Grid: (tiles of the largest phase, groups, phases from phase0); blocks past their phase's pixels return at once.
template <int BM, int BN, bool kUnit>
__global__ void __launch_bounds__(kThreads, 2)
    simt_data_kernel(const FastDims f, const float* __restrict__ dy, const float* __restrict__ w,
                     float* __restrict__ dx, int n_tiles, int phase0) {
  __shared__ __align__(16) Smem<BM, BN> s;
  const Dims& d = f.d;
  const int phase = kUnit ? 0 : phase0 + int(blockIdx.z), rh = kUnit ? 0 : phase / d.sw, rw = kUnit ? 0 : phase % d.sw;
  const int hp = kUnit ? d.h : (d.h - rh + d.sh - 1) / d.sh, wp = kUnit ? d.w : (d.w - rw + d.sw - 1) / d.sw;
  const int M = d.n * hp * wp;  // the phase's dx pixels
  const int m0 = int(blockIdx.x) / n_tiles * BM, n0 = int(blockIdx.x) % n_tiles * BN, grp = int(blockIdx.y);
  if (m0 >= M) return;
  const PhaseTaps th(rh, d.ph, d.dh, d.sh, d.kh), tw(rw, d.pw, d.dw, d.sw, d.kw);
  const FastDiv hpd = kUnit ? f.h : FastDiv(hp), wpd = kUnit ? f.w : FastDiv(wp);
  DataLoader<BM, BN, kUnit> ld;
  ld.dy = dy, ld.w = w, ld.coutg = f.coutg, ld.nw = kUnit ? f.kw : FastDiv(max(tw.count, 1));
  ld.K = th.count * tw.count * d.coutg, ld.ho = d.ho, ld.wo = d.wo, ld.cout = d.cout;
  ld.off_h = th.off, ld.doff_h = th.doff, ld.off_w = tw.off, ld.doff_w = tw.doff;
  const int taps = d.kh * d.kw;
  ld.co_stride = taps * d.cg, ld.tap0 = (th.first * d.kw + tw.first) * d.cg;
  ld.tap_dh = th.step * d.kw * d.cg, ld.tap_dw = tw.step * d.cg;
  ld.k_off = (int(threadIdx.x) % 2) * 4;
#pragma unroll
  for (int r = 0; r < ld.RA; r++) {
    const int m = m0 + chunk_of<BM>(r) / 2;
    if (m < M) {
      int t, j, n, i;
      wpd.divmod(m, t, j);
      hpd.divmod(t, n, i);
      ld.a_base[r] = n * d.ho * d.wo * d.cout + grp * d.coutg, ld.a_i[r] = i, ld.a_j[r] = j;
    } else {
      ld.a_base[r] = 0, ld.a_i[r] = kFarAway, ld.a_j[r] = kFarAway;
    }
  }
#pragma unroll
  for (int r = 0; r < ld.RB; r++) {
    const int c = chunk_of<BN>(r), ci = n0 + c % (BN / 4) * 4;
    ld.b_k[r] = c / (BN / 4);
    ld.b_base[r] = has_chunk<BN>(r) && ci < d.cg ? grp * d.coutg * taps * d.cg + ci : -1;
  }
  float acc[8][8];
  simt_mainloop(ld, (ld.K + kBK - 1) / kBK, s, acc);
  simt_epilogue<BM, BN>(acc, [&](int r, int c, float4 v) {
    const int mm = m0 + r, ci = n0 + c;
    if (mm >= M || ci >= d.cg) return;
    int64_t pix = mm;
    if constexpr (!kUnit) {
      int t, j, n, i;
      wpd.divmod(mm, t, j);
      hpd.divmod(t, n, i);
      pix = (int64_t(n) * d.h + rh + d.sh * i) * d.w + rw + d.sw * j;
    }
    *reinterpret_cast<float4*>(dx + pix * d.cin + grp * d.cg + ci) = v;
  });
}

template <int BM, int BN>
__global__ void __launch_bounds__(kThreads, 2)
    simt_weight_kernel(const FastDims f, const float* __restrict__ x, const float* __restrict__ dy,
                       float* __restrict__ out, int n_tiles, int per_split) {
  __shared__ __align__(16) Smem<BM, BN> s;
  const Dims& d = f.d;
  const int P = d.n * d.ho * d.wo, KW = d.kh * d.kw * d.cg;
  const int m0 = int(blockIdx.x) / n_tiles * BM, n0 = int(blockIdx.x) % n_tiles * BN;
  const int grp = int(blockIdx.y), split = int(blockIdx.z);
  WeightLoader<BM, BN> ld;
  ld.x = x, ld.dy = dy, ld.wo = f.wo, ld.ho = f.ho, ld.h = d.h, ld.w = d.w, ld.cin = d.cin, ld.cout = d.cout;
  ld.sh = d.sh, ld.sw = d.sw;
  ld.p_begin = min(P, split * per_split), ld.p_end = min(P, ld.p_begin + per_split);
#pragma unroll
  for (int r = 0; r < ld.RA; r++) {
    const int c = chunk_of<BM>(r), co = m0 + c % (BM / 4) * 4;
    ld.a_row[r] = c / (BM / 4);
    ld.a_off[r] = has_chunk<BM>(r) && co < d.coutg ? grp * d.coutg + co : -1;
  }
#pragma unroll
  for (int r = 0; r < ld.RB; r++) {
    const int c = chunk_of<BN>(r), j = n0 + c % (BN / 4) * 4;
    int tap, ci, kh, kwi;
    f.cg.divmod(min(j, KW), tap, ci);
    f.kw.divmod(tap, kh, kwi);
    ld.b_row[r] = c / (BN / 4);
    ld.b_off[r] = has_chunk<BN>(r) && j < KW ? grp * d.cg + ci : -1;
    ld.b_dh[r] = kh * d.dh - d.ph, ld.b_dw[r] = kwi * d.dw - d.pw;
  }
  float acc[8][8];
  simt_mainloop(ld, (ld.p_end - ld.p_begin + kBK - 1) / kBK, s, acc);
  float* o = out + int64_t(split) * d.cout * KW;
  simt_epilogue<BM, BN>(acc, [&](int r, int c, float4 v) {
    const int mm = m0 + r, nn = n0 + c;
    if (mm < d.coutg && nn < KW) *reinterpret_cast<float4*>(o + int64_t(grp * d.coutg + mm) * KW + nn) = v;
  });
}

// The tile for a GEMM of M rows and N columns: of 128 x 128 and the two tiles narrow in N (512 x 32, 256 x 64; in M
// for `rows_narrow`, the weight gradient: 32 x 512, 64 x 256), the one with the fewest blocks, so the fewest FMAs
// on rows and columns past M and N (a block's time per k is about the same whatever its shape); 128 x 128 on a
// tie. A function of the shape alone.
enum class Tile { t128x128, t512x32, t256x64, t32x512, t64x256 };
Tile tile_for(int64_t M, int64_t N, bool rows_narrow) {
  auto blocks = [&](int64_t bm, int64_t bn) { return ((M + bm - 1) / bm) * ((N + bn - 1) / bn); };
  Tile best = Tile::t128x128;
  int64_t fewest = blocks(128, 128);
  const Tile narrow[2] = {rows_narrow ? Tile::t64x256 : Tile::t256x64, rows_narrow ? Tile::t32x512 : Tile::t512x32};
  const int64_t sides[2][2] = {{rows_narrow ? 64 : 256, rows_narrow ? 256 : 64},
                               {rows_narrow ? 32 : 512, rows_narrow ? 512 : 32}};
  for (int i = 0; i < 2; i++) {
    const int64_t b = blocks(sides[i][0], sides[i][1]);
    if (b < fewest) best = narrow[i], fewest = b;
  }
  return best;
}

// Calls f(std::integral_constant<int, BM>, std::integral_constant<int, BN>) for the tile (only the tiles of the
// kind asked for are instantiated).
template <bool kRowsNarrow, typename F>
void with_tile(Tile t, F&& f) {
  using std::integral_constant;
  if constexpr (kRowsNarrow) {
    if (t == Tile::t32x512) return f(integral_constant<int, 32>{}, integral_constant<int, 512>{});
    if (t == Tile::t64x256) return f(integral_constant<int, 64>{}, integral_constant<int, 256>{});
  } else {
    if (t == Tile::t512x32) return f(integral_constant<int, 512>{}, integral_constant<int, 32>{});
    if (t == Tile::t256x64) return f(integral_constant<int, 256>{}, integral_constant<int, 64>{});
  }
  f(integral_constant<int, 128>{}, integral_constant<int, 128>{});
}

}  // namespace

void simt_forward(const Dims& d, const float* x, const float* w, const float* bias, float* y) {
  const int64_t M = int64_t(d.n) * d.ho * d.wo;
  if (M == 0 || d.cout == 0) return;
  with_tile<false>(tile_for(M, d.coutg, false), [&](auto bm, auto bn) {
    constexpr int BM = decltype(bm)::value, BN = decltype(bn)::value;
    const int n_tiles = (d.coutg + BN - 1) / BN;
    const dim3 grid(unsigned((M + BM - 1) / BM * n_tiles), unsigned(d.groups));
    simt_forward_kernel<BM, BN><<<grid, kThreads, 0, engine::cuda::stream()>>>(FastDims(d), x, w, bias, y, n_tiles);
  });
  ENGINE_CUDA_LAUNCH_CHECK("conv2d (f32 implicit GEMM forward)");
}

void simt_data(const Dims& d, const float* dy, const float* w, float* dx) {
  const int64_t M = int64_t(d.n) * d.h * d.w;
  if (M == 0 || d.cin == 0) return;
  const int64_t M0 = int64_t(d.n) * ((d.h + d.sh - 1) / d.sh) * ((d.w + d.sw - 1) / d.sw);  // phase (0, 0), the largest
  const int phases = d.sh * d.sw;
  with_tile<false>(tile_for(M0, d.cg, false), [&](auto bm, auto bn) {
    constexpr int BM = decltype(bm)::value, BN = decltype(bn)::value;
    const int n_tiles = (d.cg + BN - 1) / BN;
    for (int phase0 = 0; phase0 < phases; phase0 += 65535) {  // the grid's z extent
      const unsigned z = unsigned(std::min(65535, phases - phase0));
      const dim3 grid(unsigned((M0 + BM - 1) / BM * n_tiles), unsigned(d.groups), z);
      auto kernel = phases == 1 ? simt_data_kernel<BM, BN, true> : simt_data_kernel<BM, BN, false>;
      kernel<<<grid, kThreads, 0, engine::cuda::stream()>>>(FastDims(d), dy, w, dx, n_tiles, phase0);
    }
  });
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_data (f32 implicit GEMM per stride phase)");
}

void simt_weight(const Dims& d, const float* x, const float* dy, float* dw, float* ws, int splits) {
  const int64_t count = int64_t(d.cout) * d.kh * d.kw * d.cg;
  if (count == 0) return;
  if (ws == nullptr) splits = 1;
  const int64_t P = int64_t(d.n) * d.ho * d.wo, KW = int64_t(d.kh) * d.kw * d.cg;
  const int per_split = int(std::max<int64_t>(1, (P + splits - 1) / splits));
  with_tile<true>(tile_for(d.coutg, KW, true), [&](auto bm, auto bn) {
    constexpr int BM = decltype(bm)::value, BN = decltype(bn)::value;
    const int m_tiles = (d.coutg + BM - 1) / BM, n_tiles = int((KW + BN - 1) / BN);
    const dim3 grid(unsigned(m_tiles * n_tiles), unsigned(d.groups), unsigned(splits));
    simt_weight_kernel<BM, BN>
        <<<grid, kThreads, 0, engine::cuda::stream()>>>(FastDims(d), x, dy, splits > 1 ? ws : dw, n_tiles, per_split);
  });
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_weight (f32 implicit GEMM)");
  if (splits > 1) weight_grad_finalize(engine::DType::f32, ws, splits, count, dw);
}

}  // namespace ops::cuda::conv
