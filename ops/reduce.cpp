// reduce.cpp: sum, mean, amax, sum_to and their backward rules.
#include "ops/reduce.h"

#include <algorithm>

#include "ops/cpu/reduce.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/reduce.h"
#endif
#include "ops/elementwise.h"
#include "ops/op.h"
#include "ops/factory.h"
#include "ops/view.h"

namespace ops {

namespace {

// Which dimensions are reduced (all when dims is empty), validated.
std::vector<bool> reduced_mask(const char* op, const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<bool> mask(size_t(x.dim()), dims.empty());
  for (int64_t d : dims) {
    int64_t nd = normalize_dim(op, d, x.dim());
    ENGINE_CHECK(!mask[nd], op, ": dimension ", d, " given twice");
    mask[nd] = true;
  }
  return mask;
}

Shape kept_shape(const Shape& s, const std::vector<bool>& mask) {
  Shape out = s;
  for (size_t d = 0; d < s.size(); d++)
    if (mask[d]) out[d] = 1;
  return out;
}

Shape dropped_shape(const Shape& s, const std::vector<bool>& mask) {
  Shape out;
  for (size_t d = 0; d < s.size(); d++)
    if (!mask[d]) out.push_back(s[d]);
  return out;
}

// How many pieces the GPU cuts each output's inputs into (1: none), so that a sum with few outputs and many
// inputs each (a full sum, a bias gradient) still spreads over the whole GPU; the pieces' partial sums go to a
// workspace [splits, outputs] and are added in order (deterministic). A function of the shape alone, and the
// workspace is allocated on every device alike (cpu and meta leave it unused) so that meta predicts the GPU.
// Rows (innermost dimension reduced): a piece is one block of >= 4096 inputs; columns (innermost kept): a
// block serves 32 outputs, a piece is >= 256 inputs of each. Aim: about 2048 blocks, at most 1024 pieces.
int64_t sum_splits(const Tensor& x, const std::vector<bool>& mask, int64_t outputs) {
  if (outputs == 0 || x.numel() == 0) return 1;
  bool inner_reduced = true;
  for (size_t d = 0; d < mask.size(); d++)
    if (x.shape()[d] != 1) inner_reduced = mask[d];
  const int64_t per_output = x.numel() / outputs;
  const int64_t blocks = inner_reduced ? outputs : (outputs + 31) / 32;
  const int64_t min_piece = inner_reduced ? 4096 : 256;
  int64_t splits = std::min<int64_t>({(2048 + blocks - 1) / blocks, per_output / min_piece, 1024});
  return splits >= 2 ? splits : 1;
}

Tensor reduce_sum(const char* name, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, bool is_mean) {
  OpScope scope(name);
  check_floating(name, "x", x);
  std::vector<bool> mask = reduced_mask(name, x, dims);
  Shape keep = kept_shape(x.shape(), mask);
  int64_t count = keep.empty() ? 1 : x.numel() / std::max<int64_t>(engine::numel_of(keep), 1);
  if (x.numel() == 0) count = 0;
  double scale = is_mean ? (count > 0 ? 1.0 / double(count) : 0.0) : 1.0;
  Tensor out = new_empty(x, keep);
  {
    Tensor partials = sum_workspace(x, mask, out.numel());  // freed with this scope
    run_kernel(
        name, out, [&] { cpu::sum(x, mask, scale, out); }, CUDA_KERNEL(cuda::sum(x, mask, scale, out, partials)));
  }
  engine::count_op(name, double(x.numel()), double(x.nbytes() + out.nbytes()));
  if (!keepdim) out = reshape(out, dropped_shape(x.shape(), mask));
  if (graph::any_requires_grad({x})) {
    Shape xs = x.shape();
    graph::record(name, {x}, {out}, {}, [xs, keep, scale, is_mean](Node&, const Grads& g) -> Grads {
      Tensor gk = reshape(g[0], keep);
      Tensor gx = broadcast_to(gk, xs);
      return {is_mean ? mul(gx, scale) : contiguous(gx)};
    });
  }
  return out;
}

}  // namespace

Tensor sum_workspace(const Tensor& x, const std::vector<bool>& reduced, int64_t outputs) {
  const int64_t splits = sum_splits(x, reduced, outputs);
  if (splits == 1) return Tensor();
  return new_workspace(x, {splits, outputs}, x.dtype() == DType::f64 ? DType::f64 : DType::f32,
                       "the sum's partial sums, one per piece of the reduced elements");
}

Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce_sum("sum", x, dims, keepdim, false);
}

Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce_sum("mean", x, dims, keepdim, true);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  ENGINE_CHECK(int64_t(shape.size()) <= x.dim(), "sum_to: cannot sum ", engine::shape_str(x.shape()), " to ",
               engine::shape_str(shape));
  int64_t lead = x.dim() - int64_t(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); d++) {
    if (d < lead) { dims.push_back(d); continue; }
    int64_t want = shape[d - lead];
    ENGINE_CHECK(want == x.shape()[d] || want == 1, "sum_to: cannot sum ", engine::shape_str(x.shape()), " to ",
                 engine::shape_str(shape));
    if (want == 1 && x.shape()[d] != 1) dims.push_back(d);
  }
  Tensor s = dims.empty() ? x : sum(x, dims, true);
  return s.shape() == shape ? s : reshape(s, shape);
}

namespace {

// The maximum along dim d and its (first) index, both with d kept as size 1.
std::pair<Tensor, Tensor> max_with_index(const char* name, const Tensor& x, int64_t d) {
  Shape keep = x.shape();
  keep[d] = 1;
  Tensor values = new_empty(x, keep);
  Tensor indices = new_empty(x, keep, DType::i64);
  run_kernel(name, values, [&] { cpu::amax(x, d, values, indices); },
             CUDA_KERNEL(cuda::amax(x, d, values, indices)));
  engine::count_op(name, double(x.numel()), double(x.nbytes() + values.nbytes() + indices.nbytes()));
  return {values, indices};
}

Shape without_dim(const Shape& s, int64_t d) {
  Shape out = s;
  out.erase(out.begin() + d);
  return out;
}

}  // namespace

Tensor amax(const Tensor& x, int64_t dim, bool keepdim) {
  OpScope scope("amax");
  check_floating("amax", "x", x);
  int64_t d = normalize_dim("amax", dim, x.dim());
  auto [values, indices] = max_with_index("amax", x, d);
  if (graph::any_requires_grad({x})) {
    graph::record("amax", {x}, {values}, {indices}, [d, xs = x.shape()](Node& n, const Grads& g) -> Grads {
      // Scatter the gradient to the argmax position: one_hot(index) * g, built from differentiable ops.
      Shape along(xs.size(), 1);
      along[d] = xs[d];
      Tensor positions = reshape(arange(xs[d], DType::i64, g[0].device_ptr()), along);
      Tensor hit = to(compare(CompareOp::eq, positions, n.saved(0)), g[0].dtype());
      return {mul(hit, g[0])};
    });
  }
  return keepdim ? values : reshape(values, without_dim(x.shape(), d));
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  OpScope scope("argmax");
  check_floating("argmax", "x", x);
  int64_t d = normalize_dim("argmax", dim, x.dim());
  Tensor indices = max_with_index("argmax", x, d).second;
  return keepdim ? indices : reshape(indices, without_dim(x.shape(), d));
}

}  // namespace ops
