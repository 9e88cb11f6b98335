// attention.h: scaled dot-product attention, softmax(q k^T * scale + mask) v, by two algorithms that compute
// exactly the same function and differ only in the memory they hold.
//
//   naive  composed of engine ops (matmul, masked_fill, softmax, dropout, matmul), as the 2020 frameworks
//          did it: the [B, H, Lq, Lk] scores and probabilities are materialized in the arena, and the
//          probabilities stay saved for backward: activation memory quadratic in the sequence length.
//          Backward is autograd through those ops.
//   flash  the engine's own op, a tiled FlashAttention-2 (Dao 2023): blocks of queries x blocks of keys with
//          an online softmax; it saves only q, k, v, the output and the row log-sum-exp [B, H, Lq] (and, with
//          dropout at short keys, its keep bits: below): activation memory linear in the sequence length.
//          Backward recomputes the probabilities tile by tile from the log-sum-exp (ops/cpu/attention.cpp explains
//          both passes). For a short key sequence
//          backward also holds dS for a moment: with bf16/f16 at D == Dv in {64, 128} or f32 at 64 and a head's
//          [Lq, Lk] rounded up to 64 x 64 at most 8 times its q ([Lq, D]; Lk up to 8 D: BERT's 512 at head dim 64),
//          a [B*H, Lq, Lk] buffer of q's type (rounded up to 64) lives through the backward call, on every device
//          alike (meta predicts it): the GPU's dK dV pass writes dS there and dQ = dS K reads it, instead of a third
//          pass recomputing S, P and dS (ops/cuda/attention_bwd.cu, attention_simt.cu). Still linear in the sequence
//          length: at most 8 times q's bytes, one layer at a time. ENGINE_FLASH_KEEP_DS=0 in the environment turns it
//          off on every device (for measuring: dQ then always recomputes).
//          With ENGINE_FLASH_DQ_SUMS=1 in the environment, where dS is not kept, at head dim 128 (D == Dv) in
//          bf16/f16, backward instead holds dQ's f32 sums for the call: [B*H, Lq, D] f32 (twice q's bytes) and a turn
//          counter per 64-row query tile ([B*H, ceil(Lq / 64)] i32), on every device alike: the GPU's Hopper dK dV
//          pass multiplies its dS by K and adds the product to the sums in key order (ops/cuda/attention_bwd_wgmma.cu:
//          the same bits every run), so that no dQ pass recomputes S and dP. Off by default: on an H100 it is slower
//          than the dQ pass today (BENCHMARKS.md, 2026-12-07).
//          With dropout, under the same short-key condition (and the draw's blocks aligned to 8 keys: Lk a multiple
//          of 8), the forward also keeps its dropout decisions for backward instead of backward drawing them again:
//          keep bits [B, H, Lq, W] u8, W = Lk rounded up to 64, over 8 (bit j % 8 of byte j / 8 = key j kept; at
//          most half of q's bytes), saved with q, k, v, out and lse, on every device alike. Their values are the
//          draw's (below), so keeping them changes no result: the GPU's Hopper backward reads them (at BERT's shape
//          its time fell from 0.410 to 0.360 ms on an H200: the Philox rounds), and so do the fp32 CUDA-core forward
//          and backward (ops/cuda/attention_simt.cu); every other kernel draws again. Bits of pairs that are masked
//          (causal, padding) may be left unwritten. ENGINE_FLASH_KEEP_DROPOUT=0 turns it off on every device
//          (bert_base 512 x 32 bf16: +144 MiB at the peak, 6.37 -> 6.51 GiB).
//
// Shapes: q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv] (any strides) -> out [B, H, Lq, Dv]: naive's
// contiguous; flash's in the memory order of q (new_empty_in_layout_of: heads split from [B, L, C] rows give an
// output whose heads merge back as a view), its gradients dq, dk, dv in the orders of q, k and v.
// key_padding_mask: undefined, or bool [B, Lk] where true means "this key is padding: attend to it nowhere".
//
// Masking conventions (both algorithms):
//   causal  query i attends keys j <= i + (Lk - Lq): bottom-right aligned, as flash-attention does, so that
//           with a KV cache (Lq < Lk) the last query sees every key. With Lq == Lk it is the usual j <= i.
//   fully masked rows (every key padded, or causal with Lq > Lk for the first Lq - Lk queries): the output
//           row is 0 and no gradient flows through it, never NaN. flash: the row's log-sum-exp is +inf, so
//           the recomputed probabilities exp(s - lse) are all 0. naive: such a row is left unmasked (its
//           softmax stays finite) and its output row is multiplied by 0.
// Dropout (training and dropout_p > 0) drops attention probabilities: element (b, h, i, j) is element
// ((b*H + h)*Lq + i)*Lk + j of a dropout draw (ops/dropout.h, engine/rng.h: kept iff its 16-bit number >=
// ceil(p * 2^16), then scaled by 1/(1 - p_q)), where (seed, offset) is a reservation of B*H*Lq*Lk / 2 numbers from
// engine::generator(). Both algorithms reserve and index the same way (naive through ops::dropout on its contiguous
// probabilities), so the same seed gives the same result.
//
// FLOPs: 2*B*H*Lq*Lk*(D + Dv) forward (= 4*B*H*Lq*Lk*D when Dv == D), halved when causal; flash backward
// 2*B*H*Lq*Lk*(3*D + 2*Dv) (= 2.5x forward: S is recomputed, then dV, dP, dQ, dK). naive's FLOPs are counted
// by the ops it is made of.
//
// Double backward: naive through autograd. flash: flash_attention_backward is the fused kernel when its
// result needs no graph; when it does (create_graph), it is computed by the same formulas written with
// engine ops (probabilities recomputed from q, k and the log-sum-exp), which autograd differentiates. That
// path materializes [B, H, Lq, Lk] like naive: second derivatives are for checks (R1-style penalties on
// attention models would pay naive's memory).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

enum class AttentionAlgo { naive, flash };
const char* attention_algo_name(AttentionAlgo a);          // "naive" | "flash"
AttentionAlgo attention_algo_from_name(const std::string& name);  // else an Error listing both

struct AttentionOptions {
  AttentionAlgo algo = AttentionAlgo::naive;
  bool causal = false;
  double dropout_p = 0;    // in [0, 1)
  bool training = true;    // dropout only while training
  double scale = 0;        // 0 -> 1/sqrt(D)
};

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                 const AttentionOptions& options);

// Self-attention over packed projections: qkv [B, L, 3 C] holds q, k and v side by side along its last dimension
// (the output of linear(x, {Wq, Wk, Wv}, {bq, bk, bv})), each split into `heads` heads of C / heads:
// attention(q, k, v, ...) on those head views, the same function and the same dropout draw. naive: the views are
// engine ops (slice, reshape, permute), as the separate projections would give. flash: one op whose single input
// is qkv, so that its backward returns one gradient, [B, L, 3 C], into whose three parts the kernels write dq, dk
// and dv: it feeds the stacked projection's backward without a copy, where separate gradients of three views
// would each be scattered into a zero [B, L, 3 C] tensor and summed. Saved: qkv, out and lse.
Tensor attention_packed(const Tensor& qkv, int64_t heads, const Tensor& key_padding_mask,
                        const AttentionOptions& options);

// ---------------------------------------------------------------------------------------------------
// The flash op itself (attention() with AttentionAlgo::flash calls it). Parameters passed by value, as the
// CUDA kernel will take them.
struct FlashAttentionParams {
  bool causal = false;
  double scale = 0;         // 0 -> 1/sqrt(D)
  double dropout_p = 0;     // 0: no dropout
  uint64_t seed = 0;        // where the dropout keep mask was drawn (engine::Generator reservation)
  uint64_t offset = 0;
};

// {out [B, H, Lq, Dv] (q's dtype), lse [B, H, Lq], keep}. lse is the log-sum-exp of each row of scaled, masked
// scores, in the accumulation type (f32, or f64 for f64 inputs so the f64 reference stays exact); +inf for
// a fully masked row. Both are differentiable (d lse / d s = the probabilities). keep: the dropout keep bits when
// the op keeps them (above), else undefined; for flash_attention_backward.
std::vector<Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& key_padding_mask, FlashAttentionParams params);

// {dq, dk, dv} from the gradients of out and lse (dlse may be undefined: zero). The FlashAttention-2
// backward; computed with engine ops instead when a graph of it is needed (see above). keep: the forward's keep
// bits, or undefined (the draw is then made again: the same values).
std::vector<Tensor> flash_attention_backward(const Tensor& dout, const Tensor& dlse, const Tensor& q,
                                             const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& lse, const Tensor& key_padding_mask,
                                             FlashAttentionParams params, const Tensor& keep = Tensor());

}  // namespace ops
