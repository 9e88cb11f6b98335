// cuda/conv_igemm_data.cu: the convolution's data gradient as one implicit GEMM over every filter tap, on
// tensor cores (bf16/f16, or f32 as TF32; f32 accumulate; main loop and tiling in conv_igemm.cuh). The fallback of the
// per-stride-phase GEMMs (conv_igemm_data_phases.cu, used whenever the filter has <= 64 taps):
//   M = N*H*W input pixels, N = Cin/g, K = KH*KW*Cout/g ordered (kh, kw, co),
//   A[m, k] = dy[n, ho, wo, g*Coutg + co] where ho = (h + p - kh*d) / s and wo likewise are integral and in
//             range, else 0;   B[k, ci] = w[g*Coutg + co, kh, kw, ci].
// A is staged [m][k] (dy rows, contiguous in co), B [k][n] (weight rows, contiguous in ci; read with
// ldmatrix.trans, TF32: one word per lane). Stride > 1: the taps that miss the output grid are zero-filled,
// so for stride s only about 1/s^2 of the MMAs do useful work. kUnitStride drops the divisibility tests for stride 1.
// Grid: one block per dx tile (N-tiles fastest), blockIdx.y = group.
#include "ops/cuda/conv_igemm.cuh"

namespace ops::cuda::conv::igemm {

namespace {

template <typename Cfg, bool kUnitStride>
struct DataLoader {
  static constexpr int kARowStep = Cfg::kLoadThreads / 8;              // A [BM][BK]: 8 chunks per row
  static constexpr int kAPasses = Cfg::BM / kARowStep;
  static constexpr int BK = Cfg::BK, kVec = Cfg::kVec;
  static constexpr int kBChunks = Cfg::BN / kVec;                  // B [BK][BN]
  static constexpr int kBRowStep = Cfg::kLoadThreads / kBChunks, kBPasses = BK / kBRowStep;
  using Elem = typename Cfg::Elem;
  const Elem* dy;
  const Elem* w;
  FastDiv coutg, kw, sh, sw;
  int K, dh, dw, ho, wo, cout, cg, taps;
  int a_ch, a_r0;                                    // A: chunk column, first row
  int a_base[kAPasses], a_hp[kAPasses], a_wp[kAPasses];  // per A row: n*Ho*Wo*Cout + g*Coutg, h + p, w + p
  int b_ch, b_r0;                                    // B: chunk column (ci), first row
  int b_ci;                                          // first input channel of this thread's chunk, or -1
  int b_row0;                                        // g*Coutg

  __device__ void load(uint16_t* sA, uint16_t* sB, int kt) const {
    {
      const int k = kt * BK + a_ch * kVec;
      const bool k_ok = k < K;
      int tap, co, kh, kwi;
      coutg.divmod(k, tap, co);
      kw.divmod(tap, kh, kwi);
      const int dho = kh * dh, dwo = kwi * dw;
#pragma unroll
      for (int i = 0; i < kAPasses; i++) {
        int th = a_hp[i] - dho, tw = a_wp[i] - dwo;
        bool ok;
        if constexpr (kUnitStride) {
          ok = k_ok && unsigned(th) < unsigned(ho) && unsigned(tw) < unsigned(wo);
        } else {
          ok = k_ok && th >= 0 && tw >= 0;
          int rh, rw;
          sh.divmod(max(th, 0), th, rh);
          sw.divmod(max(tw, 0), tw, rw);
          ok = ok && rh == 0 && rw == 0 && th < ho && tw < wo;
        }
        const Elem* src = ok ? dy + a_base[i] + (th * wo + tw) * cout + co : dy;
        cp_async16(smem_addr(sA + tile_chunk<Cfg, BK, false>(a_r0 + kARowStep * i, a_ch)), src, ok);
      }
    }
#pragma unroll
    for (int i = 0; i < kBPasses; i++) {
      const int k = kt * BK + b_r0 + kBRowStep * i;
      const bool ok = b_ci >= 0 && k < K;
      int tap, co;
      coutg.divmod(k, tap, co);
      const Elem* src = ok ? w + ((b_row0 + co) * taps + tap) * cg + b_ci : w;
      cp_async16(smem_addr(sB + kn_chunk<Cfg, Cfg::BN>(b_r0 + kBRowStep * i, b_ch)), src, ok);
    }
  }
};

template <typename Cfg, typename T, bool kUnitStride>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    data_kernel(const FastDims f, const typename Cfg::Elem* __restrict__ dy, const typename Cfg::Elem* __restrict__ w,
                T* __restrict__ dx, int n_tiles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) uint16_t smem[];
  const Dims& d = f.d;
  const int M = d.n * d.h * d.w, K = d.kh * d.kw * d.coutg;
  const int m0 = int(blockIdx.x) / n_tiles * Cfg::BM, n0 = int(blockIdx.x) % n_tiles * Cfg::BN;
  const int grp = int(blockIdx.y);
  using Loader = DataLoader<Cfg, kUnitStride>;
  Loader ld;
  ld.dy = dy, ld.w = w, ld.coutg = f.coutg, ld.kw = f.kw, ld.sh = f.sh, ld.sw = f.sw;
  ld.K = K, ld.dh = d.dh, ld.dw = d.dw, ld.ho = d.ho, ld.wo = d.wo, ld.cout = d.cout, ld.cg = d.cg;
  ld.taps = d.kh * d.kw;
  ld.a_ch = int(threadIdx.x) % 8, ld.a_r0 = int(threadIdx.x) / 8;
#pragma unroll
  for (int i = 0; i < Loader::kAPasses; i++) {
    const int m = m0 + ld.a_r0 + Loader::kARowStep * i;
    if (m < M) {
      int t, wx, n, hx;
      f.w.divmod(m, t, wx);
      f.h.divmod(t, n, hx);
      ld.a_base[i] = n * d.ho * d.wo * d.cout + grp * d.coutg;
      ld.a_hp[i] = hx + d.ph;
      ld.a_wp[i] = wx + d.pw;
    } else {
      ld.a_base[i] = 0, ld.a_hp[i] = kFarAway, ld.a_wp[i] = kFarAway;
    }
  }
  ld.b_ch = int(threadIdx.x) % Loader::kBChunks, ld.b_r0 = int(threadIdx.x) / Loader::kBChunks;
  ld.b_ci = n0 + ld.b_ch * Cfg::kVec < d.cg ? n0 + ld.b_ch * Cfg::kVec : -1;
  ld.b_row0 = grp * d.coutg;
  gemm_tile<Cfg, T, false, true>(ld, (K + Cfg::BK - 1) / Cfg::BK, smem, [&](int r, int c, float v0, float v1) {
    const int m = m0 + r, ci = n0 + c;
    if (m < M && ci < d.cg) store_pair(dx + int64_t(m) * d.cin + grp * d.cg + ci, v0, v1);
  });
#endif
}

template <typename Cfg, typename T, bool kUnitStride>
void launch_data(const Dims& d, const void* dy, const void* w, void* dx) {
  auto kernel = data_kernel<Cfg, T, kUnitStride>;
  static const bool configured = set_smem_limit(kernel, Cfg::kSmemBytes);  // once per launcher
  (void)configured;
  const int64_t M = int64_t(d.n) * d.h * d.w;
  const int m_tiles = int((M + Cfg::BM - 1) / Cfg::BM), n_tiles = (d.cg + Cfg::BN - 1) / Cfg::BN;
  const dim3 grid(unsigned(int64_t(m_tiles) * n_tiles), unsigned(d.groups));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, engine::cuda::stream()>>>(
      FastDims(d), static_cast<const typename Cfg::Elem*>(dy), static_cast<const typename Cfg::Elem*>(w),
      static_cast<T*>(dx), n_tiles);
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_data (implicit GEMM)");
}

template <typename T>
void dispatch_data(const Dims& d, const void* dy, const void* w, void* dx) {
  const bool unit = d.sh == 1 && d.sw == 1;
  if (narrow_n(int64_t(d.n) * d.h * d.w, d.cg, d.groups)) {
    unit ? launch_data<TileOf<T, 128, 64>, T, true>(d, dy, w, dx)
         : launch_data<TileOf<T, 128, 64>, T, false>(d, dy, w, dx);
  } else if (wide_warps_64x64(false)) {
    unit ? launch_data<TileOf<T, 128, 128, 64>, T, true>(d, dy, w, dx)
         : launch_data<TileOf<T, 128, 128, 64>, T, false>(d, dy, w, dx);
  } else {
    unit ? launch_data<TileOf<T, 128, 128>, T, true>(d, dy, w, dx)
         : launch_data<TileOf<T, 128, 128>, T, false>(d, dy, w, dx);
  }
}

}  // namespace

}  // namespace ops::cuda::conv::igemm

namespace ops::cuda::conv {

void igemm_data(const Dims& d, engine::DType t, const void* dy, const void* w, void* dx) {
  if (int64_t(d.n) * d.h * d.w == 0 || d.cin == 0) return;
  ENGINE_CHECK(d.groups <= 65535, "conv2d_backward_data: at most 65535 groups on the GPU, got ", d.groups);
  if (int64_t(d.kh) * d.kw * d.coutg == 0) {
    const size_t elem = t == engine::DType::f32 ? 4 : 2;
    ENGINE_CUDA_CHECK(cudaMemsetAsync(dx, 0, size_t(d.n) * d.h * d.w * d.cin * elem, engine::cuda::stream()));
    return;
  }
  igemm::with_elem(t, [&](auto elem) { igemm::dispatch_data<decltype(elem)>(d, dy, w, dx); });
}

}  // namespace ops::cuda::conv
