// embedding.h: a lookup table, rows of weight picked by integer ids (word, position and token-type embeddings).
//
//   embedding(weight [V, C], ids [...] i32/i64, padding_idx)  -> [..., C]     out[n] = weight[ids[n]]
//   embedding_backward(g [..., C], ids, V, padding_idx)         -> [V, C]     row v = sum of g[n] with ids[n] == v
//
// The forward is a gather along dimension 0 of weight and the backward a scatter-add into a [V, C] tensor
// (the same kernels as index_select, see shape.h), summing in the order of the ids so the result is
// deterministic. The padding row (padding_idx >= 0) gets no gradient, as in PyTorch; padding_idx < 0 means
// none. An id outside [0, V) is an Error naming the id and V. Saved for backward: the ids only.
// embedding_backward is linear in g; its own rule is embedding(gg, ids) with gg's padding row zeroed (the
// padding row of its output does not depend on g), so double backward works.
// FLOPs: 0 forward, one add per element of g backward. Bytes: rows read + written, plus the ids.
// Memory: embedding_backward allocates an op temporary for the GPU's sorted scatter-add on every device (cpu
// and meta leave it unused): i32 [2V + 1 + N] for N ids, 4 (2V + 1 + N) bytes (0.31 MB at V 30522, N 16384),
// freed before it returns (see ops::scatter_add_rows_workspace in shape.h).
#pragma once
#include "engine/tensor.h"

namespace ops {

using engine::Tensor;

Tensor embedding(const Tensor& weight, const Tensor& ids, int64_t padding_idx = -1);
Tensor embedding_backward(const Tensor& g, const Tensor& ids, int64_t num_embeddings, int64_t padding_idx = -1);

}  // namespace ops
