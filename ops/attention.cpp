// attention.cpp: attention by two algorithms (naive: engine ops; flash: the engine's tiled op), the masks
// both share, and the flash op's forward and backward (kernels in ops/cpu/attention.cpp).
#include "ops/attention.h"

#include <cmath>
#include <limits>
#include <utility>

#include "engine/env.h"
#include "ops/cpu/attention.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/attention.h"
#endif
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/matmul.h"
#include "ops/op.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/softmax.h"
#include "ops/view.h"

namespace ops {

const char* attention_algo_name(AttentionAlgo a) { return a == AttentionAlgo::flash ? "flash" : "naive"; }

AttentionAlgo attention_algo_from_name(const std::string& name) {
  if (name == "naive") return AttentionAlgo::naive;
  if (name == "flash") return AttentionAlgo::flash;
  throw engine::Error(str("attention: unknown algorithm '", name, "' (expected naive or flash)"));
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The log-sum-exp's type: the kernels' accumulation type (f64 for f64, else f32).
DType accumulation_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

double resolve_scale(double scale, int64_t D) { return scale != 0 ? scale : 1.0 / std::sqrt(double(D)); }

void check_attention_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& key_padding_mask) {
  check_dim(op, "q", q, 4);
  check_dim(op, "k", k, 4);
  check_dim(op, "v", v, 4);
  check_floating(op, "q", q);
  check_same_dtype(op, q, k);
  check_same_dtype(op, q, v);
  check_same_device(op, q, k);
  check_same_device(op, q, v);
  ENGINE_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3), op,
               ": k must be [B, H, Lk, D] for q [B, H, Lq, D] = ", engine::shape_str(q.shape()), ", got ",
               engine::shape_str(k.shape()));
  ENGINE_CHECK(v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2), op,
               ": v must be [B, H, Lk, Dv] for k [B, H, Lk, D] = ", engine::shape_str(k.shape()), ", got ",
               engine::shape_str(v.shape()));
  if (key_padding_mask.defined()) {
    check_dtype(op, "key_padding_mask", key_padding_mask, DType::boolean);
    check_same_device(op, q, key_padding_mask);
    ENGINE_CHECK(key_padding_mask.shape() == (Shape{q.size(0), k.size(2)}), op,
                 ": key_padding_mask must be [B, Lk] = [", q.size(0), ", ", k.size(2), "], got ",
                 engine::shape_str(key_padding_mask.shape()));
  }
}

// Model FLOPs of the forward: S = Q K^T and O = P V; causal attention does half the work.
double attention_forward_flops(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  double pairs = double(q.size(0) * q.size(1)) * double(q.size(2)) * double(k.size(2));
  return 2.0 * pairs * double(q.size(3) + v.size(3)) * (causal ? 0.5 : 1.0);
}

// The masked-out (query, key) pairs as a bool tensor that broadcasts to [B, H, Lq, Lk] (true = masked):
// [B, 1, 1, Lk] (padding), [Lq, Lk] (causal) or [B, 1, Lq, Lk] (both); undefined when nothing is masked.
// Built from engine ops (no gradient), identically on every device.
Tensor attention_mask(const Tensor& q, int64_t Lk, const Tensor& key_padding_mask, bool causal) {
  OpScope scope("attention_mask");
  graph::NoGrad ng;
  Tensor padded;  // [B, 1, 1, Lk]
  if (key_padding_mask.defined()) padded = reshape(key_padding_mask, {q.size(0), 1, 1, Lk});
  if (!causal) return padded;
  // Causal, bottom-right aligned: key j is after query i's diagonal when j > i + (Lk - Lq).
  const int64_t Lq = q.size(2);
  Tensor key_index = reshape(arange(Lk, DType::f32, q.device_ptr()), {1, Lk});                 // [1, Lk]
  Tensor last_key = add(reshape(arange(Lq, DType::f32, q.device_ptr()), {Lq, 1}), double(Lk - Lq));  // [Lq, 1]
  Tensor future = compare(CompareOp::gt, key_index, last_key);                                  // [Lq, Lk]
  if (!padded.defined()) return future;
  // Either masks it: max of the two as 0/1 numbers.                                             [B, 1, Lq, Lk]
  Tensor either = maximum(to(padded, DType::f32), to(future, DType::f32));
  return compare(CompareOp::gt, either, 0.5);
}

// ---------------------------------------------------------------------------------------------------
// naive: the [B, H, Lq, Lk] scores and probabilities as tensors, each op saving what it saves.

Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                       const AttentionOptions& o) {
  const double scale = resolve_scale(o.scale, q.size(3));
  const int64_t Lq = q.size(2), Lk = k.size(2);
  Tensor scores = mul(matmul(q, transpose(k, -2, -1)), scale);  // [B, H, Lq, Lk]
  Tensor masked = attention_mask(q, Lk, key_padding_mask, o.causal);
  // A row with every key masked would be softmax(-inf, ..., -inf) = NaN. Such rows (possible with padding,
  // or causal with Lq > Lk) are left unmasked here and their output multiplied by 0 below: output 0,
  // gradient 0, as flash gives.
  Tensor row_visible;  // [B or 1, 1, Lq or 1, 1]: 1 where the row sees some key, else 0
  if (masked.defined() && (key_padding_mask.defined() || Lq > Lk)) {
    graph::NoGrad ng;
    Tensor hidden = to(masked, q.dtype());
    Tensor seen = sum(add(neg(hidden), 1.0), {-1}, true);  // visible keys per row
    row_visible = to(compare(CompareOp::gt, seen, 0.5), q.dtype());
    masked = compare(CompareOp::gt, mul(hidden, row_visible), 0.5);
  }
  if (masked.defined()) scores = masked_fill(scores, masked, -kInf);
  Tensor probs = softmax(scores, -1);  // [B, H, Lq, Lk]
  // Dropout draws B*H*Lq*Lk numbers at the generator's offset, element (b, h, i, j) at its flat index in
  // the contiguous probabilities: the numbering flash uses.
  if (o.training && o.dropout_p > 0) probs = dropout(probs, o.dropout_p);
  Tensor out = matmul(probs, v);  // [B, H, Lq, Dv]
  return row_visible.defined() ? mul(out, row_visible) : out;
}

// ---------------------------------------------------------------------------------------------------
// flash backward as engine ops: the same formulas as the kernel (ops/cpu/attention.cpp), with the
// [B, H, Lq, Lk] tiles as whole tensors. Used when the gradient must itself be differentiable.

std::vector<Tensor> flash_attention_backward_composite(const Tensor& dout, const Tensor& dlse, const Tensor& q,
                                                       const Tensor& k, const Tensor& v, const Tensor& out,
                                                       const Tensor& lse, const Tensor& key_padding_mask,
                                                       const FlashAttentionParams& p) {
  Tensor scores = mul(matmul(q, transpose(k, -2, -1)), p.scale);  // S [B, H, Lq, Lk]
  Tensor masked = attention_mask(q, k.size(2), key_padding_mask, p.causal);
  if (masked.defined()) scores = masked_fill(scores, masked, -kInf);
  // P = exp(S - lse), in lse's type; lse = +inf on a fully masked row makes it 0.
  Tensor probs = to(exp(sub(to(scores, lse.dtype()), unsqueeze(lse, -1))), q.dtype());  // [B, H, Lq, Lk]
  Tensor dprobs = matmul(dout, transpose(v, -2, -1));                                   // dO V^T
  Tensor kept = probs;                                                                  // P∘Z
  if (p.dropout_p > 0) {
    kept = dropout_mask_apply(probs, p.dropout_p, p.seed, p.offset);  // the forward's draw, regenerated
    dprobs = dropout_mask_apply(dprobs, p.dropout_p, p.seed, p.offset);
  }
  Tensor delta = sum(mul(dout, out), {-1}, true);  // [B, H, Lq, 1]
  if (dlse.defined()) delta = sub(delta, to(unsqueeze(dlse, -1), delta.dtype()));
  Tensor dscores = mul(probs, sub(dprobs, delta));  // dS = P∘(dP - delta)
  Tensor dq = mul(matmul(dscores, k), p.scale);
  Tensor dk = mul(matmul(transpose(dscores, -2, -1), q), p.scale);
  Tensor dv = matmul(transpose(kept, -2, -1), dout);
  return {dq, dk, dv};
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// flash

namespace {

// The short keys of a head, for which flash keeps what its backward would otherwise recompute (ops/attention.h): the
// types and head dims of the GPU kernels that use them (the tensor cores' bf16/f16 at 64 or 128, the fp32 CUDA-core
// kernels' f32 at 64), and [Lq, Lk] rounded up to 64 x 64 at most 8 times q's [Lq, D]. A function of the shapes
// alone, so that every device allocates the same buffers and meta holds what the GPU holds.
bool short_keys(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t Lq = q.size(2), Lk = k.size(2), D = q.size(3);
  const DType t = q.dtype();
  const bool kernels = D == v.size(3) && (((t == DType::bf16 || t == DType::f16) && (D == 64 || D == 128)) ||
                                          (t == DType::f32 && D == 64));
  const int64_t rows = (Lq + 63) / 64 * 64, cols = (Lk + 63) / 64 * 64;
  return kernels && Lq > 0 && Lk > 0 && rows * cols <= 8 * Lq * D;
}

// The shape of the forward's dropout keep bits (ops/attention.h): [B, H, Lq, Lk rounded up to 64, over 8] bytes.
Shape keep_bits_shape(const Tensor& q, const Tensor& k) {
  return {q.size(0), q.size(1), q.size(2), (k.size(2) + 63) / 64 * 8};
}

// The keep bits, u8, for short keys with dropout whose draw's Philox blocks start on 8 keys (the offset a multiple of
// 4, Lk of 8), unless ENGINE_FLASH_KEEP_DROPOUT=0; else undefined.
Tensor kept_dropout_bits(const Tensor& q, const Tensor& k, const Tensor& v, const FlashAttentionParams& p) {
  if (!(p.dropout_p > 0) || !short_keys(q, k, v) || k.size(2) % 8 != 0 || p.offset % 4 != 0) return Tensor();
  if (!engine::env_switch("ENGINE_FLASH_KEEP_DROPOUT", true, "flash attention's backward draws its dropout again",
                          "the forward keeps its dropout decisions for short keys"))
    return Tensor();
  return new_empty(q, keep_bits_shape(q, k), DType::u8);
}

// The forward kernels: {out in q's layout, lse, keep bits or undefined}. Inputs checked by the caller, params.scale
// resolved.
std::vector<Tensor> flash_forward_kernels(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& pad,
                                          const FlashAttentionParams& params) {
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), Dv = v.size(3);
  Tensor out = new_empty_in_layout_of(q, {B, H, Lq, Dv}, q.dtype());       // [B, H, Lq, Dv] in q's layout
  Tensor lse = new_empty(q, {B, H, Lq}, accumulation_dtype(q.dtype()));    // [B, H, Lq]
  Tensor keep = kept_dropout_bits(q, k, v, params);                        // [B, H, Lq, W] or undefined
  run_kernel("flash_attention", out, [&] { cpu::flash_attention_forward({q, k, v, pad}, params, out, lse, keep); },
             CUDA_KERNEL(cuda::flash_attention_forward({q, k, v, pad}, params, out, lse, keep)));
  engine::count_op("flash_attention", attention_forward_flops(q, k, v, params.causal),
                   double(q.nbytes() + k.nbytes() + v.nbytes() + out.nbytes() + lse.nbytes() +
                          (keep.defined() ? keep.nbytes() : 0)));
  return {out, lse, keep};
}

void check_dropout_p(const char* op, double p) {
  ENGINE_CHECK(p >= 0 && p < 1, op, ": dropout_p must be in [0, 1), got ", p);
}

}  // namespace

std::vector<Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& key_padding_mask, FlashAttentionParams params) {
  OpScope scope("flash_attention");
  check_attention_inputs("flash_attention", q, k, v, key_padding_mask);
  check_dropout_p("flash_attention", params.dropout_p);
  params.scale = resolve_scale(params.scale, q.size(3));
  Tensor pad = key_padding_mask.defined() ? contiguous(key_padding_mask) : Tensor();
  std::vector<Tensor> f = flash_forward_kernels(q, k, v, pad, params);  // out, lse, keep bits
  if (graph::any_requires_grad({q, k, v})) {
    // Saved: q, k, v (inputs, alive anyway in a model), out and lse: O(L) bytes; the keep bits when kept.
    graph::record("flash_attention", {q, k, v}, {f[0], f[1]}, {q, k, v, f[0], f[1], f[2]},
                  [pad, params](Node& n, const Grads& g) -> Grads {
                    return flash_attention_backward(g[0], g[1], n.saved(0), n.saved(1), n.saved(2), n.saved(3),
                                                    n.saved(4), pad, params, n.saved(5));
                  });
  }
  return f;
}

namespace {

// The backward kernels, writing dq, dk and dv (allocated by the caller, any strides). Inputs checked by the
// caller, params.scale resolved; pad contiguous or undefined.
// The dS buffer of flash's backward (ops/attention.h): [B*H, Lq, Lk] rounded up to 64 x 64, of q's type, for short
// keys; else undefined. ENGINE_FLASH_KEEP_DS=0 in the environment keeps none (dQ recomputed at every length), on every
// device alike: for measuring the two ways against each other (tools/bench/transformer_gpu.sh variants); read at
// each call.
Tensor kept_ds(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!short_keys(q, k, v) || !engine::env_switch("ENGINE_FLASH_KEEP_DS", true,
                                                  "flash attention's backward recomputes dS for dQ",
                                                  "it keeps dS for short keys"))
    return Tensor();
  return new_workspace(q, {q.size(0) * q.size(1), (q.size(2) + 63) / 64 * 64, (k.size(2) + 63) / 64 * 64}, q.dtype(),
                       "dS of every query and key, kept for dQ");
}

// dQ's sums of flash's backward (ops/attention.h): f32 [B*H, Lq, D] and their turn counters i32 [B*H, ceil(Lq / 64)],
// with ENGINE_FLASH_DQ_SUMS=1 in the environment, for bf16/f16 at D == Dv == 128 when dS is not kept; else undefined
// (a dQ pass recomputes S and dP: faster on an H100 today, BENCHMARKS.md), on every device alike; read at each call.
std::pair<Tensor, Tensor> dq_sums_workspace(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& ds) {
  const int64_t BH = q.size(0) * q.size(1), Lq = q.size(2), D = q.size(3);
  const bool kernels = (q.dtype() == DType::bf16 || q.dtype() == DType::f16) && D == 128 && v.size(3) == 128;
  if (ds.defined() || !kernels || Lq == 0 || k.size(2) == 0 ||
      !engine::env_switch("ENGINE_FLASH_DQ_SUMS", false, "flash attention's backward recomputes S and dP for dQ",
                          "its dK dV pass adds dQ's products to f32 sums"))
    return {};
  return {new_workspace(q, {BH, Lq, D}, DType::f32, "dQ's f32 sums, added to in key order"),
          new_workspace(q, {BH, (Lq + 63) / 64}, DType::i32, "dQ's sums' turn per query tile")};
}

void flash_backward_into(const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse, const Tensor& pad, const FlashAttentionParams& params,
                         const Tensor& keep, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const char* name = "flash_attention_backward";
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), Dv = v.size(3);
  const DType acc = accumulation_dtype(q.dtype());
  Tensor lse_c = contiguous(lse);
  Tensor dlse_c = dlse.defined() ? contiguous(to(dlse, acc)) : Tensor();
  Tensor delta = new_empty(q, {B, H, Lq}, acc);  // [B, H, Lq] rowsum(dO∘O) - dlse
  Tensor ds = kept_ds(q, k, v);                  // (ops/attention.h: dS for the GPU's dQ, short keys only)
  const std::pair<Tensor, Tensor> sums = dq_sums_workspace(q, k, v, ds);  // (the same: dQ's sums, dS not kept)
  run_kernel(
      name, dq,
      [&] {
        cpu::flash_attention_backward({q, k, v, pad}, params, out, lse_c, dout, dlse_c, delta, dq, dk, dv);
      },
      CUDA_KERNEL(cuda::flash_attention_backward({q, k, v, pad}, params, out, lse_c, dout, dlse_c, delta, ds,
                                                 sums.first, sums.second, keep, dq, dk, dv)));
  // S recomputed, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q.
  double fwd = attention_forward_flops(q, k, v, params.causal);
  double flops = fwd * double(3 * q.size(3) + 2 * Dv) / double(q.size(3) + Dv);
  engine::count_op(name, flops,
                   double(q.nbytes() + k.nbytes() + v.nbytes() + out.nbytes() + dout.nbytes() + lse.nbytes() +
                          dq.nbytes() + dk.nbytes() + dv.nbytes()));
}

}  // namespace

std::vector<Tensor> flash_attention_backward(const Tensor& dout, const Tensor& dlse, const Tensor& q,
                                             const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& lse, const Tensor& key_padding_mask,
                                             FlashAttentionParams params, const Tensor& keep) {
  const char* name = "flash_attention_backward";
  OpScope scope(name);
  check_attention_inputs(name, q, k, v, key_padding_mask);
  params.scale = resolve_scale(params.scale, q.size(3));
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), Dv = v.size(3);
  const DType acc = accumulation_dtype(q.dtype());
  ENGINE_CHECK(out.shape() == (Shape{B, H, Lq, Dv}) && dout.shape() == out.shape(), name,
               ": out and dout must be [B, H, Lq, Dv] = ", engine::shape_str({B, H, Lq, Dv}), ", got ",
               engine::shape_str(out.shape()), " and ", engine::shape_str(dout.shape()));
  ENGINE_CHECK(lse.shape() == (Shape{B, H, Lq}) && lse.dtype() == acc, name, ": lse must be ",
               engine::dtype_name(acc), " [B, H, Lq] = ", engine::shape_str({B, H, Lq}), ", got ",
               engine::dtype_name(lse.dtype()), " ", engine::shape_str(lse.shape()));
  ENGINE_CHECK(!dlse.defined() || dlse.shape() == lse.shape(), name, ": dlse must be ",
               engine::shape_str(lse.shape()), ", got ", engine::shape_str(dlse.shape()));
  check_same_dtype(name, q, dout);
  check_same_dtype(name, q, out);

  // The gradient will be differentiated again (create_graph): compute it with engine ops.
  if (graph::any_requires_grad({dout, dlse, q, k, v, out, lse}))
    return flash_attention_backward_composite(dout, dlse, q, k, v, out, lse, key_padding_mask, params);

  Tensor pad = key_padding_mask.defined() ? contiguous(key_padding_mask) : Tensor();
  // The gradients in the layouts of q, k and v (a [B, L, H, D] split stays one: its merge is a view).
  Tensor dq = new_empty_in_layout_of(q, q.shape(), q.dtype());  // [B, H, Lq, D]
  Tensor dk = new_empty_in_layout_of(k, k.shape(), q.dtype());  // [B, H, Lk, D]
  Tensor dv = new_empty_in_layout_of(v, v.shape(), q.dtype());  // [B, H, Lk, Dv]
  if (keep.defined()) {
    const Shape want = keep_bits_shape(q, k);
    check_dtype(name, "keep", keep, DType::u8);
    check_same_device(name, q, keep);
    ENGINE_CHECK(keep.shape() == want && keep.is_contiguous(), name, ": keep must be the forward's keep bits, ",
                 "contiguous ", engine::shape_str(want), ", got ", engine::shape_str(keep.shape()),
                 ": pass flash_attention_forward's third result, or nothing");
  }
  flash_backward_into(dout, dlse, q, k, v, out, lse, pad, params, keep, dq, dk, dv);
  return {dq, dk, dv};
}

// ---------------------------------------------------------------------------------------------------
// The entry point

namespace {

// The flash op's parameters for attention()'s options, the dropout draw reserved as naive's dropout reserves it
// on its [B, H, Lq, Lk] probabilities.
FlashAttentionParams flash_params(const AttentionOptions& options, const Tensor& q, const Tensor& k) {
  FlashAttentionParams params;
  params.causal = options.causal;
  params.scale = resolve_scale(options.scale, q.size(3));
  if (options.training && options.dropout_p > 0) {
    const DropoutDraw draw = reserve_dropout_draw(uint64_t(q.size(0) * q.size(1) * q.size(2)) * uint64_t(k.size(2)));
    params.dropout_p = options.dropout_p;
    params.seed = draw.seed;
    params.offset = draw.offset;
  }
  return params;
}

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                 const AttentionOptions& options) {
  check_attention_inputs("attention", q, k, v, key_padding_mask);
  check_dropout_p("attention", options.dropout_p);
  if (options.algo == AttentionAlgo::naive) return naive_attention(q, k, v, key_padding_mask, options);
  return flash_attention_forward(q, k, v, key_padding_mask, flash_params(options, q, k))[0];
}

// ---------------------------------------------------------------------------------------------------
// Self-attention over packed projections

namespace {

// Part `part` (0: q, 1: k, 2: v) of qkv [B, L, 3 C] (unit stride along C) as heads [B, H, L, C / H]: a view with
// strides, recorded by no op (the packed op records itself).
Tensor packed_heads(const Tensor& qkv, int part, int64_t heads) {
  const int64_t B = qkv.size(0), L = qkv.size(1), C = qkv.size(2) / 3, D = C / heads;
  return Tensor::view_of(qkv, {B, heads, L, D}, {qkv.strides()[0], D, qkv.strides()[1], 1}, qkv.offset() + part * C);
}

// The same part through engine ops (slice, reshape, permute), so that autograd differentiates it.
Tensor packed_heads_op(const Tensor& qkv, int part, int64_t heads) {
  const int64_t B = qkv.size(0), L = qkv.size(1), C = qkv.size(2) / 3;
  return permute(reshape(slice(qkv, 2, part * C, (part + 1) * C), {B, L, heads, C / heads}), {0, 2, 1, 3});
}

}  // namespace

Tensor attention_packed(const Tensor& qkv, int64_t heads, const Tensor& key_padding_mask,
                        const AttentionOptions& options) {
  check_dim("attention_packed", "qkv", qkv, 3);
  ENGINE_CHECK(heads >= 1 && qkv.size(2) % (3 * heads) == 0, "attention_packed: qkv ", engine::shape_str(qkv.shape()),
               ": its last dimension must be 3 x heads (", heads, ") x the head dimension (q, k and v side by side)");
  if (options.algo == AttentionAlgo::naive)
    return attention(packed_heads_op(qkv, 0, heads), packed_heads_op(qkv, 1, heads), packed_heads_op(qkv, 2, heads),
                     key_padding_mask, options);
  OpScope scope("flash_attention");
  Tensor x = qkv.strides()[2] == 1 ? qkv : contiguous(qkv);
  const Tensor q = packed_heads(x, 0, heads), k = packed_heads(x, 1, heads), v = packed_heads(x, 2, heads);
  check_attention_inputs("attention_packed", q, k, v, key_padding_mask);
  check_dropout_p("attention_packed", options.dropout_p);
  const FlashAttentionParams params = flash_params(options, q, k);
  Tensor pad = key_padding_mask.defined() ? contiguous(key_padding_mask) : Tensor();
  std::vector<Tensor> f = flash_forward_kernels(q, k, v, pad, params);  // out, lse, keep bits
  if (graph::any_requires_grad({x})) {
    // Saved: qkv (alive anyway: the projection's output), out and lse, as the unpacked op saves q, k, v, and the keep
    // bits when kept. lse is an output of the node (not returned), so that second derivatives see its dependence on
    // qkv.
    graph::record("flash_attention", {x}, {f[0], f[1]}, {x, f[0], f[1], f[2]},
                  [pad, params, heads](Node& n, const Grads& g) -> Grads {
                    Tensor x = n.saved(0), out = n.saved(1), lse = n.saved(2), keep = n.saved(3);
                    if (graph::any_requires_grad({g[0], x, out, lse})) {  // create_graph: engine ops throughout
                      std::vector<Tensor> d = flash_attention_backward(
                          g[0], g[1], packed_heads_op(x, 0, heads), packed_heads_op(x, 1, heads),
                          packed_heads_op(x, 2, heads), out, lse, pad, params);
                      for (Tensor& t : d) t = reshape(permute(t, {0, 2, 1, 3}), {x.size(0), x.size(1), -1});
                      return {concat(d, 2)};
                    }
                    // One gradient for the packed input: the kernels write dq, dk, dv into its three parts.
                    Tensor dx = new_empty_in_layout_of(x, x.shape(), x.dtype());
                    flash_backward_into(g[0], g[1], packed_heads(x, 0, heads), packed_heads(x, 1, heads),
                                        packed_heads(x, 2, heads), out, lse, pad, params, keep,
                                        packed_heads(dx, 0, heads),
                                        packed_heads(dx, 1, heads), packed_heads(dx, 2, heads));
                    return {dx};
                  });
  }
  return f[0];
}

}  // namespace ops
