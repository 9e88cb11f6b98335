// cpu/attention.h: CPU reference kernels of the flash attention op (FlashAttention-2, tiled).
//
// The op (ops/attention.cpp) checks shapes and allocates every buffer; these only fill them.
#pragma once
#include "engine/tensor.h"
#include "ops/attention.h"

namespace ops::cpu {

using engine::Tensor;

// The op's tensors, as the kernels read them. q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv] with any
// strides; key_padding_mask undefined or contiguous bool [B, Lk].
struct FlashAttentionInputs {
  Tensor q, k, v, key_padding_mask;
};

// out [B, H, Lq, Dv] with any strides; lse [B, H, Lq] (accumulation type) contiguous; keep undefined, or the dropout
// keep bits [B, H, Lq, W] u8 contiguous (ops/attention.h), written from the draw.
void flash_attention_forward(const FlashAttentionInputs& in, const FlashAttentionParams& params,
                             const Tensor& out, const Tensor& lse, const Tensor& keep);

// dq [B, H, Lq, D], dk, dv like k and v, out and dout [B, H, Lq, Dv]: any strides. dlse undefined or [B, H, Lq]
// contiguous in the accumulation type, like lse. Scratch the op allocated: delta [B, H, Lq] (accumulation type).
// Dropout is drawn again (the forward's keep bits, when kept, hold the same decisions).
void flash_attention_backward(const FlashAttentionInputs& in, const FlashAttentionParams& params,
                              const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                              const Tensor& delta, const Tensor& dq, const Tensor& dk, const Tensor& dv);

}  // namespace ops::cpu
