// cuda/conv1d.h: the conv1d family on the GPU, with the contracts of ops/cpu/conv1d.h (contiguous tensors,
// same arguments, same results). The forward and input gradient are K cuBLASLt GEMMs accumulating into their
// output (matmul_accumulate), each over all the sentences' rows where To == T (the rows at sentence edges then
// recomputed); the weight gradient is one cuBLASLt GEMM for the unshifted tap, one for each shifted
// tap less its sentence-boundary pairs where To == T, and this family's own tiled kernel for the shifted taps of
// other paddings; GLU is one pass each way.
#pragma once
#include "engine/tensor.h"

namespace ops::cuda {

void conv1d_forward(const engine::Tensor& x, const engine::Tensor& w, const engine::Tensor& bias, int64_t pad_left,
                    const engine::Tensor& y);
void conv1d_backward_input(const engine::Tensor& g, const engine::Tensor& w, int64_t pad_left,
                           const engine::Tensor& dx);
void conv1d_backward_weight(const engine::Tensor& g, const engine::Tensor& x, int64_t pad_left,
                            const engine::Tensor& dw);
void glu_forward(const engine::Tensor& x, int64_t dim, const engine::Tensor& y);
void glu_backward(const engine::Tensor& g, const engine::Tensor& x, int64_t dim, const engine::Tensor& dx);

}  // namespace ops::cuda
