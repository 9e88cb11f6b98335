// embedding.cpp: embedding and embedding_backward: a gather and a scatter-add over rows, through the shape
// family's kernels with the ids seen as a [N, C] stride-0 index (expand_index).
#include "ops/embedding.h"

#include "ops/cpu/shape.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/shape.h"
#endif
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/op.h"
#include "ops/shape.h"
#include "ops/view.h"

namespace ops {

namespace {
void check_padding_idx(const char* op, int64_t padding_idx, int64_t num_embeddings) {
  ENGINE_CHECK(padding_idx < num_embeddings, op, ": padding_idx ", padding_idx, " is out of range for ",
               num_embeddings, " embeddings (use -1 for none)");
}
}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids, int64_t padding_idx) {
  OpScope scope("embedding");
  check_dim("embedding", "weight", weight, 2);
  check_index_dtype("embedding", "ids", ids);
  check_same_device("embedding", weight, ids);
  const int64_t V = weight.shape()[0], C = weight.shape()[1], N = ids.numel();
  check_padding_idx("embedding", padding_idx, V);
  Tensor flat_ids = reshape(ids, {N});  // [N], a view when ids is contiguous
  Tensor rows = new_empty(weight, {N, C});  // [N, C]
  run_kernel("embedding", rows, [&] { cpu::gather("embedding", weight, 0, expand_index(flat_ids, {N, C}, 0), rows); },
             CUDA_KERNEL(cuda::gather("embedding", weight, 0, expand_index(flat_ids, {N, C}, 0), rows)));
  engine::count_op("embedding", 0, double(2 * rows.nbytes() + ids.nbytes()));
  Shape out_shape = ids.shape();
  out_shape.push_back(C);
  Tensor out = reshape(rows, out_shape);  // [..., C], a view
  if (graph::any_requires_grad({weight})) {
    graph::record("embedding", {weight}, {out}, {ids}, [V, padding_idx](Node& n, const Grads& g) -> Grads {
      return {embedding_backward(g[0], n.saved(0), V, padding_idx)};
    });
  }
  return out;
}

Tensor embedding_backward(const Tensor& g, const Tensor& ids, int64_t num_embeddings, int64_t padding_idx) {
  OpScope scope("embedding_backward");
  check_floating("embedding_backward", "g", g);
  check_index_dtype("embedding_backward", "ids", ids);
  check_same_device("embedding_backward", g, ids);
  check_padding_idx("embedding_backward", padding_idx, num_embeddings);
  ENGINE_CHECK(g.dim() == ids.dim() + 1 && Shape(g.shape().begin(), g.shape().end() - 1) == ids.shape(),
               "embedding_backward: g of shape ", engine::shape_str(g.shape()), " does not match ids of shape ",
               engine::shape_str(ids.shape()), " (expected ids' shape + [C])");
  const int64_t V = num_embeddings, C = g.shape().back(), N = ids.numel();
  Tensor flat_ids, g_rows;
  {
    graph::NoGrad ng;  // plain reshapes of the arguments; the node below links to g itself
    flat_ids = reshape(ids, {N});  // [N]
    g_rows = reshape(g, {N, C});   // [N, C]
  }
  Tensor out = new_empty(g, {V, C});  // [V, C]
  {
    Tensor workspace = scatter_add_rows_workspace(g_rows, V, N);  // i32 [2V + 1 + N], the GPU's; freed here
    run_kernel(
        "embedding_backward", out,
        [&] { cpu::scatter_add("embedding_backward", g_rows, 0, expand_index(flat_ids, {N, C}, 0), padding_idx, out); },
        CUDA_KERNEL(cuda::scatter_add("embedding_backward", g_rows, 0, expand_index(flat_ids, {N, C}, 0), padding_idx,
                                      out, workspace)));
  }
  engine::count_op("embedding_backward", double(g.numel()), double(g.nbytes() + ids.nbytes() + out.nbytes()));
  if (graph::any_requires_grad({g})) {
    graph::record("embedding_backward", {g}, {out}, {ids}, [V, padding_idx](Node& n, const Grads& gg) -> Grads {
      Tensor rows = gg[0];  // [V, C]
      if (padding_idx >= 0) {  // the padding row of out does not depend on g: it sends nothing back
        Tensor row_ids = reshape(arange(V, DType::i64, rows.device_ptr()), {V, 1});
        rows = masked_fill(rows, compare(CompareOp::eq, row_ids, double(padding_idx)), 0.0);
      }
      return {embedding(rows, n.saved(0), padding_idx)};
    });
  }
  return out;
}

}  // namespace ops
