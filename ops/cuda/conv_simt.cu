// cuda/conv_simt.cu: the f32 convolution as implicit GEMMs on CUDA cores (true fp32: the model's default
// precision), for channels per group that are multiples of 4 (16-byte float4 copies). The same GEMMs as
// the tensor-core kernels (conv_igemm_*.cu):
//   forward  M = N*Ho*Wo, N = Cout/g,        K = KH*KW*Cin/g   A = gathered x, B = w rows
//   data     M = N*H*W,   N = Cin/g,         K = KH*KW*Cout/g  A = gathered dy (taps off the output grid
//                                                              zero: stride > 1 wastes 1 - 1/s^2), B = w
//   weight   M = Cout/g,  N = KH*KW*Cin/g,   K = pixels        A = dy rows, B = gathered x; split-K into
//                                                              the workspace as conv_igemm_weight.cu
// Tiling: the classic SGEMM block: 256 threads own a 128 x 128 tile of C, each an 8 x 8 register tile (rows
// ty*4 + {0..3} and 64 + ty*4 + {0..3}, columns likewise with tx), K advancing 8 at a time through two
// shared-memory buffers As[k][m], Bs[k][n] (16 KB): each thread loads the next slice's one A and one B
// float4 into registers while computing the current slice, then stores them to the other buffer. Per
// k: 2 + 2 float4 shared loads for 64 FMAs. Bound: FP32 issue (~67 TFLOP/s on an H200) and, for the
// gathers, address arithmetic.
#include "ops/cuda/conv_igemm.cuh"

namespace ops::cuda::conv {

namespace {

using igemm::FastDims;
using igemm::FastDiv;
using igemm::kFarAway;

constexpr int kBM = 128, kBN = 128, kBK = 8, kThreads = 256;

struct Smem {
  float a[2][kBK][kBM];
  float b[2][kBK][kBN];
};

// One float4 of a K-slice, held between its global load and its shared store, with where it goes:
// transposed (4 k rows of one m/n column) or straight (one k row, 4 columns).
struct Chunk {
  float4 v;
};

__device__ __forceinline__ float4 load4(const float* p, bool ok) {
  return ok ? *reinterpret_cast<const float4*>(p) : make_float4(0.f, 0.f, 0.f, 0.f);
}

// Stores a chunk of 4 consecutive k at column col (k-major tile).
__device__ __forceinline__ void store_kt(float (*tile)[kBM], int k0, int col, float4 v) {
  tile[k0][col] = v.x, tile[k0 + 1][col] = v.y, tile[k0 + 2][col] = v.z, tile[k0 + 3][col] = v.w;
}
// Stores a chunk of 4 consecutive columns in row k.
__device__ __forceinline__ void store_row(float (*tile)[kBM], int k, int col0, float4 v) {
  *reinterpret_cast<float4*>(&tile[k][col0]) = v;
}

// ---------------------------------------------------------------------------------------------------
// Loaders: load(kt) reads slice kt's A and B float4 of this thread into registers; store(buf) writes them.

struct ForwardLoader {
  const float* x;
  const float* w;
  FastDiv cg, kw;
  int K, dh, dw, h, w_, cin, coff;
  int m_col, k_off;       // A and B: this thread's tile column (m or n) and k offset (0 or 4)
  int a_base, a_hb, a_wb; // its output pixel
  int b_row;              // its weight row offset, or -1
  float4 ra, rb;
  __device__ void load(int kt) {
    const int k = kt * kBK + k_off;
    int tap, c, kh, kwi;
    cg.divmod(min(k, K), tap, c);
    kw.divmod(tap, kh, kwi);
    const int hi = a_hb + kh * dh, wi = a_wb + kwi * dw;
    const bool ok = k < K && unsigned(hi) < unsigned(h) && unsigned(wi) < unsigned(w_);
    ra = load4(x + (ok ? a_base + (hi * w_ + wi) * cin + coff + c : 0), ok);
    rb = load4(w + (b_row >= 0 && k < K ? b_row + k : 0), b_row >= 0 && k < K);
  }
  __device__ void store(Smem& s, int buf) const {
    store_kt(s.a[buf], k_off, m_col, ra);
    store_kt(s.b[buf], k_off, m_col, rb);
  }
};

struct DataLoader {
  const float* dy;
  const float* w;
  FastDiv coutg, kw, sh, sw;
  int K, dh, dw, ho, wo, cout, cg, taps;
  int m_col, k_off;             // A: its dx pixel column and k offset
  int a_base, a_hp, a_wp;       // n*Ho*Wo*Cout + g*Coutg, h + p, w + p
  int b_k, b_n, b_ci, b_row0;   // B: k row, column (4 wide), first input channel or -1, g*Coutg
  float4 ra, rb;
  __device__ void load(int kt) {
    {
      const int k = kt * kBK + k_off;
      int tap, co, kh, kwi;
      coutg.divmod(min(k, K), tap, co);
      kw.divmod(tap, kh, kwi);
      int th = a_hp - kh * dh, tw = a_wp - kwi * dw, rh, rw;
      bool ok = k < K && th >= 0 && tw >= 0;
      sh.divmod(max(th, 0), th, rh);
      sw.divmod(max(tw, 0), tw, rw);
      ok = ok && rh == 0 && rw == 0 && th < ho && tw < wo;
      ra = load4(dy + (ok ? a_base + (th * wo + tw) * cout + co : 0), ok);
    }
    {
      const int k = kt * kBK + b_k;
      const bool ok = b_ci >= 0 && k < K;
      int tap, co;
      coutg.divmod(min(k, K), tap, co);
      rb = load4(w + (ok ? ((b_row0 + co) * taps + tap) * cg + b_ci : 0), ok);
    }
  }
  __device__ void store(Smem& s, int buf) const {
    store_kt(s.a[buf], k_off, m_col, ra);
    store_row(s.b[buf], b_k, b_n, rb);
  }
};

struct WeightLoader {
  const float* x;
  const float* dy;
  FastDiv wo, ho;
  int p_begin, p_end, h, w, cin, cout, sh, sw;
  int k_row, col;          // A and B: this thread's k row (pixel) and first column (4 wide)
  int a_off;               // g*Coutg + co, or -1
  int b_off, b_dh, b_dw;   // g*Cg + ci (or -1), kh*d - p, kw*d - p
  float4 ra, rb;
  __device__ void load(int kt) {
    const int p = p_begin + kt * kBK + k_row;
    const bool p_ok = p < p_end;
    ra = load4(dy + (p_ok && a_off >= 0 ? p * cout + a_off : 0), p_ok && a_off >= 0);
    int t, wq, n, hq;
    wo.divmod(min(p, p_end), t, wq);
    ho.divmod(t, n, hq);
    const int hi = hq * sh + b_dh, wi = wq * sw + b_dw;
    const bool ok = p_ok && b_off >= 0 && unsigned(hi) < unsigned(h) && unsigned(wi) < unsigned(w);
    rb = load4(x + (ok ? ((n * h + hi) * w + wi) * cin + b_off : 0), ok);
  }
  __device__ void store(Smem& s, int buf) const {
    store_row(s.a[buf], k_row, col, ra);
    store_row(s.b[buf], k_row, col, rb);
  }
};

// acc[i][j]: row (i < 4 ? ty*4 + i : 64 + ty*4 + i - 4), column likewise with tx.
template <typename Loader>
__device__ __forceinline__ void simt_mainloop(Loader& ld, int k_tiles, Smem& s, float (&acc)[8][8]) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
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
      const float4 a1 = *reinterpret_cast<const float4*>(&s.a[buf][k][64 + ty * 4]);
      const float4 b0 = *reinterpret_cast<const float4*>(&s.b[buf][k][tx * 4]);
      const float4 b1 = *reinterpret_cast<const float4*>(&s.b[buf][k][64 + tx * 4]);
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
template <typename Store>
__device__ __forceinline__ void simt_epilogue(const float (&acc)[8][8], Store&& store) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int jh = 0; jh < 2; jh++)
      store(i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4, jh * 64 + tx * 4,
            make_float4(acc[i][4 * jh], acc[i][4 * jh + 1], acc[i][4 * jh + 2], acc[i][4 * jh + 3]));
}

__global__ void __launch_bounds__(kThreads) simt_forward_kernel(const FastDims f, const float* __restrict__ x,
                                                                const float* __restrict__ w,
                                                                const float* __restrict__ bias, float* __restrict__ y,
                                                                int n_tiles) {
  __shared__ __align__(16) Smem s;
  const Dims& d = f.d;
  const int M = d.n * d.ho * d.wo, K = d.kh * d.kw * d.cg;
  const int m0 = int(blockIdx.x) / n_tiles * kBM, n0 = int(blockIdx.x) % n_tiles * kBN, grp = int(blockIdx.y);
  ForwardLoader ld;
  ld.x = x, ld.w = w, ld.cg = f.cg, ld.kw = f.kw, ld.K = K, ld.dh = d.dh, ld.dw = d.dw, ld.h = d.h, ld.w_ = d.w;
  ld.cin = d.cin, ld.coff = grp * d.cg;
  ld.m_col = int(threadIdx.x) / 2, ld.k_off = (int(threadIdx.x) % 2) * 4;
  const int m = m0 + ld.m_col;
  if (m < M) {
    int t, wo, n, ho;
    f.wo.divmod(m, t, wo);
    f.ho.divmod(t, n, ho);
    ld.a_base = n * d.h * d.w * d.cin, ld.a_hb = ho * d.sh - d.ph, ld.a_wb = wo * d.sw - d.pw;
  } else {
    ld.a_base = 0, ld.a_hb = kFarAway, ld.a_wb = kFarAway;
  }
  const int co = n0 + ld.m_col;
  ld.b_row = co < d.coutg ? (grp * d.coutg + co) * K : -1;
  float acc[8][8];
  simt_mainloop(ld, (K + kBK - 1) / kBK, s, acc);
  simt_epilogue(acc, [&](int r, int c, float4 v) {
    const int mm = m0 + r, cc = n0 + c;
    if (mm >= M || cc >= d.coutg) return;
    const int oc = grp * d.coutg + cc;
    if (bias) v.x += bias[oc], v.y += bias[oc + 1], v.z += bias[oc + 2], v.w += bias[oc + 3];
    *reinterpret_cast<float4*>(y + int64_t(mm) * d.cout + oc) = v;
  });
}

__global__ void __launch_bounds__(kThreads) simt_data_kernel(const FastDims f, const float* __restrict__ dy,
                                                             const float* __restrict__ w, float* __restrict__ dx,
                                                             int n_tiles) {
  __shared__ __align__(16) Smem s;
  const Dims& d = f.d;
  const int M = d.n * d.h * d.w, K = d.kh * d.kw * d.coutg;
  const int m0 = int(blockIdx.x) / n_tiles * kBM, n0 = int(blockIdx.x) % n_tiles * kBN, grp = int(blockIdx.y);
  DataLoader ld;
  ld.dy = dy, ld.w = w, ld.coutg = f.coutg, ld.kw = f.kw, ld.sh = f.sh, ld.sw = f.sw, ld.K = K, ld.dh = d.dh;
  ld.dw = d.dw, ld.ho = d.ho, ld.wo = d.wo, ld.cout = d.cout, ld.cg = d.cg, ld.taps = d.kh * d.kw;
  ld.m_col = int(threadIdx.x) / 2, ld.k_off = (int(threadIdx.x) % 2) * 4;
  const int m = m0 + ld.m_col;
  if (m < M) {
    int t, wx, n, hx;
    f.w.divmod(m, t, wx);
    f.h.divmod(t, n, hx);
    ld.a_base = n * d.ho * d.wo * d.cout + grp * d.coutg, ld.a_hp = hx + d.ph, ld.a_wp = wx + d.pw;
  } else {
    ld.a_base = 0, ld.a_hp = kFarAway, ld.a_wp = kFarAway;
  }
  ld.b_k = int(threadIdx.x) / 32, ld.b_n = (int(threadIdx.x) % 32) * 4;
  ld.b_ci = n0 + ld.b_n < d.cg ? n0 + ld.b_n : -1;
  ld.b_row0 = grp * d.coutg;
  float acc[8][8];
  simt_mainloop(ld, (K + kBK - 1) / kBK, s, acc);
  simt_epilogue(acc, [&](int r, int c, float4 v) {
    const int mm = m0 + r, ci = n0 + c;
    if (mm < M && ci < d.cg) *reinterpret_cast<float4*>(dx + int64_t(mm) * d.cin + grp * d.cg + ci) = v;
  });
}

__global__ void __launch_bounds__(kThreads) simt_weight_kernel(const FastDims f, const float* __restrict__ x,
                                                               const float* __restrict__ dy, float* __restrict__ out,
                                                               int n_tiles, int per_split) {
  __shared__ __align__(16) Smem s;
  const Dims& d = f.d;
  const int P = d.n * d.ho * d.wo, KW = d.kh * d.kw * d.cg;
  const int m0 = int(blockIdx.x) / n_tiles * kBM, n0 = int(blockIdx.x) % n_tiles * kBN;
  const int grp = int(blockIdx.y), split = int(blockIdx.z);
  WeightLoader ld;
  ld.x = x, ld.dy = dy, ld.wo = f.wo, ld.ho = f.ho, ld.h = d.h, ld.w = d.w, ld.cin = d.cin, ld.cout = d.cout;
  ld.sh = d.sh, ld.sw = d.sw;
  ld.p_begin = min(P, split * per_split), ld.p_end = min(P, ld.p_begin + per_split);
  ld.k_row = int(threadIdx.x) / 32, ld.col = (int(threadIdx.x) % 32) * 4;
  const int co = m0 + ld.col, j = n0 + ld.col;
  ld.a_off = co < d.coutg ? grp * d.coutg + co : -1;
  int tap, ci, kh, kwi;
  f.cg.divmod(j, tap, ci);
  f.kw.divmod(tap, kh, kwi);
  ld.b_off = j < KW ? grp * d.cg + ci : -1;
  ld.b_dh = kh * d.dh - d.ph, ld.b_dw = kwi * d.dw - d.pw;
  float acc[8][8];
  simt_mainloop(ld, (ld.p_end - ld.p_begin + kBK - 1) / kBK, s, acc);
  float* o = out + int64_t(split) * d.cout * KW;
  simt_epilogue(acc, [&](int r, int c, float4 v) {
    const int mm = m0 + r, nn = n0 + c;
    if (mm < d.coutg && nn < KW) *reinterpret_cast<float4*>(o + int64_t(grp * d.coutg + mm) * KW + nn) = v;
  });
}

}  // namespace

void simt_forward(const Dims& d, const float* x, const float* w, const float* bias, float* y) {
  const int64_t M = int64_t(d.n) * d.ho * d.wo;
  if (M == 0 || d.cout == 0) return;
  const int n_tiles = (d.coutg + kBN - 1) / kBN;
  const dim3 grid(unsigned((M + kBM - 1) / kBM * n_tiles), unsigned(d.groups));
  simt_forward_kernel<<<grid, kThreads, 0, engine::cuda::stream()>>>(FastDims(d), x, w, bias, y, n_tiles);
  ENGINE_CUDA_LAUNCH_CHECK("conv2d (f32 implicit GEMM forward)");
}

void simt_data(const Dims& d, const float* dy, const float* w, float* dx) {
  const int64_t M = int64_t(d.n) * d.h * d.w;
  if (M == 0 || d.cin == 0) return;
  const int n_tiles = (d.cg + kBN - 1) / kBN;
  const dim3 grid(unsigned((M + kBM - 1) / kBM * n_tiles), unsigned(d.groups));
  simt_data_kernel<<<grid, kThreads, 0, engine::cuda::stream()>>>(FastDims(d), dy, w, dx, n_tiles);
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_data (f32 implicit GEMM)");
}

void simt_weight(const Dims& d, const float* x, const float* dy, float* dw, float* ws, int splits) {
  const int64_t count = int64_t(d.cout) * d.kh * d.kw * d.cg;
  if (count == 0) return;
  if (ws == nullptr) splits = 1;
  const int64_t P = int64_t(d.n) * d.ho * d.wo;
  const int per_split = int(std::max<int64_t>(1, (P + splits - 1) / splits));
  const int m_tiles = (d.coutg + kBM - 1) / kBM, n_tiles = (d.kh * d.kw * d.cg + kBN - 1) / kBN;
  const dim3 grid(unsigned(m_tiles * n_tiles), unsigned(d.groups), unsigned(splits));
  simt_weight_kernel<<<grid, kThreads, 0, engine::cuda::stream()>>>(FastDims(d), x, dy, splits > 1 ? ws : dw,
                                                                    n_tiles, per_split);
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_weight (f32 implicit GEMM)");
  if (splits > 1) weight_grad_finalize(engine::DType::f32, ws, splits, count, dw);
}

}  // namespace ops::cuda::conv
