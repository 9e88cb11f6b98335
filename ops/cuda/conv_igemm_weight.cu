// cuda/conv_igemm_weight.cu: the convolution's weight gradient as an implicit GEMM on tensor cores
// (bf16/f16, or f32 as TF32; f32 accumulate; main loop and tiling in conv_igemm.cuh):
//   M = Cout/g, N = KH*KW*Cin/g ordered (kh, kw, ci) as the KRSC weight, K = the N*Ho*Wo output pixels,
//   A[co, p] = dy[p, g*Coutg + co],   B[p, (kh, kw, ci)] = x[n, ho*s - p + kh*d, wo*s - p + kw*d, g*Cg + ci]
//   (zero outside the image). Both are staged [k][m] / [k][n] (pixel rows, contiguous in channels) and read
//   with ldmatrix.trans (TF32: one word per lane). A thread's chunk column is fixed, so its (kh, kw, ci) is
//   decoded once; per K-slice it decodes its pixel rows' (n, ho, wo), shared by its A and B copies.
// Split-K: the pixels are cut into `splits` equal ranges (blockIdx.z); with splits > 1 each range writes its
// f32 partial tile to ws[split] and weight_grad_finalize adds them in split order (deterministic, no
// atomics); with one split the tile is rounded to T and stored in dw directly.
// Grid: (M-tiles x N-tiles, groups, splits). Bound: the tensor cores, once the splits fill the SMs.
#include "ops/cuda/conv_igemm_tma.cuh"

namespace ops::cuda::conv::igemm {

namespace {

template <typename Cfg, bool kGather>
struct WeightLoader {
  static constexpr int BK = Cfg::BK, kVec = Cfg::kVec;
  static constexpr int kAChunks = Cfg::BM / kVec, kARowStep = Cfg::kLoadThreads / kAChunks, kAPasses = BK / kARowStep;
  static constexpr int kBChunks = Cfg::BN / kVec, kBRowStep = Cfg::kLoadThreads / kBChunks, kBPasses = BK / kBRowStep;
  using Elem = typename Cfg::Elem;
  const Elem* x;
  const Elem* dy;
  FastDiv wo, ho;
  int p_begin, p_end, h, w, cin, cout, sh, sw;
  int a_ch, a_r0, b_ch, b_r0;  // chunk columns and first rows of the A and B copies
  int a_off;                   // g*Coutg + co of this thread's A chunk, or -1 past Cout/g
  int b_off[kGather ? kVec : 1];  // g*Cg + ci of this thread's B chunk (per element when gathering), -1 past the end
  int b_dh[kGather ? kVec : 1], b_dw[kGather ? kVec : 1];  // kh*d - p, kw*d - p of the same

  __device__ void load(uint16_t* sA, uint16_t* sB, int kt) const {
#pragma unroll
    for (int i = 0; i < kAPasses; i++) {
      const int row = a_r0 + kARowStep * i, p = p_begin + kt * BK + row;
      const bool ok = p < p_end && a_off >= 0;
      cp_async16(smem_addr(sA + kn_chunk<Cfg, Cfg::BM>(row, a_ch)), ok ? dy + p * cout + a_off : dy, ok);
    }
#pragma unroll
    for (int i = 0; i < kBPasses; i++) {
      const int row = b_r0 + kBRowStep * i, p = p_begin + kt * BK + row;
      int t, wq, n, hq;
      wo.divmod(min(p, p_end), t, wq);
      ho.divmod(t, n, hq);
      const int base = n * h, hb = hq * sh, wb = wq * sw;
      if constexpr (!kGather) {
        const int hi = hb + b_dh[0], wi = wb + b_dw[0];
        const bool ok = p < p_end && b_off[0] >= 0 && unsigned(hi) < unsigned(h) && unsigned(wi) < unsigned(w);
        cp_async16(smem_addr(sB + kn_chunk<Cfg, Cfg::BN>(row, b_ch)),
                   ok ? x + ((base + hi) * w + wi) * cin + b_off[0] : x, ok);
      } else {
        Elem v[kVec];
#pragma unroll
        for (int e = 0; e < kVec; e++) {
          const int hi = hb + b_dh[e], wi = wb + b_dw[e];
          const bool ok = p < p_end && b_off[e] >= 0 && unsigned(hi) < unsigned(h) && unsigned(wi) < unsigned(w);
          v[e] = ok ? x[((base + hi) * w + wi) * cin + b_off[e]] : Elem(0);
        }
        store_chunk(sB + kn_chunk<Cfg, Cfg::BN>(row, b_ch), v);
      }
    }
  }
};

template <typename Cfg, typename T, typename Out, bool kGather>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    weight_kernel(const FastDims f, const typename Cfg::Elem* __restrict__ x, const typename Cfg::Elem* __restrict__ dy,
                  Out* __restrict__ out, int n_tiles, int per_split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) uint16_t smem[];
  const Dims& d = f.d;
  const int P = d.n * d.ho * d.wo, KW = d.kh * d.kw * d.cg;  // GEMM K, and N (the filter length)
  const int m0 = int(blockIdx.x) / n_tiles * Cfg::BM, n0 = int(blockIdx.x) % n_tiles * Cfg::BN;
  const int grp = int(blockIdx.y), split = int(blockIdx.z);
  using Loader = WeightLoader<Cfg, kGather>;
  Loader ld;
  ld.x = x, ld.dy = dy, ld.wo = f.wo, ld.ho = f.ho, ld.h = d.h, ld.w = d.w, ld.cin = d.cin, ld.cout = d.cout;
  ld.sh = d.sh, ld.sw = d.sw;
  ld.p_begin = min(P, split * per_split), ld.p_end = min(P, ld.p_begin + per_split);
  ld.a_ch = int(threadIdx.x) % Loader::kAChunks, ld.a_r0 = int(threadIdx.x) / Loader::kAChunks;
  ld.b_ch = int(threadIdx.x) % Loader::kBChunks, ld.b_r0 = int(threadIdx.x) / Loader::kBChunks;
  const int co = m0 + ld.a_ch * Cfg::kVec;
  ld.a_off = co < d.coutg ? grp * d.coutg + co : -1;
#pragma unroll
  for (int e = 0; e < (kGather ? Cfg::kVec : 1); e++) {
    const int j = n0 + ld.b_ch * Cfg::kVec + e;
    int tap, ci, kh, kwi;
    f.cg.divmod(j, tap, ci);
    f.kw.divmod(tap, kh, kwi);
    ld.b_off[e] = j < KW ? grp * d.cg + ci : -1;
    ld.b_dh[e] = kh * d.dh - d.ph, ld.b_dw[e] = kwi * d.dw - d.pw;
  }
  Out* o = out + int64_t(split) * d.cout * KW;
  const int k_tiles = (ld.p_end - ld.p_begin + Cfg::BK - 1) / Cfg::BK;
  gemm_tile<Cfg, T, true, true>(ld, k_tiles, smem, [&](int r, int c, float v0, float v1) {
    const int m = m0 + r, n = n0 + c;
    if (m >= d.coutg || n >= KW) return;
    Out* p = o + int64_t(grp * d.coutg + m) * KW + n;
    if constexpr (kGather) store_two(p, v0, v1, n + 1 < KW);  // odd rows: pairs are not aligned
    else store_pair(p, v0, v1);
  });
#endif
}

template <typename Cfg, typename T, typename Out, bool kGather>
void launch_weight(const Dims& d, const void* x, const void* dy, Out* out, int splits) {
  auto kernel = weight_kernel<Cfg, T, Out, kGather>;
  static const bool configured = set_smem_limit(kernel, Cfg::kSmemBytes);  // once per launcher
  (void)configured;
  const int64_t P = int64_t(d.n) * d.ho * d.wo;
  const int per_split = int(std::max<int64_t>(1, (P + splits - 1) / splits));
  const int m_tiles = (d.coutg + Cfg::BM - 1) / Cfg::BM, n_tiles = (d.kh * d.kw * d.cg + Cfg::BN - 1) / Cfg::BN;
  const dim3 grid(unsigned(m_tiles * n_tiles), unsigned(d.groups), unsigned(splits));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, engine::cuda::stream()>>>(
      FastDims(d), static_cast<const typename Cfg::Elem*>(x), static_cast<const typename Cfg::Elem*>(dy), out, n_tiles,
      per_split);
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_weight (implicit GEMM)");
}

template <typename Cfg, typename T, bool kGather>
void dispatch_out(const Dims& d, const void* x, const void* dy, void* dw, float* ws, int splits) {
  if (splits > 1) launch_weight<Cfg, T, float, kGather>(d, x, dy, ws, splits);
  else launch_weight<Cfg, T, T, kGather>(d, x, dy, static_cast<T*>(dw), 1);
}

// The Hopper weight gradient for one group whose Cin is a multiple of 64 (tma_ws_gemm_tile, both operands MN-major):
// K-slice kt is the 64 output pixels from p_begin + 64 kt; A's panels are boxes of dy [P, Cout] (64 channels x 64
// pixels each), B's 64-column panel j is one im2col copy of x: tap (n0 + 64 j) / Cin, channels from (n0 + 64 j) % Cin,
// at those 64 pixels. A split's pixel range is a multiple of 64, so no slice reads the next split's pixels; past the
// last pixel both copies read zeros. Only the producer lane computes coordinates.
template <typename Cfg, typename T, typename Out>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    weight_im2col_kernel(const FastDims f, Out* __restrict__ out, int n_tiles, int per_split,
                         const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap dymap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint16_t smem[];
  const Dims& d = f.d;
  const int P = d.n * d.ho * d.wo, KW = d.kh * d.kw * d.cin;  // GEMM K, and N (the filter length)
  const int m0 = int(blockIdx.x) / n_tiles * Cfg::BM, n0 = int(blockIdx.x) % n_tiles * Cfg::BN;
  const int split = int(blockIdx.z);
  const int p_begin = min(P, split * per_split), p_end = min(P, p_begin + per_split);
  auto produce = [&](int kt, uint32_t a, uint32_t b, uint32_t bar) {
    const int p = p_begin + kt * Cfg::BK;
#pragma unroll
    for (int j = 0; j < Cfg::BM / 64; j++) wgmma::tma_load_2d(a + j * kPanelBytes, &dymap, m0 + 64 * j, p, bar);
    int t, wo, n, ho;
    f.wo.divmod(p, t, wo);
    f.ho.divmod(t, n, ho);
    const int wb = wo * d.sw - d.pw, hb = ho * d.sh - d.ph;
#pragma unroll
    for (int j = 0; j < Cfg::BN / 64; j++) {
      int tap, ci, kh, kwi;
      f.cg.divmod(n0 + 64 * j, tap, ci);
      f.kw.divmod(tap, kh, kwi);
      wgmma::tma_load_im2col_4d(b + j * kPanelBytes, &xmap, ci, wb, hb, n, uint16_t(kwi * d.dw), uint16_t(kh * d.dh),
                                bar);
    }
  };
  Out* o = out + int64_t(split) * d.cout * KW;
  const int k_tiles = (p_end - p_begin + Cfg::BK - 1) / Cfg::BK;
  tma_ws_gemm_tile<Cfg, T, true, true>(produce, k_tiles, smem, [&](int r, int c, float v0, float v1) {
    const int m = m0 + r, n = n0 + c;
    if (m >= d.cout || n >= KW) return;
    store_pair(o + int64_t(m) * KW + n, v0, v1);
  });
#endif
}

// False (nothing launched) when the im2col map cannot describe the geometry.
template <typename Cfg, typename T, typename Out>
bool launch_weight_im2col(const Dims& d, const void* x, const void* dy, Out* out, int splits) {
  CUtensorMap xmap;
  if (!x_im2col_map<T>(&xmap, x, d, Cfg::BK)) return false;
  const int64_t P = int64_t(d.n) * d.ho * d.wo;
  const CUtensorMap dymap = k128_tile_map<T>(dy, P, d.cout, Cfg::BK);  // [P, Cout] in boxes of 64 x 64
  auto kernel = weight_im2col_kernel<Cfg, T, Out>;
  static const bool configured = set_smem_limit(kernel, Cfg::kSmemBytes);
  (void)configured;
  const int64_t per_split = ((P + splits - 1) / splits + Cfg::BK - 1) / Cfg::BK * Cfg::BK;
  const int m_tiles = (d.cout + Cfg::BM - 1) / Cfg::BM, n_tiles = (d.kh * d.kw * d.cin + Cfg::BN - 1) / Cfg::BN;
  const dim3 grid(unsigned(m_tiles * n_tiles), 1, unsigned(splits));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, engine::cuda::stream()>>>(FastDims(d), out, n_tiles, int(per_split),
                                                                           xmap, dymap);
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_weight (implicit GEMM, im2col bulk copies)");
  count_igemm_im2col_launch();
  return true;
}

// Cout/g <= 64: 64-row tiles (a 128-row tile would be half zeros). On Hopper, 16-bit types with Cout/g and the
// filter length > 64 run the wgmma tile wgmma_shape picks for Cout/g x the filter length over groups x pieces:
// 128 x 128, 128 x 256 or 256 x 128 (both operands in its M- and N-major panels).
template <typename T, bool kGather>
void dispatch_weight(const Dims& d, const void* x, const void* dy, void* dw, float* ws, int splits) {
  if constexpr (!std::is_same_v<T, float>) {
    const int n = d.kh * d.kw * d.cg;
    if (igemm_wgmma() && d.coutg > 64 && n > 64) {
      const WgShape shape = wgmma_shape(d.coutg, n, int64_t(d.groups) * splits);
      if (!kGather && igemm_im2col() && d.groups == 1 && d.cin % 64 == 0) {
        bool launched = false;
        with_tma_ws_tile(shape, [&](auto cfg) {
          using Cfg = decltype(cfg);
          launched = splits > 1 ? launch_weight_im2col<Cfg, T, float>(d, x, dy, ws, splits)
                                : launch_weight_im2col<Cfg, T, T>(d, x, dy, static_cast<T*>(dw), 1);
        });
        if (launched) return;
      }
      with_wgmma_tile(shape, [&](auto cfg) { dispatch_out<decltype(cfg), T, kGather>(d, x, dy, dw, ws, splits); });
      return;
    }
  }
  if (d.coutg <= 64) dispatch_out<TileOf<T, 64, 128>, T, kGather>(d, x, dy, dw, ws, splits);
  else if (wide_warps_64x64(std::is_same_v<T, float>))
    dispatch_out<TileOf<T, 128, 128, 64>, T, kGather>(d, x, dy, dw, ws, splits);
  else dispatch_out<TileOf<T, 128, 128>, T, kGather>(d, x, dy, dw, ws, splits);
}

}  // namespace

}  // namespace ops::cuda::conv::igemm

namespace ops::cuda::conv {

void igemm_weight(const Dims& d, engine::DType t, const void* x, const void* dy, void* dw, float* ws, int splits) {
  const int64_t count = int64_t(d.cout) * d.kh * d.kw * d.cg;
  if (count == 0) return;
  ENGINE_CHECK(d.groups <= 65535, "conv2d_backward_weight: at most 65535 groups on the GPU, got ", d.groups);
  if (ws == nullptr) splits = 1;
  igemm::with_elem_and_gather(t, d.cg, [&](auto elem, auto gather) {
    igemm::dispatch_weight<decltype(elem), decltype(gather)::value>(d, x, dy, dw, ws, splits);
  });
  if (splits > 1) weight_grad_finalize(t, ws, splits, count, dw);
}

}  // namespace ops::cuda::conv
