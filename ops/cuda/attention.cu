// cuda/attention.cu: the entry points of the flash attention kernels on the GPU: the op's tensors become
// one FlashArgs struct (passed by value to every kernel), and each call picks its path:
//
//   tensor cores (attention_fwd.cu, attention_bwd.cu) when the dtype is bf16 or f16, D == Dv is 64 or 128,
//     scale > 0, the GPU is sm_80 or later, and q, k, v (and dout) have unit-stride, 16-byte aligned rows
//     (every [B, H, L, D] view of a contiguous [B, L, H, D] projection qualifies: no copy is ever made);
//   fp32 CUDA cores (attention_simt.cu) for f32 at D == Dv == 64 with the same 16-byte rows;
//   generic (attention_generic.cu) otherwise: any dtype, head dim and strides.
// All compute the cpu reference's function (ops/cpu/attention.cpp) with the same masks and dropout draw.
#include "ops/cuda/attention.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/cuda/runtime.h"
#include "ops/cuda/attention_common.cuh"

namespace ops::cuda {

using engine::DType;

namespace {

// The tile configurations in use: the defaults, or ENGINE_FLASH_TUNING="F,B" (the forward's and the backward's
// variant, -1 for the default; attention.h), read at the first call, so that a whole model's step can be measured
// with a configuration that is not the default (tools/bench/transformer_gpu.sh variants).
FlashTuning& tuning() {
  static FlashTuning t = [] {
    FlashTuning env;
    const char* s = std::getenv("ENGINE_FLASH_TUNING");
    if (!s || !*s) return env;
    char comma = 0;
    int end = 0;
    ENGINE_CHECK(
        std::sscanf(s, " %d %c %d %n", &env.forward, &comma, &env.backward, &end) == 3 && comma == ',' && s[end] == 0,
        "ENGINE_FLASH_TUNING=\"", s, "\": expected the forward's and the backward's variant as F,B (e.g. 3,3; ",
        "-1 for a default); unset it for the defaults");
    return env;
  }();
  return t;
}

attn::Strides strides_of(const Tensor& t) {
  return {t.strides()[0], t.strides()[1], t.strides()[2], t.strides()[3]};
}

// Rows the tensor-core kernels can copy 16 bytes at a time: unit stride along D, 16-byte aligned start,
// and every other stride a multiple of 8 elements (dimensions of size 1 have no stride that matters).
bool rows_are_16_byte_vectors(const Tensor& t) {
  if (t.strides()[3] != 1) return false;
  if ((reinterpret_cast<uintptr_t>(t.data_ptr()) & 15u) != 0) return false;
  for (int d = 0; d < 3; d++)
    if (t.size(d) > 1 && t.strides()[size_t(d)] % 8 != 0) return false;
  return true;
}

// Every tensor a kernel reads or writes (the inputs, and the outputs and dout in `rows`) made of 16-byte rows.
bool all_rows_are_16_byte_vectors(const cpu::FlashAttentionInputs& in, std::initializer_list<const Tensor*> rows) {
  for (const Tensor* x : {&in.q, &in.k, &in.v})
    if (!rows_are_16_byte_vectors(*x)) return false;
  for (const Tensor* x : rows)
    if (!rows_are_16_byte_vectors(*x)) return false;
  return true;
}

// The tensor-core kernels: bf16/f16, D == Dv in {64, 128}, 16-byte rows.
bool use_tensor_cores(const cpu::FlashAttentionInputs& in, const FlashAttentionParams& p,
                      std::initializer_list<const Tensor*> rows) {
  const DType t = in.q.dtype();
  if (t != DType::bf16 && t != DType::f16) return false;
  const int64_t D = in.q.size(3);
  if (D != in.v.size(3) || (D != 64 && D != 128)) return false;
  if (!(p.scale > 0)) return false;  // the kernels take the row max of unscaled scores
  if (engine::cuda::compute_capability() < 80) return false;
  return all_rows_are_16_byte_vectors(in, rows);
}

// The fp32 CUDA-core kernels: f32, 16-byte rows, and attn::simt_applies (head dim 64).
bool use_simt(const cpu::FlashAttentionInputs& in, const attn::FlashArgs& a,
              std::initializer_list<const Tensor*> rows) {
  return in.q.dtype() == DType::f32 && attn::simt_applies(a) && all_rows_are_16_byte_vectors(in, rows);
}

attn::FlashArgs make_args(const cpu::FlashAttentionInputs& in, const FlashAttentionParams& p) {
  constexpr int64_t kIntMax = 2147483647;
  for (int d = 0; d < 4; d++)
    ENGINE_CHECK(in.q.size(d) <= kIntMax && in.k.size(d) <= kIntMax && in.v.size(d) <= kIntMax,
                 "flash_attention (cuda): every dimension must be below 2^31, got q ", engine::shape_str(in.q.shape()),
                 ", k ", engine::shape_str(in.k.shape()));
  attn::FlashArgs a;
  a.q = in.q.data_ptr();
  a.k = in.k.data_ptr();
  a.v = in.v.data_ptr();
  a.pad = in.key_padding_mask.defined() ? static_cast<const uint8_t*>(in.key_padding_mask.data_ptr()) : nullptr;
  a.qs = strides_of(in.q);
  a.ks = strides_of(in.k);
  a.vs = strides_of(in.v);
  a.B = int(in.q.size(0));
  a.H = int(in.q.size(1));
  a.Lq = int(in.q.size(2));
  a.Lk = int(in.k.size(2));
  a.D = int(in.q.size(3));
  a.Dv = int(in.v.size(3));
  a.causal = p.causal;
  a.scale = float(p.scale);
  a.scale_f64 = p.scale;
  a.scale_log2 = float(p.scale * 1.4426950408889634);
  if (p.dropout_p > 0) {
    const engine::DropoutRate rate = engine::dropout_rate(p.dropout_p);  // the cpu's threshold and scale
    a.dropout = true;
    a.keep_threshold = rate.threshold;
    a.keep_scale = float(rate.keep_scale);
    a.keep_scale_f64 = rate.keep_scale;
    a.seed = p.seed;
    a.offset = p.offset;
  }
  return a;
}

}  // namespace

void flash_attention_forward(const cpu::FlashAttentionInputs& in, const FlashAttentionParams& params,
                             const Tensor& out, const Tensor& lse, const Tensor& keep) {
  attn::FlashArgs a = make_args(in, params);
  a.out = out.data_ptr();
  a.outs = strides_of(out);
  a.lse = lse.data_ptr();
  if (keep.defined()) {
    a.keep_out = static_cast<uint8_t*>(keep.data_ptr());
    a.keep_ld = int(keep.size(3));
  }
  if (int64_t(a.B) * a.H * a.Lq == 0) return;
  // The keep bits: written by the Hopper forward as it draws them (shared draws), else by a kernel of their own.
  if (use_tensor_cores(in, params, {&out}) &&
      attn::launch_forward_tensor_core(a, in.q.dtype() == DType::bf16, tuning().forward))
    return;
  if (a.keep_out) attn::launch_keep_bits(a);
  if (use_simt(in, a, {&out})) return attn::launch_forward_simt(a);
  attn::launch_forward_generic(a, int(in.q.dtype()));
}

void flash_attention_backward(const cpu::FlashAttentionInputs& in, const FlashAttentionParams& params,
                              const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                              const Tensor& delta, const Tensor& ds, const Tensor& dq_sums, const Tensor& dq_turns,
                              const Tensor& keep, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  attn::FlashArgs a = make_args(in, params);
  if (keep.defined()) {
    a.keep_in = static_cast<const uint8_t*>(keep.data_ptr());
    a.keep_ld = int(keep.size(3));
  }
  a.o = out.data_ptr();
  a.os = strides_of(out);
  a.dout = dout.data_ptr();
  a.dos = strides_of(dout);
  a.lse = lse.data_ptr();
  a.dlse = dlse.defined() ? dlse.data_ptr() : nullptr;
  a.delta = delta.data_ptr();
  a.dq = dq.data_ptr();
  a.dk = dk.data_ptr();
  a.dv = dv.data_ptr();
  a.dqs = strides_of(dq);
  a.dks = strides_of(dk);
  a.dvs = strides_of(dv);
  if (ds.defined()) {
    ENGINE_CHECK(ds.dim() == 3 && ds.size(0) == int64_t(a.B) * a.H && ds.size(1) % 64 == 0 && ds.size(1) >= a.Lq &&
                     ds.size(2) % 64 == 0 && ds.size(2) >= a.Lk && ds.is_contiguous() && ds.dtype() == in.q.dtype(),
                 "flash_attention_backward (cuda): ds must be [B * H, Lq, Lk] rounded up to 64, contiguous, of q's "
                 "type; got ",
                 engine::shape_str(ds.shape()));
    a.ds = ds.data_ptr();
    a.ds_rows = ds.size(1);
    a.ds_ld = ds.size(2);
  }
  if (dq_sums.defined()) {
    const int64_t rows = int64_t(a.B) * a.H, tiles = (a.Lq + 63) / 64;
    ENGINE_CHECK(dq_sums.shape() == (engine::Shape{rows, a.Lq, a.D}) && dq_sums.dtype() == DType::f32 &&
                     dq_sums.is_contiguous() && dq_turns.shape() == (engine::Shape{rows, tiles}) &&
                     dq_turns.dtype() == DType::i32 && dq_turns.is_contiguous(),
                 "flash_attention_backward (cuda): dq_sums must be f32 [B * H, Lq, D] and dq_turns i32 [B * H, "
                 "ceil(Lq / 64)], contiguous; got ",
                 engine::shape_str(dq_sums.shape()), " and ", engine::shape_str(dq_turns.shape()));
    a.dq_sums = static_cast<float*>(dq_sums.data_ptr());
    a.dq_turns = static_cast<uint32_t*>(dq_turns.data_ptr());
  }
  if (int64_t(a.B) * a.H == 0) return;
  attn::launch_backward_delta(a, int(in.q.dtype()));
  if (use_tensor_cores(in, params, {&dout, &dq, &dk, &dv}) &&
      attn::launch_backward_tensor_core(a, in.q.dtype() == DType::bf16, tuning().backward))
    return;
  if (use_simt(in, a, {&dout, &dq, &dk, &dv})) return attn::launch_backward_simt(a);
  attn::launch_backward_generic(a, int(in.q.dtype()));
}

void set_flash_tuning(FlashTuning t) { tuning() = t; }
int flash_forward_variants(int head_dim) { return attn::forward_tensor_core_variants(head_dim); }
int flash_backward_variants(int head_dim) { return attn::backward_tensor_core_variants(head_dim); }
std::string flash_forward_variant_name(int head_dim, int variant) {
  return attn::forward_tensor_core_name(head_dim, variant);
}
std::string flash_backward_variant_name(int head_dim, int variant) {
  return attn::backward_tensor_core_name(head_dim, variant);
}

}  // namespace ops::cuda
