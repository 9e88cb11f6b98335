// cpu/shape.h: CPU reference kernels of the shape family (concat, gather, scatter-add, masked_fill, where)
// and the two index helpers that the embedding and loss kernels share with them.
//
// index_select and embedding are gathers along one dimension with a 1-D index seen through a stride-0
// view (ops::expand_index), so one gather kernel and one scatter-add kernel serve all of them.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/error.h"
#include "engine/tensor.h"

namespace ops::cpu {

// ENGINE_INDEX_SWITCH(dtype, I, { body using I }): index tensors (ids, targets) are i32 or i64.
#define ENGINE_INDEX_SWITCH(dtype, I, ...)                                                              \
  switch (dtype) {                                                                                     \
    case ::engine::DType::i32: { using I = int32_t; __VA_ARGS__; } break;                              \
    case ::engine::DType::i64: { using I = int64_t; __VA_ARGS__; } break;                              \
    default: throw ::engine::Error(::engine::str("cpu kernel: index dtype ", ::engine::dtype_name(dtype), \
                                                 " is not i32 or i64"));                              \
  }

// v itself when it lies in [0, size); otherwise an Error naming the op, the index and the size. The meta
// device has no data, so this check can only happen in the kernel.
inline int64_t checked_index(const char* op, int64_t v, int64_t size) {
  ENGINE_CHECK(v >= 0 && v < size, op, ": index ", v, " is out of range for a dimension of size ", size,
               " (expected 0 <= index < ", size, ")");
  return v;
}

// out (contiguous) = the inputs placed one after the other along dim.
void concat(const std::vector<engine::Tensor>& xs, int64_t dim, const engine::Tensor& out);
// out (contiguous, index's shape): out[.., i, ..] = x[.., index[.., i, ..], ..] along dim. index may be any
// view (a stride-0 view for index_select); every value is range-checked against x.shape()[dim].
void gather(const char* op, const engine::Tensor& x, int64_t dim, const engine::Tensor& index,
            const engine::Tensor& out);
// The adjoint of gather: out (contiguous) = 0, then out[.., index[.., i, ..], ..] += g[.., i, ..], visiting
// g in row-major order and summing in acc_t (deterministic). Entries whose index equals `skip` add nothing
// (embedding's padding row; -1 skips none).
void scatter_add(const char* op, const engine::Tensor& g, int64_t dim, const engine::Tensor& index, int64_t skip,
                 const engine::Tensor& out);
// out (contiguous, x's shape) = mask ? value : x, with the bool mask broadcast to x's shape.
void masked_fill(const engine::Tensor& x, const engine::Tensor& mask, double value, const engine::Tensor& out);
// out (contiguous, broadcast shape) = cond ? a : b.
void where(const engine::Tensor& cond, const engine::Tensor& a, const engine::Tensor& b, const engine::Tensor& out);

}  // namespace ops::cpu
