// cuda/shape.h: the GPU kernels of the shape family (concat, gather, scatter-add, masked_fill, where), with
// the contracts of ops/cpu/shape.h. Embedding and index_select run through gather / scatter_add too.
//
// Index range errors: the CPU throws while it runs; these kernels skip an out-of-range index and record it in
// a zero-copy host record, and the CPU's message is thrown after the stream's next synchronization (no
// synchronization per indexing op; see IndexError in kernel_util.cuh).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace ops::cuda {

// out (contiguous) = the inputs placed one after the other along dim.
void concat(const std::vector<engine::Tensor>& xs, int64_t dim, const engine::Tensor& out);
// out (contiguous, index's shape): out[.., i, ..] = x[.., index[.., i, ..], ..] along dim; any dtype.
void gather(const char* op, const engine::Tensor& x, int64_t dim, const engine::Tensor& index,
            const engine::Tensor& out);
// out (contiguous) = 0, then out[.., index[.., i, ..], ..] += g[.., i, ..], each output element summing its
// contributions in the CPU's order (increasing i) in acc_t, without atomics: bit-identical to the CPU in
// f32. Entries whose index equals `skip` add nothing (-1 skips none).
void scatter_add(const char* op, const engine::Tensor& g, int64_t dim, const engine::Tensor& index, int64_t skip,
                 const engine::Tensor& out);
// The same, given the op's workspace for the rows form (ops::scatter_add_rows_workspace: i32 [2K + 1 + J] for
// K = out's size along dim and J = the index's length; undefined: the call above). With a workspace, g must be
// contiguous and index a 1-D index along dim seen through expand_index: the index is counting-sorted into one
// segment of positions per output row, and blocks sum each row's segment in increasing position, so
// the work is O(J + K + g's size) rather than the tiles' O(K x J) index scans. Same results, bit for bit.
void scatter_add(const char* op, const engine::Tensor& g, int64_t dim, const engine::Tensor& index, int64_t skip,
                 const engine::Tensor& out, const engine::Tensor& workspace);
// out (contiguous, x's shape) = mask ? value : x, the bool mask broadcast to x's shape.
void masked_fill(const engine::Tensor& x, const engine::Tensor& mask, double value, const engine::Tensor& out);
// out (contiguous, broadcast shape) = cond ? a : b.
void where(const engine::Tensor& cond, const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& out);

}  // namespace ops::cuda
