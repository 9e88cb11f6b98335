// cpu/attention.cpp: the CPU reference of FlashAttention-2 (Dao 2023), forward and backward.
//
// It is written in the structure of the CUDA kernel it is the reference for, not for CPU speed: explicit
// loops over Br x Bc tiles (kBlockQ query rows x kBlockK key rows), each tile loaded into a small buffer
// (shared memory / registers on the GPU), and no [Lq, Lk] matrix anywhere. What it saves for backward is
// linear in the sequence length; what it computes is bounded by FLOPs (4 Lq Lk D per head forward).
//
// Forward: the online softmax
// ---------------------------
// Softmax of a row s_1..s_Lk needs the row max m and the sum l = sum_j exp(s_j - m), but a tile only sees
// kBlockK keys at a time. So each query row keeps a running max m, a running sum l and an unnormalized
// output acc (length Dv), and folds in one key tile at a time, whose scores have row max m_t:
//     m' = max(m, m_t)          alpha = exp(m - m')        p_j = exp(s_j - m')
//     l' = alpha * l + sum_j p_j                            acc' = alpha * acc + sum_j (p_j z_j) v_j
// Multiplying by alpha re-expresses what earlier tiles added relative to the new max, so after the last
// tile acc / l is exactly softmax(s) (with dropout factors z_j) times V, and lse = m + log(l) is the row's
// log-sum-exp. Only lse is kept: in backward, p_ij = exp(s_ij - lse_i) gives the probabilities back.
// Masked scores are -inf (p = 0). A row whose keys are all masked ends with l = 0: out = 0 and lse = +inf,
// so that exp(s - lse) = 0 in backward too. Causal: a query tile stops at the last key its last row sees.
//
// Backward
// --------
// With S the scaled scores, P = softmax(S), Z the dropout factors (keep / (1-p), or 0) and O = (P∘Z) V:
//     dV = (P∘Z)^T dO
//     dP = (dO V^T) ∘ Z
//     dS = P ∘ (dP - delta),   delta_i = sum_j P_ij dP_ij = dO_i · O_i   (the softmax backward's row term,
//                              from two vectors of length Dv instead of a row of length Lk)
//                              minus dlse_i when lse itself has a gradient (d lse_i / d S_ij = P_ij)
//     dQ = scale * dS K          dK = scale * dS^T Q
// Pass 1 computes delta for every row (a small kernel of its own on the GPU). Pass 2 gives each key tile
// j to one worker (one thread block on the GPU): it holds K_j, V_j, accumulates dK_j and dV_j over every
// query tile i that can see it, recomputing P_ij from Q_i, K_j and lse_i, and adds its share of dQ_i into
// a dQ accumulator of its head (in the accumulation type). Here the (b, h) loop is the parallel one, so the adds
// need no atomics; the GPU runs a second pass over query tiles for dQ instead.
#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "engine/rng.h"
#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

namespace {

constexpr int64_t kBlockQ = 16;  // Br: query rows per tile
constexpr int64_t kBlockK = 16;  // Bc: key rows per tile

// A [B, H, L, D] tensor read or written through its strides.
template <typename T>
struct HeadView {
  T* base;
  int64_t sb, sh, sl, sd;
  explicit HeadView(const Tensor& t)
      : base(t.data<std::remove_const_t<T>>()),
        sb(t.strides()[0]), sh(t.strides()[1]), sl(t.strides()[2]), sd(t.strides()[3]) {}
  T& operator()(int64_t b, int64_t h, int64_t l, int64_t d) const { return base[b * sb + h * sh + l * sl + d * sd]; }
};

// tile[r * width + d] = x[b, h, row0 + r, d] for r < rows, converted to the accumulation type.
template <typename T, typename A>
void load_tile(const HeadView<const T>& x, int64_t b, int64_t h, int64_t row0, int64_t rows, int64_t width,
               A* tile) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t d = 0; d < width; d++) tile[r * width + d] = ld(x(b, h, row0 + r, d));
}

// The masks and the dropout of one (b, h), as every tile needs them.
struct HeadMasks {
  const FlashAttentionParams& p;
  const uint8_t* pad_row;  // key_padding_mask[b, :], or nullptr
  int64_t Lq, Lk;
  uint64_t head_base;      // (b*H + h) * Lq * Lk: flat index of (b, h, 0, 0) in the [B, H, Lq, Lk] draw
  engine::DropoutRate rate;  // engine::dropout_rate(p.dropout_p)

  // Query i attends key j: not padding, and not after the bottom-right aligned causal diagonal.
  bool visible(int64_t i, int64_t j) const {
    if (p.causal && j > i + (Lk - Lq)) return false;
    return !(pad_row && pad_row[j]);
  }
  // The dropout factor z_ij: 1/(1-p_q) when kept, 0 when dropped (1 without dropout); engine/rng.h's draw.
  template <typename A>
  A dropout_factor(int64_t i, int64_t j) const {
    if (p.dropout_p <= 0) return A(1);
    const uint32_t bits = engine::dropout_bits(p.seed, p.offset, head_base + uint64_t(i * Lk + j));
    return bits >= rate.threshold ? A(rate.keep_scale) : A(0);
  }
};

HeadMasks head_masks(const FlashAttentionInputs& in, const FlashAttentionParams& p, int64_t b, int64_t h) {
  int64_t H = in.q.size(1), Lq = in.q.size(2), Lk = in.k.size(2);
  const uint8_t* pad = in.key_padding_mask.defined()
                           ? static_cast<const uint8_t*>(in.key_padding_mask.data_ptr()) + b * Lk : nullptr;
  return HeadMasks{p, pad, Lq, Lk, uint64_t((b * H + h) * Lq) * uint64_t(Lk), engine::dropout_rate(p.dropout_p)};
}

// Threads only pay for themselves past some work (tests run thousands of tiny attentions).
bool worth_threads(const FlashAttentionInputs& in) {
  return double(in.q.numel()) * double(in.k.size(2)) > double(1 << 16);
}

// ---------------------------------------------------------------------------------------------------
// Forward

template <typename T>
void forward_impl(const FlashAttentionInputs& in, const FlashAttentionParams& p, const Tensor& out,
                  const Tensor& lse) {
  using A = acc_t<T>;
  const int64_t B = in.q.size(0), H = in.q.size(1), Lq = in.q.size(2), Lk = in.k.size(2);
  const int64_t D = in.q.size(3), Dv = in.v.size(3);
  const HeadView<const T> Q(in.q), K(in.k), V(in.v);
  const HeadView<T> O(out);  // [B, H, Lq, Dv]
  A* LSE = lse.data<A>();    // [B, H, Lq]
  const A scale = A(p.scale), neg_inf = -std::numeric_limits<A>::infinity();
  const int64_t q_tiles = (Lq + kBlockQ - 1) / kBlockQ;

  // One task per (b, h, query tile): one thread block on the GPU.
#pragma omp parallel for schedule(dynamic) if (worth_threads(in))
  for (int64_t task = 0; task < B * H * q_tiles; task++) {
    const int64_t b = task / (H * q_tiles), h = task / q_tiles % H, q0 = task % q_tiles * kBlockQ;
    const int64_t rows = std::min(kBlockQ, Lq - q0);
    const HeadMasks mask = head_masks(in, p, b, h);
    std::vector<A> q_tile(kBlockQ * D), k_tile(kBlockK * D), v_tile(kBlockK * Dv);  // [Br, D] [Bc, D] [Bc, Dv]
    std::vector<A> s(kBlockQ * kBlockK);                        // [Br, Bc] scores, then probabilities
    std::vector<A> acc(kBlockQ * Dv, A(0));                     // [Br, Dv] unnormalized output
    std::vector<A> m(kBlockQ, neg_inf), l(kBlockQ, A(0));       // [Br] running max and sum
    load_tile(Q, b, h, q0, rows, D, q_tile.data());

    // Keys after the tile's last row's causal limit are masked for every row of the tile: skip them.
    const int64_t key_end = p.causal ? std::clamp<int64_t>(q0 + rows + (Lk - Lq), 0, Lk) : Lk;
    for (int64_t k0 = 0; k0 < key_end; k0 += kBlockK) {
      const int64_t cols = std::min(kBlockK, key_end - k0);
      load_tile(K, b, h, k0, cols, D, k_tile.data());
      load_tile(V, b, h, k0, cols, Dv, v_tile.data());
      // S = scale * Q K^T, -inf where masked.                                       [Br, Bc]
      for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
          A dot = 0;
          for (int64_t d = 0; d < D; d++) dot += q_tile[r * D + d] * k_tile[c * D + d];
          s[r * kBlockK + c] = mask.visible(q0 + r, k0 + c) ? scale * dot : neg_inf;
        }
      // Online softmax: new running max, rescale what is accumulated, add this tile's P V.
      for (int64_t r = 0; r < rows; r++) {
        A* s_row = &s[r * kBlockK];
        A m_new = m[r];
        for (int64_t c = 0; c < cols; c++) m_new = std::max(m_new, s_row[c]);
        if (m_new == neg_inf) continue;  // every key so far is masked: nothing to add yet
        const A alpha = std::exp(m[r] - m_new);  // 0 on the first visible tile (m = -inf)
        A row_sum = 0;
        for (int64_t c = 0; c < cols; c++) {
          const A prob = std::exp(s_row[c] - m_new);  // 0 where masked
          row_sum += prob;
          s_row[c] = prob * mask.dropout_factor<A>(q0 + r, k0 + c);
        }
        l[r] = alpha * l[r] + row_sum;
        m[r] = m_new;
        A* acc_row = &acc[r * Dv];
        for (int64_t e = 0; e < Dv; e++) {
          A pv = 0;
          for (int64_t c = 0; c < cols; c++) pv += s_row[c] * v_tile[c * Dv + e];
          acc_row[e] = alpha * acc_row[e] + pv;
        }
      }
    }
    // out = acc / l, lse = m + log l; a fully masked row (l = 0) gives out = 0, lse = +inf.
    for (int64_t r = 0; r < rows; r++) {
      const bool empty = l[r] == A(0);
      for (int64_t e = 0; e < Dv; e++) O(b, h, q0 + r, e) = st<T>(empty ? A(0) : acc[r * Dv + e] / l[r]);
      LSE[(b * H + h) * Lq + q0 + r] = empty ? std::numeric_limits<A>::infinity() : m[r] + std::log(l[r]);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward

template <typename T>
void backward_impl(const FlashAttentionInputs& in, const FlashAttentionParams& p, const Tensor& out,
                   const Tensor& lse, const Tensor& dout, const Tensor& dlse, const Tensor& delta,
                   const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  using A = acc_t<T>;
  const int64_t B = in.q.size(0), H = in.q.size(1), Lq = in.q.size(2), Lk = in.k.size(2);
  const int64_t D = in.q.size(3), Dv = in.v.size(3);
  const HeadView<const T> Q(in.q), K(in.k), V(in.v), O(out), dO(dout);
  const HeadView<T> dQ(dq), dK(dk), dV(dv);
  const A* LSE = lse.data<A>();                                     // [B, H, Lq]
  const A* dLSE = dlse.defined() ? dlse.data<A>() : nullptr;        // [B, H, Lq] contiguous, or none
  A* DELTA = delta.data<A>();                                       // [B, H, Lq]
  const A scale = A(p.scale);

  // Pass 1: delta_i = dO_i · O_i - dlse_i.
  parallel_for(B * H * Lq, [&](int64_t row) {
    const int64_t b = row / (H * Lq), h = row / Lq % H, i = row % Lq;
    A sum = 0;
    for (int64_t e = 0; e < Dv; e++) sum += ld(dO(b, h, i, e)) * ld(O(b, h, i, e));
    DELTA[row] = sum - (dLSE ? ld(dLSE[row]) : A(0));
  });

  // Pass 2: per (b, h), key tiles outer (each owns dK_j, dV_j), query tiles inner (adding into dQ_i).
#pragma omp parallel for schedule(dynamic) if (worth_threads(in))
  for (int64_t bh = 0; bh < B * H; bh++) {
    const int64_t b = bh / H, h = bh % H;
    const HeadMasks mask = head_masks(in, p, b, h);
    std::vector<A> dq_head(Lq * D, A(0));                               // [Lq, D] dQ accumulator of the head
    std::vector<A> k_tile(kBlockK * D), v_tile(kBlockK * Dv);           // [Bc, D] [Bc, Dv]
    std::vector<A> dk_tile(kBlockK * D), dv_tile(kBlockK * Dv);         // [Bc, D] [Bc, Dv] accumulators
    std::vector<A> q_tile(kBlockQ * D), do_tile(kBlockQ * Dv);          // [Br, D] [Br, Dv]
    std::vector<A> prob(kBlockQ * kBlockK), ds(kBlockQ * kBlockK);      // [Br, Bc] P and dS

    for (int64_t k0 = 0; k0 < Lk; k0 += kBlockK) {
      const int64_t cols = std::min(kBlockK, Lk - k0);
      load_tile(K, b, h, k0, cols, D, k_tile.data());
      load_tile(V, b, h, k0, cols, Dv, v_tile.data());
      std::fill(dk_tile.begin(), dk_tile.end(), A(0));
      std::fill(dv_tile.begin(), dv_tile.end(), A(0));
      // Causal: query i sees key k0 only from i = k0 - (Lk - Lq) on; start at that query's tile.
      const int64_t first_q = p.causal ? std::clamp<int64_t>(k0 - (Lk - Lq), 0, Lq) : 0;
      for (int64_t q0 = first_q / kBlockQ * kBlockQ; q0 < Lq; q0 += kBlockQ) {
        const int64_t rows = std::min(kBlockQ, Lq - q0);
        load_tile(Q, b, h, q0, rows, D, q_tile.data());
        load_tile(dO, b, h, q0, rows, Dv, do_tile.data());
        const A* lse_rows = LSE + bh * Lq + q0;
        const A* delta_rows = DELTA + bh * Lq + q0;
        for (int64_t r = 0; r < rows; r++)
          for (int64_t c = 0; c < cols; c++) {
            A& p_rc = prob[r * kBlockK + c];
            A& ds_rc = ds[r * kBlockK + c];
            if (!mask.visible(q0 + r, k0 + c)) { p_rc = 0; ds_rc = 0; continue; }
            // P = exp(S - lse): the forward's probability, recomputed (0 when lse = +inf).
            A s = 0;
            for (int64_t d = 0; d < D; d++) s += q_tile[r * D + d] * k_tile[c * D + d];
            const A p_ij = std::exp(scale * s - lse_rows[r]);
            const A z = mask.dropout_factor<A>(q0 + r, k0 + c);
            // dP = (dO V^T) * Z;  dS = P * (dP - delta).
            A dp = 0;
            for (int64_t e = 0; e < Dv; e++) dp += do_tile[r * Dv + e] * v_tile[c * Dv + e];
            ds_rc = p_ij * (dp * z - delta_rows[r]);
            p_rc = p_ij * z;  // what multiplied V in the forward
          }
        // dV_j += (P∘Z)^T dO_i;  dK_j += scale * dS^T Q_i.
        for (int64_t c = 0; c < cols; c++)
          for (int64_t r = 0; r < rows; r++) {
            const A pz = prob[r * kBlockK + c], dsv = scale * ds[r * kBlockK + c];
            for (int64_t e = 0; e < Dv; e++) dv_tile[c * Dv + e] += pz * do_tile[r * Dv + e];
            for (int64_t d = 0; d < D; d++) dk_tile[c * D + d] += dsv * q_tile[r * D + d];
          }
        // dQ_i += scale * dS K_j (atomic adds into the f32 accumulator on the GPU).
        for (int64_t r = 0; r < rows; r++)
          for (int64_t c = 0; c < cols; c++) {
            const A dsv = scale * ds[r * kBlockK + c];
            for (int64_t d = 0; d < D; d++) dq_head[(q0 + r) * D + d] += dsv * k_tile[c * D + d];
          }
      }
      for (int64_t c = 0; c < cols; c++) {
        for (int64_t d = 0; d < D; d++) dK(b, h, k0 + c, d) = st<T>(dk_tile[c * D + d]);
        for (int64_t e = 0; e < Dv; e++) dV(b, h, k0 + c, e) = st<T>(dv_tile[c * Dv + e]);
      }
    }
    for (int64_t i = 0; i < Lq; i++)
      for (int64_t d = 0; d < D; d++) dQ(b, h, i, d) = st<T>(dq_head[i * D + d]);
  }
}

}  // namespace

// The dropout keep bits (ops/attention.h): bit j % 8 of byte j / 8 of row (b, h, i) is 1 iff element (b, h, i, j) of
// the draw is kept, for every key j < Lk (the GPU's kernels may leave masked pairs' bits unwritten); bytes past Lk / 8
// are 0.
void write_keep_bits(const FlashAttentionInputs& in, const FlashAttentionParams& p, const Tensor& keep) {
  const int64_t rows = keep.size(0) * keep.size(1) * keep.size(2), W = keep.size(3), Lk = in.k.size(2);
  const uint32_t threshold = engine::dropout_rate(p.dropout_p).threshold;
  uint8_t* bits = keep.data<uint8_t>();
#pragma omp parallel for if (worth_threads(in))
  for (int64_t r = 0; r < rows; r++)
    for (int64_t byte = 0; byte < W; byte++) {
      uint32_t v = 0;
      for (int64_t j = 8 * byte; j < std::min(8 * byte + 8, Lk); j++)
        v |= uint32_t(engine::dropout_bits(p.seed, p.offset, uint64_t(r) * uint64_t(Lk) + uint64_t(j)) >= threshold)
             << (j % 8);
      bits[r * W + byte] = uint8_t(v);
    }
}

void flash_attention_forward(const FlashAttentionInputs& in, const FlashAttentionParams& params,
                             const Tensor& out, const Tensor& lse, const Tensor& keep) {
  ENGINE_FLOAT_SWITCH(in.q.dtype(), T, { forward_impl<T>(in, params, out, lse); });
  if (keep.defined()) write_keep_bits(in, params, keep);
}

void flash_attention_backward(const FlashAttentionInputs& in, const FlashAttentionParams& params,
                              const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                              const Tensor& delta, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv) {
  ENGINE_FLOAT_SWITCH(in.q.dtype(), T,
                      { backward_impl<T>(in, params, out, lse, dout, dlse, delta, dq, dk, dv); });
}

}  // namespace ops::cpu
