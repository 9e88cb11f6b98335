// shape.h: ops that assemble, pick and mask elements: concat / split / chunk, index_select, gather,
// masked_fill and where (the pure views live in view.h).
//
// Shape rules follow PyTorch. Index tensors are i32 or i64; an index out of range is an Error naming the op,
// the index and the size, raised by the kernel (the meta device has no data to check). FLOPs: 0 (they move
// data), except the scatter-adds (one add per element); bytes: read + written.
//
// Backward rules, all written with engine ops so that double backward works:
//   concat         -> slices of g (views, nothing copied)          split / chunk: one concat of the parts'
//                                                                  gradients (zeros for a part without one)
//   index_select   -> index_select_backward(g) (scatter-add)       whose own rule is index_select(gg)
//   gather         -> gather_backward(g) (scatter-add)             whose own rule is gather(gg)
//   masked_fill    -> masked_fill(g, mask, 0)                      (linear, so its own rule is itself)
//   where          -> masked_fill(g, !cond, 0) and masked_fill(g, cond, 0), summed to a's and b's shapes
// Saved for backward: the index (index_select, gather) or the mask (masked_fill, where); never the data.
// Memory: index_select_backward allocates an op temporary for the GPU's sorted scatter-add on every device,
// i32 [2 * size + 1 + index length] (scatter_add_rows_workspace below), freed before it returns.
#pragma once
#include <vector>

#include "engine/tensor.h"

namespace ops {

using engine::Shape;
using engine::Tensor;

// An Error naming op and arg unless t is a defined i32 or i64 tensor.
void check_index_dtype(const char* op, const char* arg, const Tensor& t);

// The inputs placed one after the other along dim: same dtype, device and rank, equal sizes elsewhere.
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// Views of x along dim of the given sizes (they must sum to x.size(dim)).
std::vector<Tensor> split(const Tensor& x, std::vector<int64_t> sizes, int64_t dim);
// ceil(n / chunks)-sized views along dim, the last one smaller (fewer than `chunks` when n is small), as PyTorch.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);

// x with dim replaced by index.numel(): out[.., k, ..] = x[.., index[k], ..]; index 1-D i32/i64.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// The gradient of index_select: zeros with `size` along dim, g's rows added in at index (in index order).
Tensor index_select_backward(const Tensor& g, int64_t dim, const Tensor& index, int64_t size);

// PyTorch gather: out has index's shape, out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (and so on);
// index has x's rank and index.size(d) <= x.size(d) for d != dim.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// The gradient of gather: zeros of x_shape with g scatter-added at index along dim.
Tensor gather_backward(const Tensor& g, int64_t dim, const Tensor& index, const Shape& x_shape);
// Whole rows of a batch of tables: rows [N, K, C] at index [N, k] along K -> [N, k, C] (gather with the index
// broadcast over C; differentiable in rows).
Tensor gather_rows(const Tensor& rows, const Tensor& index);

// x with `value` where mask is true; mask is bool, broadcast to x's shape; the result has x's shape.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// cond ? a : b elementwise, the three broadcast together (NumPy rules); cond is bool, a and b share a dtype.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// A 1-D index seen as a tensor of `shape` that varies along dim only: a stride-0 view, nothing allocated.
// It turns index_select (and embedding) into a gather.
Tensor expand_index(const Tensor& index, const Shape& shape, int64_t dim);

// The GPU scatter-add's workspace for the rows form of index_select_backward and embedding_backward, an op
// temporary allocated on every device alike (cpu and meta leave it unused) so that meta predicts the GPU:
// i32 [2 * size + 1 + count], 4 x (2 * size + 1 + count) bytes (0.31 MB for a vocabulary of 30522 and 16384
// ids), where size is the output's length along dim and count the index's length. Undefined (no workspace:
// the slower tile kernel) when g is not contiguous or the workspace would need 2^31 entries or more.
Tensor scatter_add_rows_workspace(const Tensor& g, int64_t size, int64_t count);

}  // namespace ops
