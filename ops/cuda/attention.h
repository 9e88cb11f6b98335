// cuda/attention.h: the GPU kernels of the flash attention op (FlashAttention-2), with the contract of
// ops/cpu/attention.h: same arguments, same results (up to rounding), same buffers filled.
//
// Two paths, chosen per call (ops/cuda/attention.cu says when):
//   tensor cores  bf16/f16, head dim 64 or 128 (D == Dv), rows of q, k, v (and dout) unit-stride and
//                 16-byte aligned: mma.sync m16n8k16 with ldmatrix, f32 accumulation (sm_80 and later); on
//                 sm_90a builds with a compute capability 9.0 GPU, wgmma kernels (attention_*_wgmma.cu; at head dim
//                 128 the forward is warp-specialized, fed by TMA: attention_fwd_tma.cu).
//   generic       every other case (f32, f64, other head dims, any strides, older GPUs): tiled kernels on
//                 the CUDA cores, computing in acc_t (f32, or f64 for f64) like the cpu reference.
// The backward is deterministic on both paths: dK and dV by key tiles, dQ by query tiles (a second pass
// that recomputes the probabilities), so no atomics and bit-identical results from run to run.
#pragma once
#include "engine/tensor.h"
#include "ops/attention.h"
#include "ops/cpu/attention.h"

namespace ops::cuda {

using engine::Tensor;

// out [B, H, Lq, Dv] with unit-stride rows; lse [B, H, Lq] (accumulation type) contiguous; keep undefined or the
// dropout keep bits (ops/attention.h), written for every visible pair: by the Hopper forward as it draws (shared
// draws), else by a kernel of their own.
void flash_attention_forward(const cpu::FlashAttentionInputs& in, const FlashAttentionParams& params,
                             const Tensor& out, const Tensor& lse, const Tensor& keep);

// dq, dk, dv with unit-stride rows; delta [B, H, Lq] (accumulation type) is scratch the op allocated, and so are
// ds (undefined, or [B * H, Lq rounded up to 64, Lk rounded up to 64] of q's type: the tensor-core kernels then keep
// dS there instead of recomputing it for dQ; other paths leave it unused) and dq_sums, dq_turns (undefined, or f32
// [B * H, Lq, D] and i32 [B * H, ceil(Lq / 64)]: the Hopper backward's dK dV pass then adds dQ's products there in
// key order instead of a dQ pass recomputing S and dP; other paths leave them unused). keep: undefined or the
// forward's keep bits, which the Hopper kernels read instead of drawing (other paths draw again).
void flash_attention_backward(const cpu::FlashAttentionInputs& in, const FlashAttentionParams& params,
                              const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                              const Tensor& delta, const Tensor& ds, const Tensor& dq_sums, const Tensor& dq_turns,
                              const Tensor& keep, const Tensor& dq, const Tensor& dk, const Tensor& dv);

// Tuning hook for the benchmark (tests/ops/attention_cuda_test.cpp): the tile configuration the tensor-core
// kernels use, -1 for the default. Returns how many configurations each pass has for head dim D. A process starts
// with ENGINE_FLASH_TUNING="F,B" when it is set (a model's step with other kernels than the defaults, for measuring).
struct FlashTuning {
  int forward = -1;
  int backward = -1;
};
void set_flash_tuning(FlashTuning t);
int flash_forward_variants(int head_dim);
int flash_backward_variants(int head_dim);
// A short name of the configuration in use ("Br128 Bc64 w4"), for the benchmark's table.
std::string flash_forward_variant_name(int head_dim, int variant);
std::string flash_backward_variant_name(int head_dim, int variant);

}  // namespace ops::cuda
