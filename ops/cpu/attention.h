// cpu/attention.h: CPU reference kernels of the flash attention op (FlashAttention-2, tiled).
//
// The op (ops/attention.cpp) checks shapes and allocates every buffer; these only fill them.
#pragma once
#include "engine/tensor.h"
#include "ops/attention.h"

namespace ops::cpu {

using engine::Tensor;

// The op's tensors, as the kernels read them. q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv] with any
// strides; key_padding_mask undefined or contiguous bool [B, Lk]; keep: with dropout, the keep mask
// (flash_attention_keep_mask), else undefined.
struct FlashAttentionInputs {
  Tensor q, k, v, key_padding_mask, keep;
};

// The dropout keep mask of params' draw: keep contiguous u8 [B, H, Lq, flash_keep_row_bytes(Lk)], bit j % 8 of
// byte j / 8 of row (b, h, i) set iff element ((b*H + h)*Lq + i)*Lk + j of the draw is kept (engine/rng.h's
// dropout_bits >= the threshold of params.dropout_p); the bits past Lk are 0.
void flash_attention_keep_mask(const FlashAttentionParams& params, int64_t Lk, const Tensor& keep);

// out [B, H, Lq, Dv] with any strides; lse [B, H, Lq] (accumulation type) contiguous.
void flash_attention_forward(const FlashAttentionInputs& in, const FlashAttentionParams& params,
                             const Tensor& out, const Tensor& lse);

// dq [B, H, Lq, D], dk, dv like k and v, out and dout [B, H, Lq, Dv]: any strides. dlse undefined or [B, H, Lq]
// contiguous in the accumulation type, like lse. Scratch the op allocated: delta [B, H, Lq] (accumulation type).
void flash_attention_backward(const FlashAttentionInputs& in, const FlashAttentionParams& params,
                              const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                              const Tensor& delta, const Tensor& dq, const Tensor& dk, const Tensor& dv);

}  // namespace ops::cpu
