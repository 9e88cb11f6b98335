// op.h: what every op implementation includes: argument checks with useful messages, output allocation,
// kernel dispatch by device, FLOP counting, and the autograd recording API.
//
// The shape of an op (ops/<family>.cpp):
//   Tensor softmax(const Tensor& x, int64_t dim) {
//     OpScope op("softmax");                       // owner tag of what it allocates
//     check_floating("softmax", "x", x);            // 1. checks
//     Tensor y = empty_like(x);                     // 2. outputs through the allocator
//     run_kernel("softmax", y, [&] { cpu::softmax_forward(...); });   // 3. kernel (none on meta)
//     if (graph::any_requires_grad({x}))            // 4. the node, with what backward needs
//       graph::record("softmax", {x}, {y}, {y}, [](Node& n, const std::vector<Tensor>& g) {...});
//     engine::count_op("softmax", flops, bytes);    // 5. counters
//     return y;
//   }
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/counters.h"
#include "engine/error.h"
#include "engine/tensor.h"
#include "graph/autograd.h"

namespace ops {

using engine::DeviceType;
using engine::DType;
using engine::OpScope;
using engine::Shape;
using engine::Tensor;
using engine::str;
using graph::Node;
using Grads = std::vector<Tensor>;

void check_defined(const char* op, const char* arg, const Tensor& t);
void check_floating(const char* op, const char* arg, const Tensor& t);
void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_dim(const char* op, const char* arg, const Tensor& t, int64_t ndim);
// A dimension index in [-ndim, ndim) made non-negative, or an Error naming the op.
int64_t normalize_dim(const char* op, int64_t dim, int64_t ndim);

// New contiguous tensors on the same device as `like`.
Tensor empty_like(const Tensor& like);
Tensor new_empty(const Tensor& like, const Shape& shape, DType dtype);
Tensor new_empty(const Tensor& like, const Shape& shape);
// A new tensor of `shape` (as many dimensions as `layout`) whose dimensions lie in memory in the order of
// `layout`'s: outer to inner by decreasing stride, the last dimension innermost. An op's output then follows its
// input's layout: attention's output and gradients keep the [B, L, H, D] order of heads split from a [B, L, C]
// projection, so merging the heads back is a view, not a copy.
Tensor new_empty_in_layout_of(const Tensor& layout, const Shape& shape, DType dtype);
// Scratch that an op's GPU kernel needs (partial sums, zero-padded copies, transformed tiles), allocated by the op on
// every device alike so that meta predicts the GPU (the cpu and meta leave it unused) and freed by the op: a new
// tensor like new_empty's in the ledger's `workspace` category (beside the device's GEMM workspace, so that the
// category table says how much of a peak is kernel scratch), whose block the ledger's detail (engine_train
// --explain) describes as "the GPU kernel's workspace: <what>".
Tensor new_workspace(const Tensor& like, const Shape& shape, DType dtype, const std::string& what);

// Runs the kernel for the tensor's device: cpu runs `cpu`, meta runs nothing (shapes and allocations
// only), cuda runs `cuda` (an op without a cuda kernel says so).
void run_kernel(const char* op, const Tensor& like, const std::function<void()>& cpu,
                const std::function<void()>& cuda = nullptr);

// The cuda argument of run_kernel: CUDA_KERNEL(cuda::softmax_forward(x, y)) is that call in a build with
// CUDA and nothing (an op without a cuda kernel) in a build without.
#ifdef ENGINE_CUDA
#define CUDA_KERNEL(...) [&] { __VA_ARGS__; }
#else
#define CUDA_KERNEL(...) nullptr
#endif

}  // namespace ops
