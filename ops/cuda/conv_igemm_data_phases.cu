// cuda/conv_igemm_data_phases.cu: the convolution's data gradient as implicit GEMMs on tensor cores, one per
// stride phase, so that no MMA multiplies a tap that misses the output grid (bf16/f16, or f32 as TF32; f32 accumulate;
// main loop and tiling in conv_igemm.cuh).
//
// dx[n, h, w, ci] sums over the taps (kh, kw) with (h + p_h - kh*d_h) divisible by s_h (and likewise in w).
// Which taps those are depends only on the phase (h mod s_h, w mod s_w): phase (rh, rw) owns the dx pixels
// h = rh + s_h*i, w = rw + s_w*j, and for its valid taps ho = i + off_h(kh), off_h = (rh + p_h - kh*d_h) / s_h
// (exact). So each phase is a dense GEMM:
//   M = N * ceil((H - rh) / s_h) * ceil((W - rw) / s_w), N = Cin/g, K = (valid taps of the phase) * Cout/g,
//   A[m, (t, co)] = dy[n, i + off_h(t), j + off_w(t), g*Coutg + co] (0 outside), B[(t, co), ci] = w[g*Coutg + co,
//   tap t, ci].
// A stride-1 convolution is the one-phase case (every tap valid). The phase's tap table (offsets and the
// weight's tap index, at most kMaxTaps) is built in shared memory by the block before its main loop.
// A is staged [m][k], B [k][n] (read with ldmatrix.trans, or wgmma's N-major panels: on Hopper 16-bit types run
// wgmma tiles of 128 x 128/256 by Cin/g as the forward does by Cout/g, the weight tiles copied by TMA when Cout/g
// is a multiple of 64). Grid: (tiles of the largest phase, groups, phases); blocks past their phase's M return at
// once. Bound: the tensor cores when K >= ~256.
#include <algorithm>
#include <vector>

#include "ops/cuda/conv_igemm_tma.cuh"

namespace ops::cuda::conv::igemm {

namespace {

constexpr int kMaxTaps = kMaxPhaseTaps;

struct TapTable {
  int off_h[kMaxTaps], off_w[kMaxTaps], tap[kMaxTaps];
};

template <typename Cfg, bool kGather>
struct PhaseLoader {
  // The weight tile by the bulk tensor copy (tma_b; launched only when Cout/g is a multiple of 64, so that a K-slice
  // is 64 output channels of one tap).
  static constexpr bool kTmaB = Cfg::kTma && !kGather;
  static_assert(!kTmaB || Cfg::kWgmma, "the bulk tensor copy feeds the wgmma tiles");
  static constexpr int kARowStep = Cfg::kLoadThreads / 8;              // A [BM][BK]: 8 chunks per row
  static constexpr int kAPasses = Cfg::BM / kARowStep;
  static constexpr int BK = Cfg::BK, kVec = Cfg::kVec;
  static constexpr int kBChunks = Cfg::BN / kVec;                  // B [BK][BN]
  static constexpr int kBRowStep = Cfg::kLoadThreads / kBChunks, kBPasses = BK / kBRowStep;
  using Elem = typename Cfg::Elem;
  const Elem* dy;
  const Elem* w;
  const TapTable* taps;  // shared memory
  FastDiv coutg;
  int K, ho, wo, cout, cg, ktaps;
  int a_ch, a_r0;
  int a_base[kAPasses], a_i[kAPasses], a_j[kAPasses];  // per A row: n*Ho*Wo*Cout + g*Coutg, i, j
  int b_ch, b_r0, b_ci, b_row0;  // B chunk column, first row, first ci (or -1; gathering: may pass Cin/g), g*Coutg
  const CUtensorMap* tmap;        // kTmaB: the weight as [Cout][KH*KW][Cin/g]
  int n0;                         // kTmaB: the tile's first input channel

  // Slice kt's [BK][BN] weight tile into dst: one box of 64 input channels x 64 output channels of the slice's tap
  // per 64-column panel (channels past Cin/g read zeros).
  __device__ void tma_b(uint32_t dst, uint32_t bar, int kt) const {
    int t, co;
    coutg.divmod(kt * BK, t, co);
#pragma unroll
    for (int p = 0; p < Cfg::BN / 64; p++)
      wgmma::tma_load_3d(dst + p * kPanelBytes, tmap, n0 + 64 * p, taps->tap[t], b_row0 + co, bar);
  }

  __device__ void load(uint16_t* sA, uint16_t* sB, int kt) const {
    {
      const int k = kt * BK + a_ch * kVec;
      const bool k_ok = k < K;
      int t, co;
      coutg.divmod(k, t, co);
      t = k_ok ? t : 0;  // past K: no table entry
      const int oh = taps->off_h[t], ow = taps->off_w[t];
#pragma unroll
      for (int i = 0; i < kAPasses; i++) {
        const int th = a_i[i] + oh, tw = a_j[i] + ow;
        const bool ok = k_ok && unsigned(th) < unsigned(ho) && unsigned(tw) < unsigned(wo);
        const Elem* src = ok ? dy + a_base[i] + (th * wo + tw) * cout + co : dy;
        cp_async16(smem_addr(sA + tile_chunk<Cfg, BK, false>(a_r0 + kARowStep * i, a_ch)), src, ok);
      }
    }
#pragma unroll
    for (int i = 0; i < (kTmaB ? 0 : kBPasses); i++) {
      const int k = kt * BK + b_r0 + kBRowStep * i;
      const bool ok = b_ci >= 0 && k < K;
      int t, co;
      coutg.divmod(k, t, co);
      t = ok ? t : 0;
      if constexpr (!kGather) {
        const Elem* src = ok ? w + ((b_row0 + co) * ktaps + taps->tap[t]) * cg + b_ci : w;
        cp_async16(smem_addr(sB + kn_chunk<Cfg, Cfg::BN>(b_r0 + kBRowStep * i, b_ch)), src, ok);
      } else {
        // The weight row's Cin/g channels are not whole 16-byte vectors: element by element, past Cin/g zeros.
        const Elem* row = w + ((b_row0 + co) * ktaps + taps->tap[t]) * cg;
        Elem v[kVec];
#pragma unroll
        for (int e = 0; e < kVec; e++) v[e] = ok && b_ci + e < cg ? row[b_ci + e] : Elem(0);
        store_chunk(sB + kn_chunk<Cfg, Cfg::BN>(b_r0 + kBRowStep * i, b_ch), v);
      }
    }
  }
};

template <typename Cfg, typename T, bool kGather>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    phase_kernel(const FastDims f, const typename Cfg::Elem* __restrict__ dy, const typename Cfg::Elem* __restrict__ w,
                 T* __restrict__ dx, int n_tiles, const __grid_constant__ CUtensorMap tmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) uint16_t smem[];
  __shared__ TapTable table;
  const Dims& d = f.d;
  const int phase = int(blockIdx.z), rh = phase / d.sw, rw = phase % d.sw;
  const int hp = (d.h - rh + d.sh - 1) / d.sh, wp = (d.w - rw + d.sw - 1) / d.sw;  // this phase's dx grid
  const int M = d.n * hp * wp;
  const int m0 = int(blockIdx.x) / n_tiles * Cfg::BM, n0 = int(blockIdx.x) % n_tiles * Cfg::BN;
  if (m0 >= M) return;  // the whole block: a smaller phase
  const int grp = int(blockIdx.y), kt_all = d.kh * d.kw;

  // The phase's valid taps, in (kh, kw) order.
  const PhaseTaps th(rh, d.ph, d.dh, d.sh, d.kh), tw(rw, d.pw, d.dw, d.sw, d.kw);
  const int taps = th.count * tw.count;
  if (int(threadIdx.x) < taps) {
    const int vh = int(threadIdx.x) / tw.count, vw = int(threadIdx.x) % tw.count;
    table.off_h[threadIdx.x] = th.off_of(vh);
    table.off_w[threadIdx.x] = tw.off_of(vw);
    table.tap[threadIdx.x] = th.tap(vh) * d.kw + tw.tap(vw);
  }
  __syncthreads();
  const int K = taps * d.coutg;

  using Loader = PhaseLoader<Cfg, kGather>;
  Loader ld;
  ld.dy = dy, ld.w = w, ld.taps = &table, ld.coutg = f.coutg, ld.K = K, ld.ho = d.ho, ld.wo = d.wo;
  ld.cout = d.cout, ld.cg = d.cg, ld.ktaps = kt_all;
  ld.a_ch = int(threadIdx.x) % 8, ld.a_r0 = int(threadIdx.x) / 8;
#pragma unroll
  for (int i = 0; i < Loader::kAPasses; i++) {
    const int m = m0 + ld.a_r0 + Loader::kARowStep * i;
    if (m < M) {
      const int j = m % wp, t = m / wp, ii = t % hp, n = t / hp;
      ld.a_base[i] = n * d.ho * d.wo * d.cout + grp * d.coutg;
      ld.a_i[i] = ii, ld.a_j[i] = j;
    } else {
      ld.a_base[i] = 0, ld.a_i[i] = kFarAway, ld.a_j[i] = kFarAway;
    }
  }
  ld.b_ch = int(threadIdx.x) % Loader::kBChunks, ld.b_r0 = int(threadIdx.x) / Loader::kBChunks;
  ld.b_ci = n0 + ld.b_ch * Cfg::kVec < d.cg ? n0 + ld.b_ch * Cfg::kVec : -1;  // a chunk starting past Cin/g: zeros
  ld.b_row0 = grp * d.coutg;
  ld.tmap = &tmap, ld.n0 = n0;
  gemm_tile<Cfg, T, false, true>(ld, (K + Cfg::BK - 1) / Cfg::BK, smem, [&](int r, int c, float v0, float v1) {
    const int m = m0 + r, ci = n0 + c;
    if (m >= M || ci >= d.cg) return;
    const int j = m % wp, t = m / wp, ii = t % hp, n = t / hp;
    const int64_t pix = (int64_t(n) * d.h + rh + d.sh * ii) * d.w + rw + d.sw * j;
    T* p = dx + pix * d.cin + grp * d.cg + ci;
    if constexpr (kGather) store_two(p, v0, v1, ci + 1 < d.cg);  // odd rows: pairs are not aligned
    else store_pair(p, v0, v1);
  });
#endif
}

// The weight as [Cout][KH*KW][Cin/g] in boxes of 64 input channels x one tap x 64 output channels: a box is one
// MN-major panel of a [k][n] B tile (k = 64 output channels of a tap, n = 64 input channels).
template <typename T>
CUtensorMap weight_taps_map(const void* w, const Dims& d) {
  const int taps = d.kh * d.kw;
  const cuuint64_t dims[3] = {cuuint64_t(d.cg), cuuint64_t(taps), cuuint64_t(d.cout)};
  const cuuint64_t strides[2] = {cuuint64_t(d.cg) * 2, cuuint64_t(taps) * d.cg * 2};
  const cuuint32_t box[3] = {64, 1, 64};
  return swizzle128_map<T>(w, 3, dims, strides, box);
}

// The Hopper data gradient of a convolution of one group whose Cout is a multiple of 64, its stride phases in one
// launch (tma_ws_gemm_tile; A K-major, B MN-major). Phase (rh, rw) owns the dx pixels (rh + s_h i, rw + s_w j), i < hp,
// j < wp, and its valid taps are kh = kh0, kh0 + step_h, .., kh_last (those with (rh + p_h - kh d_h) divisible by s_h;
// an arithmetic progression of step s_h / gcd(d_h, s_h)), likewise in w. Tap kh reads dy row i + off(kh), off(kh) =
// (rh + p_h - kh d_h) / s_h, so the phase is a stride-1 convolution of dy: dy's im2col map has its lower corner at
// off(kh_last) (the smallest), the tap's im2col offset is off(kh) - off(kh_last) = (kh_last - kh) d_h / s_h >= 0, and
// the upper corner makes the box hp x wp. K-slice kt is valid tap kt / (Cout / 64) and output channels 64 (kt % (Cout
// / 64)) ..: A is one im2col copy of dy (the block's BM dx pixels of the phase), B's 64-column panels the weight's
// boxes of that tap (weight_taps_map). A stride-1 convolution is one phase of every tap. Only the producer lane
// computes coordinates.
// The phases share one grid, those with the most taps first: a phase alone is often less than a wave (3x3 s2 with
// 38^2 outputs x 8: 91 tiles of 128 x 128 per phase on 132 SMs) and its K short (the one-tap phase of a 256-channel
// dy: 4 slices), so one launch per phase left the SMs idle in each launch's last wave; in one grid the short tiles
// fill the long ones' tail.
struct Im2colPhase {
  int rh, rw;          // the phase
  PhaseTaps th, tw;    // its valid taps
  FastDiv hp, wp;      // its dx grid
};
constexpr int kPhasesPerLaunch = 4;  // stride 2 x 2; larger strides take several launches
struct Im2colPhases {
  CUtensorMap dy[kPhasesPerLaunch];       // each phase's im2col map of dy
  Im2colPhase ph[kPhasesPerLaunch];
  int first_block[kPhasesPerLaunch + 1];  // phase p's blocks: first_block[p] .. first_block[p + 1] - 1
  int count;
};

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    data_im2col_kernel(const FastDims f, const __grid_constant__ Im2colPhases phases, T* __restrict__ dx, int n_tiles,
                       const __grid_constant__ CUtensorMap wmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint16_t smem[];
  const Dims& d = f.d;
  int p = 0;  // this block's phase
#pragma unroll
  for (int q = 1; q < kPhasesPerLaunch; q++)
    if (q < phases.count && int(blockIdx.x) >= phases.first_block[q]) p = q;
  const Im2colPhase& ph = phases.ph[p];
  const CUtensorMap* dymap = &phases.dy[p];
  const int block = int(blockIdx.x) - phases.first_block[p];
  const int hp = int(ph.hp.d), wp = int(ph.wp.d), M = d.n * hp * wp;
  const int cblocks = d.cout / 64, k_tiles = ph.th.count * ph.tw.count * cblocks;
  const int m0 = block / n_tiles * Cfg::BM, n0 = block % n_tiles * Cfg::BN;
  const int lower_h = ph.th.off_of(ph.th.count - 1), lower_w = ph.tw.off_of(ph.tw.count - 1);
  int t, j0, n, i0;  // the tile's first dx pixel of the phase
  ph.wp.divmod(m0, t, j0);
  ph.hp.divmod(t, n, i0);
  auto produce = [&](int kt, uint32_t a, uint32_t b, uint32_t bar) {
    const int v = kt / cblocks, cb = kt - v * cblocks, vh = v / ph.tw.count, vw = v - vh * ph.tw.count;
    const int oh = ph.th.off_of(vh) - lower_h, ow = ph.tw.off_of(vw) - lower_w;  // the tap's im2col offsets
    wgmma::tma_load_im2col_4d(a, dymap, cb * 64, lower_w + j0, lower_h + i0, n, uint16_t(ow), uint16_t(oh), bar);
#pragma unroll
    for (int j = 0; j < Cfg::BN / 64; j++)
      wgmma::tma_load_3d(b + j * kPanelBytes, &wmap, n0 + 64 * j, ph.th.tap(vh) * d.kw + ph.tw.tap(vw), cb * 64, bar);
  };
  tma_ws_gemm_tile<Cfg, T, false, true>(produce, k_tiles, smem, [&](int r, int c, float v0, float v1) {
    const int m = m0 + r, ci = n0 + c;
    if (m >= M || ci >= d.cin) return;
    int q, j, nn, i;
    ph.wp.divmod(m, q, j);
    ph.hp.divmod(q, nn, i);
    const int64_t pix = (int64_t(nn) * d.h + ph.rh + d.sh * i) * d.w + ph.rw + d.sw * j;
    store_pair(dx + pix * d.cin + ci, v0, v1);
  });
#endif
}

// False (nothing launched) when a phase has no taps or the im2col map cannot describe a phase.
template <typename Cfg, typename T>
bool launch_data_im2col(const Dims& d, const void* dy, const void* w, void* dx) {
  struct Phase {
    Im2colPhase ph;
    CUtensorMap map;
  };
  std::vector<Phase> all;
  for (int rh = 0; rh < d.sh; rh++)
    for (int rw = 0; rw < d.sw; rw++) {
      Im2colPhase ph{};
      ph.rh = rh, ph.rw = rw;
      ph.th = PhaseTaps(rh, d.ph, d.dh, d.sh, d.kh), ph.tw = PhaseTaps(rw, d.pw, d.dw, d.sw, d.kw);
      const PhaseTaps &th = ph.th, &tw = ph.tw;
      if (th.count == 0 || tw.count == 0) return false;  // dx of the phase is zeros: the cp.async kernel writes them
      const int lower_h = th.off_of(th.count - 1), lower_w = tw.off_of(tw.count - 1);  // the last taps' offsets
      const int hp = (d.h - rh + d.sh - 1) / d.sh, wp = (d.w - rw + d.sw - 1) / d.sw;
      if (hp == 0 || wp == 0) continue;
      ph.hp = FastDiv(hp), ph.wp = FastDiv(wp);
      const Im2colDims g{d.n,
                         d.ho,
                         d.wo,
                         d.cout,
                         lower_h,
                         lower_w,
                         hp - d.ho + lower_h,
                         wp - d.wo + lower_w,
                         th.off - lower_h,
                         tw.off - lower_w,
                         1,
                         1};
      Phase e{ph, {}};
      if (!im2col_map<T>(&e.map, dy, g, Cfg::BM)) return false;
      all.push_back(e);
    }
  // The longest K first (a stable sort: equal phases in (rh, rw) order).
  auto taps = [](const Phase& e) { return e.ph.th.count * e.ph.tw.count; };
  std::stable_sort(all.begin(), all.end(), [&](const Phase& a, const Phase& b) { return taps(a) > taps(b); });
  const CUtensorMap wmap = weight_taps_map<T>(w, d);
  auto kernel = data_im2col_kernel<Cfg, T>;
  static const bool configured = set_smem_limit(kernel, Cfg::kSmemBytes);
  (void)configured;
  const int n_tiles = (d.cin + Cfg::BN - 1) / Cfg::BN;
  for (size_t first = 0; first < all.size(); first += kPhasesPerLaunch) {
    Im2colPhases phases{};
    int64_t blocks = 0;
    for (size_t i = first; i < std::min(all.size(), first + kPhasesPerLaunch); i++) {
      const int q = phases.count++;
      phases.ph[q] = all[i].ph, phases.dy[q] = all[i].map, phases.first_block[q] = int(blocks);
      const int64_t M = int64_t(d.n) * all[i].ph.hp.d * all[i].ph.wp.d;
      blocks += (M + Cfg::BM - 1) / Cfg::BM * n_tiles;
    }
    phases.first_block[phases.count] = int(blocks);
    kernel<<<unsigned(blocks), Cfg::kThreads, Cfg::kSmemBytes, engine::cuda::stream()>>>(
        FastDims(d), phases, static_cast<T*>(dx), n_tiles, wmap);
    ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_data (implicit GEMM over the stride phases, im2col bulk copies)");
  }
  count_igemm_im2col_launch();
  return true;
}

template <typename Cfg, typename T, bool kGather>
void launch_phases(const Dims& d, const void* dy, const void* w, void* dx) {
  auto kernel = phase_kernel<Cfg, T, kGather>;
  static const bool configured = set_smem_limit(kernel, Cfg::kSmemBytes);  // once per launcher
  (void)configured;
  const int64_t M = int64_t(d.n) * ((d.h + d.sh - 1) / d.sh) * ((d.w + d.sw - 1) / d.sw);  // phase (0, 0)'s
  const int m_tiles = int((M + Cfg::BM - 1) / Cfg::BM), n_tiles = (d.cg + Cfg::BN - 1) / Cfg::BN;
  const dim3 grid(unsigned(int64_t(m_tiles) * n_tiles), unsigned(d.groups), unsigned(d.sh * d.sw));
  CUtensorMap tmap{};
  if constexpr (Cfg::kTma && !kGather) tmap = weight_taps_map<T>(w, d);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, engine::cuda::stream()>>>(
      FastDims(d), static_cast<const typename Cfg::Elem*>(dy), static_cast<const typename Cfg::Elem*>(w),
      static_cast<T*>(dx), n_tiles, tmap);
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_data (implicit GEMM per stride phase)");
}

template <typename T, bool kGather>
void dispatch_phases(const Dims& d, const void* dy, const void* w, void* dx) {
  const int64_t M = int64_t(d.n) * d.h * d.w;  // all phases together
  if constexpr (!std::is_same_v<T, float>) {
    if (igemm_wgmma() && d.cg > 64) {
      const WgShape shape = wgmma_shape(M, d.cg, d.groups);
      if (!kGather && igemm_im2col() && d.groups == 1 && d.cout % 64 == 0) {
        bool launched = false;
        with_tma_ws_tile(shape, [&](auto cfg) { launched = launch_data_im2col<decltype(cfg), T>(d, dy, w, dx); });
        if (launched) return;
      }
      auto launch = [&](auto cfg) { launch_phases<decltype(cfg), T, kGather>(d, dy, w, dx); };
      if (!kGather && igemm_tma() && d.coutg % 64 == 0) with_wgmma_tile<true>(shape, launch);
      else with_wgmma_tile(shape, launch);
      return;
    }
  }
  if (narrow_n(M, d.cg, d.groups)) launch_phases<TileOf<T, 128, 64>, T, kGather>(d, dy, w, dx);
  else if (wide_warps_64x64(false)) launch_phases<TileOf<T, 128, 128, 64>, T, kGather>(d, dy, w, dx);
  else launch_phases<TileOf<T, 128, 128>, T, kGather>(d, dy, w, dx);
}

}  // namespace

}  // namespace ops::cuda::conv::igemm

namespace ops::cuda::conv {

bool igemm_data_phases(const Dims& d, engine::DType t, const void* dy, const void* w, void* dx) {
  if (!phases_fit(d.kh, d.kw, d.sh, d.sw)) return false;
  igemm::with_elem_and_gather(t, d.cg, [&](auto elem, auto gather) {
    igemm::dispatch_phases<decltype(elem), decltype(gather)::value>(d, dy, w, dx);
  });
  return true;
}

}  // namespace ops::cuda::conv
