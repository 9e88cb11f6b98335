// cuda/conv_igemm_fwd.cu: the convolution forward as an implicit GEMM on tensor cores (bf16/f16, or f32 as
// TF32; f32 accumulate; main loop and tiling in conv_igemm.cuh):
//   M = N*Ho*Wo output pixels, N = Cout/g, K = KH*KW*Cin/g ordered (kh, kw, c) as the KRSC weight,
//   A[m, k] = x[n, ho*s - p + kh*d, wo*s - p + kw*d, g*Cg + c] (zero outside the image), B[k, co] = w[g*Coutg + co, k].
// A is staged [m][k] and B [n][k] (the weight's rows): both contiguous in k, kVec channels per cp.async.
// A thread gathers the same A rows (output pixels) for every K-slice, so their (n, ho, wo) are decoded
// once; per slice it decodes its one chunk's (kh, kw, c).
// kGather (Cin/g not a multiple of kVec, e.g. the 3-channel stem): the kVec elements of a chunk may straddle
// taps, so they are loaded one by one (each with its own tap and bounds) and stored to shared memory as one
// 16-byte vector; the weight rows (length K, not a multiple of kVec) likewise.
// Grid: one block per output tile (N-tiles fastest, so consecutive blocks share their x rows in L2),
// blockIdx.y = group. Epilogue: + bias, rounded to T, stored as pairs from the accumulators.
// Tiles: 16-bit types on Hopper with Cout/g > 64 run wgmma tiles of 128 x 128, 128 x 256 or 256 x 128
// (wgmma_shape; Cout/g = 64: the mma.sync 128 x 64 tile, H200 2026-12-04: 232 TFLOP/s vs 200-228 for wgmma's
// 128 x 64), else the mma.sync tiles.
// Bound: the tensor cores when K >= ~256 (3x3 and larger with >= 32 channels); else the x gather.
#include "ops/cuda/conv_igemm_tma.cuh"

namespace ops::cuda::conv::igemm {

namespace {

template <typename Cfg, bool kGather>
struct ForwardLoader {
  static constexpr bool kTmaB = Cfg::kTma && !kGather;  // the weight tile by the bulk tensor copy (tma_b)
  static_assert(!kTmaB || Cfg::kWgmma, "the bulk tensor copy feeds the wgmma tiles");
  static constexpr int kRowStep = Cfg::kLoadThreads / 8;  // rows per pass over a [rows][BK] tile (8 chunks a row)
  static constexpr int kAPasses = Cfg::BM / kRowStep, kBPasses = Cfg::BN / kRowStep;
  static constexpr int BK = Cfg::BK, kVec = Cfg::kVec;
  using Elem = typename Cfg::Elem;
  const Elem* x;
  const Elem* w;
  FastDiv cg, kw;
  int K, dh, dw, h, w_, cin, coff;  // coff: the group's first input channel
  int ch, r0;                       // this thread's chunk column and first row (rows kRowStep apart)
  int a_base[kAPasses], a_hb[kAPasses], a_wb[kAPasses];  // per A row: n*H*W*Cin, ho*s - p, wo*s - p
  int b_off[kBPasses];              // per B row: offset of the weight row, or -1 past Cout/g
  const CUtensorMap* tmap;          // kTmaB: the weight as [Cout, K]
  int b_row0;                       // kTmaB: the tile's first weight row, g * Cout/g + n0

  // Slice kt's [BN][BK] weight tile into dst (rows past Cout/g may hold the next group's weights: their outputs are
  // never stored; k past K reads zeros).
  __device__ void tma_b(uint32_t dst, uint32_t bar, int kt) const {
    wgmma::tma_load_2d(dst, tmap, kt * BK, b_row0, bar);
  }

  __device__ void load(uint16_t* sA, uint16_t* sB, int kt) const {
    const int k = kt * BK + ch * kVec;
    if constexpr (!kGather) {
      const bool k_ok = k < K;
      int tap, c, kh, kwi;
      cg.divmod(k, tap, c);
      kw.divmod(tap, kh, kwi);
      const int dho = kh * dh, dwo = kwi * dw;
#pragma unroll
      for (int i = 0; i < kAPasses; i++) {
        const int hi = a_hb[i] + dho, wi = a_wb[i] + dwo;
        const bool ok = k_ok && unsigned(hi) < unsigned(h) && unsigned(wi) < unsigned(w_);
        const Elem* src = ok ? x + a_base[i] + (hi * w_ + wi) * cin + coff + c : x;
        cp_async16(smem_addr(sA + tile_chunk<Cfg, BK, false>(r0 + kRowStep * i, ch)), src, ok);
      }
#pragma unroll
      for (int i = 0; i < (kTmaB ? 0 : kBPasses); i++) {
        const bool ok = k_ok && b_off[i] >= 0;
        cp_async16(smem_addr(sB + tile_chunk<Cfg, BK, false>(r0 + kRowStep * i, ch)), ok ? w + b_off[i] + k : w, ok);
      }
    } else {
      // The chunk's kVec taps/channels, decoded once for all rows.
      int e_dh[kVec], e_dw[kVec], e_c[kVec];
      int tap, c, kh, kwi;
      cg.divmod(min(k, K), tap, c);
      kw.divmod(tap, kh, kwi);
#pragma unroll
      for (int e = 0; e < kVec; e++) {
        const bool ok = k + e < K;
        e_dh[e] = ok ? kh * dh : kFarAway, e_dw[e] = kwi * dw, e_c[e] = c;
        if (++c == int(cg.d)) {
          c = 0;
          if (++kwi == int(kw.d)) kwi = 0, kh++;
        }
      }
#pragma unroll
      for (int i = 0; i < kAPasses; i++) {
        Elem v[kVec];
#pragma unroll
        for (int e = 0; e < kVec; e++) {
          const int hi = a_hb[i] + e_dh[e], wi = a_wb[i] + e_dw[e];
          const bool ok = unsigned(hi) < unsigned(h) && unsigned(wi) < unsigned(w_);
          v[e] = ok ? x[a_base[i] + (hi * w_ + wi) * cin + coff + e_c[e]] : Elem(0);
        }
        store_chunk(sA + tile_chunk<Cfg, BK, false>(r0 + kRowStep * i, ch), v);
      }
#pragma unroll
      for (int i = 0; i < kBPasses; i++) {
        Elem v[kVec];
#pragma unroll
        for (int e = 0; e < kVec; e++) v[e] = b_off[i] >= 0 && k + e < K ? w[b_off[i] + k + e] : Elem(0);
        store_chunk(sB + tile_chunk<Cfg, BK, false>(r0 + kRowStep * i, ch), v);
      }
    }
  }
};

template <typename Cfg, typename T, bool kGather>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    forward_kernel(const FastDims f, const typename Cfg::Elem* __restrict__ x, const typename Cfg::Elem* __restrict__ w,
                   const T* __restrict__ bias, T* __restrict__ y, int n_tiles,
                   const __grid_constant__ CUtensorMap tmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) uint16_t smem[];
  const Dims& d = f.d;
  const int M = d.n * d.ho * d.wo, K = d.kh * d.kw * d.cg;
  const int m0 = int(blockIdx.x) / n_tiles * Cfg::BM, n0 = int(blockIdx.x) % n_tiles * Cfg::BN;
  const int grp = int(blockIdx.y);
  using Loader = ForwardLoader<Cfg, kGather>;
  Loader ld;
  ld.x = x, ld.w = w, ld.cg = f.cg, ld.kw = f.kw, ld.K = K, ld.dh = d.dh, ld.dw = d.dw, ld.h = d.h, ld.w_ = d.w;
  ld.cin = d.cin, ld.coff = grp * d.cg;
  ld.ch = int(threadIdx.x) % 8, ld.r0 = int(threadIdx.x) / 8;
#pragma unroll
  for (int i = 0; i < Loader::kAPasses; i++) {
    const int m = m0 + ld.r0 + Loader::kRowStep * i;
    if (m < M) {
      int t, wo, n, ho;
      f.wo.divmod(m, t, wo);
      f.ho.divmod(t, n, ho);
      ld.a_base[i] = n * d.h * d.w * d.cin;
      ld.a_hb[i] = ho * d.sh - d.ph;
      ld.a_wb[i] = wo * d.sw - d.pw;
    } else {
      ld.a_base[i] = 0, ld.a_hb[i] = kFarAway, ld.a_wb[i] = kFarAway;
    }
  }
#pragma unroll
  for (int i = 0; i < Loader::kBPasses; i++) {
    const int co = n0 + ld.r0 + Loader::kRowStep * i;
    ld.b_off[i] = co < d.coutg ? (grp * d.coutg + co) * K : -1;
  }
  ld.tmap = &tmap, ld.b_row0 = grp * d.coutg + n0;
  gemm_tile<Cfg, T, false, false>(ld, (K + Cfg::BK - 1) / Cfg::BK, smem, [&](int r, int c, float v0, float v1) {
    const int m = m0 + r, co = n0 + c;
    if (m >= M || co >= d.coutg) return;
    const int oc = grp * d.coutg + co;
    if (bias) v0 += to_float(bias[oc]), v1 += to_float(bias[oc + 1]);
    store_pair(y + int64_t(m) * d.cout + oc, v0, v1);
  });
#endif
}

template <typename Cfg, typename T, bool kGather>
void launch_forward(const Dims& d, const void* x, const void* w, const void* bias, void* y) {
  auto kernel = forward_kernel<Cfg, T, kGather>;
  static const bool configured = set_smem_limit(kernel, Cfg::kSmemBytes);  // once per launcher
  (void)configured;
  const int64_t M = int64_t(d.n) * d.ho * d.wo;
  const int m_tiles = int((M + Cfg::BM - 1) / Cfg::BM), n_tiles = (d.coutg + Cfg::BN - 1) / Cfg::BN;
  const dim3 grid(unsigned(int64_t(m_tiles) * n_tiles), unsigned(d.groups));
  CUtensorMap tmap{};
  if constexpr (Cfg::kTma && !kGather) tmap = k128_tile_map<T>(w, d.cout, int64_t(d.kh) * d.kw * d.cg, Cfg::BN);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, engine::cuda::stream()>>>(
      FastDims(d), static_cast<const typename Cfg::Elem*>(x), static_cast<const typename Cfg::Elem*>(w),
      static_cast<const T*>(bias), static_cast<T*>(y), n_tiles, tmap);
  ENGINE_CUDA_LAUNCH_CHECK("conv2d (implicit GEMM forward)");
}

// The Hopper forward for one group whose Cin is a multiple of 64 (tma_ws_gemm_tile): K-slice kt is tap
// kt / (Cin / 64) and channels 64 (kt % (Cin / 64)) .., so the A tile is one im2col copy of x (the block's BM output
// pixels at that tap, zeros in the padding and past the last image) and the B tile the weight's [BN][64] box at
// k = 64 kt (k128_tile_map, as the cp.async kernels' TMA). Only the producer lane computes coordinates.
template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    forward_im2col_kernel(const FastDims f, const T* __restrict__ bias, T* __restrict__ y, int n_tiles,
                          const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint16_t smem[];
  const Dims& d = f.d;
  const int M = d.n * d.ho * d.wo, K = d.kh * d.kw * d.cin, cblocks = d.cin / 64;
  const int m0 = int(blockIdx.x) / n_tiles * Cfg::BM, n0 = int(blockIdx.x) % n_tiles * Cfg::BN;
  int t, wo, n, ho;  // the tile's first output pixel (the copy's rows past the last image read zeros)
  f.wo.divmod(m0, t, wo);
  f.ho.divmod(t, n, ho);
  const int w0 = wo * d.sw - d.pw, h0 = ho * d.sh - d.ph;
  auto produce = [&](int kt, uint32_t a, uint32_t b, uint32_t bar) {
    const int tap = kt / cblocks, cb = kt - tap * cblocks;
    int kh, kwi;
    f.kw.divmod(tap, kh, kwi);
    wgmma::tma_load_im2col_4d(a, &xmap, cb * 64, w0, h0, n, uint16_t(kwi * d.dw), uint16_t(kh * d.dh), bar);
    wgmma::tma_load_2d(b, &wmap, kt * 64, n0, bar);
  };
  tma_ws_gemm_tile<Cfg, T, false, false>(produce, K / 64, smem, [&](int r, int c, float v0, float v1) {
    const int m = m0 + r, co = n0 + c;
    if (m >= M || co >= d.cout) return;
    if (bias) v0 += to_float(bias[co]), v1 += to_float(bias[co + 1]);
    store_pair(y + int64_t(m) * d.cout + co, v0, v1);
  });
#endif
}

// False (nothing launched) when the im2col map cannot describe the geometry.
template <typename Cfg, typename T>
bool launch_forward_im2col(const Dims& d, const void* x, const void* w, const void* bias, void* y) {
  CUtensorMap xmap;
  if (!x_im2col_map<T>(&xmap, x, d, Cfg::BM)) return false;
  const CUtensorMap wmap = k128_tile_map<T>(w, d.cout, int64_t(d.kh) * d.kw * d.cin, Cfg::BN);
  auto kernel = forward_im2col_kernel<Cfg, T>;
  static const bool configured = set_smem_limit(kernel, Cfg::kSmemBytes);
  (void)configured;
  const int64_t M = int64_t(d.n) * d.ho * d.wo;
  const int m_tiles = int((M + Cfg::BM - 1) / Cfg::BM), n_tiles = (d.cout + Cfg::BN - 1) / Cfg::BN;
  kernel<<<unsigned(int64_t(m_tiles) * n_tiles), Cfg::kThreads, Cfg::kSmemBytes, engine::cuda::stream()>>>(
      FastDims(d), static_cast<const T*>(bias), static_cast<T*>(y), n_tiles, xmap, wmap);
  ENGINE_CUDA_LAUNCH_CHECK("conv2d (implicit GEMM forward, im2col bulk copies)");
  count_igemm_im2col_launch();
  return true;
}

template <typename T, bool kGather>
void dispatch_forward(const Dims& d, const void* x, const void* w, const void* bias, void* y) {
  if constexpr (!std::is_same_v<T, float>) {
    if (igemm_wgmma() && d.coutg > 64) {
      const WgShape shape = wgmma_shape(int64_t(d.n) * d.ho * d.wo, d.coutg, d.groups);
      if (!kGather && igemm_im2col() && d.groups == 1 && d.cin % 64 == 0) {
        bool launched = false;
        with_tma_ws_tile(shape,
                         [&](auto cfg) { launched = launch_forward_im2col<decltype(cfg), T>(d, x, w, bias, y); });
        if (launched) return;
      }
      auto launch = [&](auto cfg) { launch_forward<decltype(cfg), T, kGather>(d, x, w, bias, y); };
      if (!kGather && igemm_tma()) with_wgmma_tile<true>(shape, launch);
      else with_wgmma_tile(shape, launch);
      return;
    }
  }
  if (narrow_n(int64_t(d.n) * d.ho * d.wo, d.coutg, d.groups))
    launch_forward<TileOf<T, 128, 64>, T, kGather>(d, x, w, bias, y);
  else if (wide_warps_64x64(std::is_same_v<T, float>))
    launch_forward<TileOf<T, 128, 128, 64>, T, kGather>(d, x, w, bias, y);
  else launch_forward<TileOf<T, 128, 128>, T, kGather>(d, x, w, bias, y);
}

}  // namespace

}  // namespace ops::cuda::conv::igemm

namespace ops::cuda::conv {

void igemm_forward(const Dims& d, engine::DType t, const void* x, const void* w, const void* bias, void* y) {
  if (int64_t(d.n) * d.ho * d.wo == 0 || d.cout == 0) return;
  ENGINE_CHECK(d.groups <= 65535, "conv2d: at most 65535 groups on the GPU, got ", d.groups);
  igemm::with_elem_and_gather(t, d.cg, [&](auto elem, auto gather) {
    igemm::dispatch_forward<decltype(elem), decltype(gather)::value>(d, x, w, bias, y);
  });
}

}  // namespace ops::cuda::conv
