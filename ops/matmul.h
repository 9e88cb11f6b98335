// matmul.h: matrix products: matmul (batched, broadcasting), bmm, and linear (x W^T + b, PyTorch layout).
//
// Shapes (as in PyTorch):
//   matmul(a, b)   [..., M, K] x [..., K, N] -> [..., M, N]; the batch dimensions (...) broadcast as in NumPy.
//                  A 1-D a is a row [1, K] and a 1-D b a column [K, 1]; that dimension is removed from the
//                  result ([K] x [K] -> [], [K] x [K, N] -> [N]).
//   bmm(a, b)      [B, M, K] x [B, K, N] -> [B, M, N], no broadcasting (the strict form, for clarity at call sites).
//   linear(x, W, b) x [..., in], weight [out, in], bias [out] or undefined -> [..., out]. The leading dimensions
//                  are flattened into rows: one GEMM [R, in] x [in, out] whose result starts from the bias
//                  (GEMM with beta = 1), so the bias costs no separate broadcast-add pass or buffer.
//                  Wide unaligned 16-bit outputs (bf16/f16, out >= 1024 and not a multiple of 8: BERT's
//                  30522-word vocabulary) run padded to the next multiple of 8: W and b get zero rows (a
//                  temporary copy), the GEMM writes [R, out_p] and the result is a view of its first out columns
//                  (rows out_p apart); backward pads g with zero columns so that dx and dW run aligned too, dW
//                  being the first out rows. cuBLASLt's Hopper kernels need those 16-byte sizes: at BERT's
//                  [2464, 768] x [768, 30522] the three products take 0.51 ms instead of 1.55 on an H200
//                  (tools/bench/cublaslt_probe.cu). The values are those of the unpadded product (the zero terms add
//                  nothing); the memory is the padded buffers' (bert_base bf16 512 x 32: +47 MiB at the peak, the
//                  padded W and g of the decoder's backward). 32-bit types are left as they are (not measured).
//   linear(x, {W1, W2, ...}, {b1, b2, ...}) is linear(x, concat(W, 0), concat(b)): the weights' rows stacked into
//                  one GEMM, as when q, k and v are projected from the same x. The gain is in backward: one dx
//                  product of K = 3C instead of three and their two sums, one dW product of 3C rows instead of
//                  three (bert_base bf16 512 x 32 on an H200: linear_backward 10.66 -> 10.04 ms, add 1.09 -> 0.59
//                  ms a step; the forward's one product is no faster than three, and the stack costs it ~0.2 ms).
//                  The stack is a temporary of the op, made again in backward, never saved: the memory is that of
//                  the separate linears (x saved once, the weights themselves) plus the stack's transient bytes.
//                  Each weight's (and bias's) gradient is its rows of the stack's gradient, a view, which the
//                  parameter keeps as its gradient without a copy: the stack's block is marked as stacked
//                  gradients (engine/tensor.h), named after the weights' common module ("...attention.self/grad")
//                  and freed with the last of them (graph/autograd.cpp's AccumulateGrad).
//   linear(x, W, b, Activation::relu) is relu(linear(x, W, b)) in one kernel: max(0, .) applied to the f32
//                  accumulator in the GEMM's epilogue (cuBLASLt's RELU_BIAS on the GPU), so the pre-activation is
//                  never written nor read again. Backward needs only the result (relu's gradient passes where it
//                  is positive), which the op saves: the next layer saves the same tensor, so it costs nothing
//                  (transformer_big's feed-forward block: relu's 12 forward kernels gone). Backward is relu's and
//                  then the linear's, as two ops.
// FLOPs: 2 * M * N * K per product (a multiply-add is 2); bias adds are not counted.
//
// Strided operands: a matrix whose rows or columns are contiguous (a plain or a transposed view, e.g. W^T
// in linear, transpose(a) in backward) is given to Eigen as it is, without a copy. Any other layout
// (e.g. a slice with a step in both matrix dimensions) is packed into host scratch by the CPU kernel; a
// non-contiguous x in linear is copied once (an op-level temporary, identical on every device) because its
// leading dimensions must be flattened. A batched operand whose batch dimensions cannot be walked with one
// stride (attention's [B, H, L, D] head views of [B, L, H*D]) is also copied (a kernel temporary, not
// saved: backward keeps the view), so the GPU runs the whole batch as one strided-batched GEMM. bf16/f16 blocks are
// converted to float and multiplied with Eigen's
// float GEMM (the reference for the tensor-core kernels, not a fast path).
//
// Backward (engine ops, so double backward works):
//   matmul: da = sum_to(g @ b^T, a.shape), db = sum_to(a^T @ g, b.shape)   (sum_to undoes broadcasting)
//   linear: dx = linear(g, W^T) (= g @ W), dW = g2^T @ x2 (g2, x2: rows flattened), db = sum of g over rows.
//           When x already has a gradient from its other consumers that the rule may add into in place
//           (graph::pending_gradient: a residual branch's), dx is added into it by the same GEMM (beta = 1):
//           no separate sum and no dx buffer, the sum rounded once.
// Saved: both operands (matmul), x and W (linear: unpadded and unstacked; backward pads and stacks W again); no
// output.
#pragma once
#include <vector>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

// cuBLASLt's workspace, one block of the device (engine/device.h: Device::workspace). Every op that may run
// a GEMM on the GPU asks for it on every device type, so that meta places it where cuda does.
constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
// The activation linear may apply to its result in the GEMM's own epilogue (see linear(x, W, b, act) above).
enum class Activation { none, relu };

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Activation act = Activation::none);
// Stacked weights (each [out_i, in]) and their biases (one per weight, or none) -> [..., sum of out_i].
Tensor linear(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<Tensor>& biases,
              Activation act = Activation::none);

}  // namespace ops
