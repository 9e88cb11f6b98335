// cuda/attention.cu: the entry points of the flash attention kernels on the GPU: the op's tensors become
// one FlashArgs struct (passed by value to every kernel), and each call picks its path:
//
//   tensor cores (attention_fwd.cu, attention_bwd.cu) when the dtype is bf16 or f16, D == Dv is 64 or 128,
//     scale > 0, the GPU is sm_80 or later, and q, k, v (and dout) have unit-stride, 16-byte aligned rows
//     (every [B, H, L, D] view of a contiguous [B, L, H, D] projection qualifies: no copy is ever made);
//   generic (attention_generic.cu) otherwise: any dtype, head dim and strides.
// Both compute the cpu reference's function (ops/cpu/attention.cpp) with the same masks and dropout decisions:
// the op's keep mask (keep_mask_kernel draws it before the forward, the cpu's bits), or drawn in the kernels.
#include "ops/cuda/attention.h"

#include <cmath>
#include <string>

#include "engine/cuda/runtime.h"
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/kernel_util.cuh"

namespace ops::cuda {

using engine::DType;

namespace {

FlashTuning g_tuning;

attn::Strides strides_of(const Tensor& t) {
  return {t.strides()[0], t.strides()[1], t.strides()[2], t.strides()[3]};
}

int compute_capability_major() {
  static const int major = [] {
    int v = 0;
    ENGINE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0));
    return v;
  }();
  return major;
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

// The tensor-core kernels: bf16/f16, D == Dv in {64, 128}, and every tensor they read or write (inputs, and the
// outputs and dout in `rows`) made of 16-byte rows.
bool use_tensor_cores(const cpu::FlashAttentionInputs& in, const FlashAttentionParams& p,
                      std::initializer_list<const Tensor*> rows) {
  const DType t = in.q.dtype();
  if (t != DType::bf16 && t != DType::f16) return false;
  const int64_t D = in.q.size(3);
  if (D != in.v.size(3) || (D != 64 && D != 128)) return false;
  if (!(p.scale > 0)) return false;  // the kernels take the row max of unscaled scores
  if (compute_capability_major() < 8) return false;
  for (const Tensor* x : {&in.q, &in.k, &in.v})
    if (!rows_are_16_byte_vectors(*x)) return false;
  for (const Tensor* x : rows)
    if (!rows_are_16_byte_vectors(*x)) return false;
  return true;
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
    if (in.keep.defined()) {  // the op's mask (flash_saves_keep_mask), else the kernels draw the bits
      a.keep = static_cast<const uint8_t*>(in.keep.data_ptr());
      a.keep_row = in.keep.size(3);
    }
    a.keep_threshold = rate.threshold;
    a.keep_scale = float(rate.keep_scale);
    a.keep_scale_f64 = rate.keep_scale;
    a.seed = p.seed;
    a.offset = p.offset;
  }
  return a;
}

// One thread per 32-bit word of the mask (32 keys of a row: bit e = key 32 w + e), every bit the cpu's
// engine::dropout_bits(seed, offset, row * Lk + j) >= threshold, 0 past Lk. A word's 32 draws are 4 Philox blocks
// (5 when Lk is not a multiple of 8 and the row's draws do not start on a block). Bound by the Philox rounds'
// integer multiplies, not by the mask's bytes (1/16 of a bf16 probability's).
__global__ void keep_mask_kernel(const attn::FlashArgs a, int64_t rows, uint32_t* keep) {
  const int64_t words = a.keep_row / 4, total = rows * words;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / words, j0 = 32 * (t - r * words);
    const int64_t n = min(int64_t(32), int64_t(a.Lk) - j0);  // keys of this word
    uint32_t bits = 0;
    if (n > 0) {
      const uint64_t h0 = 2 * a.offset + uint64_t(r) * uint64_t(a.Lk) + uint64_t(j0);  // in 16-bit halves
      for (uint64_t blk = h0 >> 3; blk <= (h0 + uint64_t(n) - 1) >> 3; blk++) {
        uint32_t x[4];
        engine::philox4x32_10(a.seed, blk, x);
#pragma unroll
        for (uint32_t k = 0; k < 8; k++) {
          const int64_t e = int64_t(blk * 8 + k) - int64_t(h0);
          if (e >= 0 && e < n) bits |= uint32_t(engine::philox_half(x, k) >= a.keep_threshold) << e;
        }
      }
    }
    keep[t] = bits;
  }
}

}  // namespace

void flash_attention_keep_mask(const FlashAttentionParams& params, int64_t Lk, const Tensor& keep) {
  ENGINE_CHECK(params.dropout_p > 0 && keep.dtype() == DType::u8 && keep.dim() == 4 && keep.is_contiguous() &&
                   keep.size(3) == flash_keep_row_bytes(Lk),
               "flash_attention (cuda): the keep mask must be contiguous u8 [B, H, Lq, ", flash_keep_row_bytes(Lk),
               "], got ", engine::dtype_name(keep.dtype()), " ", engine::shape_str(keep.shape()));
  const int64_t rows = keep.size(0) * keep.size(1) * keep.size(2);
  if (rows == 0) return;
  attn::FlashArgs a;
  a.Lk = int(Lk);
  a.keep_row = keep.size(3);
  a.keep_threshold = engine::dropout_rate(params.dropout_p).threshold;
  a.seed = params.seed;
  a.offset = params.offset;
  keep_mask_kernel<<<grid_for(rows * (a.keep_row / 4), 256), 256, 0, engine::cuda::stream()>>>(
      a, rows, static_cast<uint32_t*>(keep.data_ptr()));
  ENGINE_CUDA_LAUNCH_CHECK("flash_attention (dropout keep mask)");
}

void flash_attention_forward(const cpu::FlashAttentionInputs& in, const FlashAttentionParams& params,
                             const Tensor& out, const Tensor& lse) {
  attn::FlashArgs a = make_args(in, params);
  a.out = out.data_ptr();
  a.outs = strides_of(out);
  a.lse = lse.data_ptr();
  if (int64_t(a.B) * a.H * a.Lq == 0) return;
  if (use_tensor_cores(in, params, {&out}) &&
      attn::launch_forward_tensor_core(a, in.q.dtype() == DType::bf16, g_tuning.forward))
    return;
  attn::launch_forward_generic(a, int(in.q.dtype()));
}

void flash_attention_backward(const cpu::FlashAttentionInputs& in, const FlashAttentionParams& params,
                              const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                              const Tensor& delta, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  attn::FlashArgs a = make_args(in, params);
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
  if (int64_t(a.B) * a.H == 0) return;
  attn::launch_backward_delta(a, int(in.q.dtype()));
  if (use_tensor_cores(in, params, {&dout, &dq, &dk, &dv}) &&
      attn::launch_backward_tensor_core(a, in.q.dtype() == DType::bf16, g_tuning.backward))
    return;
  attn::launch_backward_generic(a, int(in.q.dtype()));
}

void set_flash_tuning(FlashTuning t) { g_tuning = t; }
int flash_forward_variants(int head_dim) { return attn::forward_tensor_core_variants(head_dim); }
int flash_backward_variants(int head_dim) { return attn::backward_tensor_core_variants(head_dim); }
std::string flash_forward_variant_name(int head_dim, int variant) {
  return attn::forward_tensor_core_name(head_dim, variant);
}
std::string flash_backward_variant_name(int head_dim, int variant) {
  return attn::backward_tensor_core_name(head_dim, variant);
}

}  // namespace ops::cuda
