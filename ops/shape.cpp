// shape.cpp: concat / split / chunk, index_select, gather, masked_fill, where and their backward rules.
#include "ops/shape.h"

#include "ops/cpu/shape.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/shape.h"
#endif
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/op.h"
#include "ops/reduce.h"
#include "ops/view.h"

namespace ops {

void check_index_dtype(const char* op, const char* arg, const Tensor& t) {
  check_defined(op, arg, t);
  ENGINE_CHECK(t.dtype() == DType::i64 || t.dtype() == DType::i32, op, ": argument '", arg,
               "' must be an i64 or i32 index tensor, got ", engine::dtype_name(t.dtype()));
}

namespace {
void check_mask_dtype(const char* op, const char* arg, const Tensor& t) {
  check_defined(op, arg, t);
  ENGINE_CHECK(t.dtype() == DType::boolean || t.dtype() == DType::u8, op, ": argument '", arg,
               "' must be a bool mask, got ", engine::dtype_name(t.dtype()));
}
}  // namespace

Tensor expand_index(const Tensor& index, const Shape& shape, int64_t dim) {
  ENGINE_CHECK(index.dim() == 1 && index.numel() == shape[dim], "expand_index: index of shape ",
               engine::shape_str(index.shape()), " does not run along dimension ", dim, " of ",
               engine::shape_str(shape));
  Shape strides(shape.size(), 0);
  strides[dim] = index.strides()[0];
  return Tensor::view_of(index, shape, strides, index.offset());
}

Tensor scatter_add_rows_workspace(const Tensor& g, int64_t size, int64_t count) {
  const int64_t entries = 2 * size + 1 + count;
  if (!g.is_contiguous() || entries >= (int64_t(1) << 31)) return Tensor();
  // [2 * size + 1 + count]: row starts | fill counts | positions
  return new_workspace(g, {entries}, DType::i32, "the scatter's rows sorted by destination");
}

// ---------------------------------------------------------------------------------------------------
// concat, split, chunk

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  OpScope scope("concat");
  ENGINE_CHECK(!xs.empty(), "concat: needs at least one tensor");
  const Tensor& first = xs[0];
  check_defined("concat", "xs[0]", first);
  ENGINE_CHECK(first.dim() > 0, "concat: cannot concatenate 0-d tensors");
  const int64_t d = normalize_dim("concat", dim, first.dim());
  Shape shape = first.shape();
  shape[d] = 0;
  std::vector<int64_t> sizes;
  for (size_t k = 0; k < xs.size(); k++) {
    const Tensor& x = xs[k];
    check_defined("concat", engine::str("xs[", k, "]").c_str(), x);
    check_same_dtype("concat", first, x);
    check_same_device("concat", first, x);
    bool fits = x.dim() == first.dim();
    for (int64_t e = 0; fits && e < x.dim(); e++) fits = e == d || x.shape()[e] == first.shape()[e];
    ENGINE_CHECK(fits, "concat: tensor ", k, " has shape ", engine::shape_str(x.shape()), " but tensor 0 has shape ",
                 engine::shape_str(first.shape()), "; they may differ only in dimension ", dim);
    sizes.push_back(x.shape()[d]);
    shape[d] += x.shape()[d];
  }
  Tensor out = new_empty(first, shape);
  run_kernel("concat", out, [&] { cpu::concat(xs, d, out); }, CUDA_KERNEL(cuda::concat(xs, d, out)));
  engine::count_op("concat", 0, double(2 * out.nbytes()));
  if (graph::any_requires_grad(xs)) {
    graph::record("concat", xs, {out}, {}, [d, sizes](Node& n, const Grads& g) -> Grads {
      Grads gx(sizes.size());
      int64_t start = 0;
      for (size_t k = 0; k < sizes.size(); k++) {
        if (n.needs_input_grad(k)) gx[k] = slice(g[0], d, start, start + sizes[k]);
        start += sizes[k];
      }
      return gx;
    });
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, std::vector<int64_t> sizes, int64_t dim) {
  check_defined("split", "x", x);
  const int64_t d = normalize_dim("split", dim, x.dim());
  int64_t total = 0;
  for (int64_t s : sizes) {
    ENGINE_CHECK(s >= 0, "split: negative size ", s, " in ", engine::shape_str(sizes));
    total += s;
  }
  ENGINE_CHECK(total == x.shape()[d], "split: sizes ", engine::shape_str(sizes), " sum to ", total,
               " but dimension ", dim, " of ", engine::shape_str(x.shape()), " has size ", x.shape()[d]);
  std::vector<Tensor> parts;
  std::vector<Shape> shapes;
  {
    graph::NoGrad ng;  // views; one node records them all below
    int64_t start = 0;
    for (int64_t s : sizes) {
      parts.push_back(slice(x, d, start, start + s));
      shapes.push_back(parts.back().shape());
      start += s;
    }
  }
  if (graph::any_requires_grad({x})) {
    // x's gradient: the parts' gradients side by side, zeros for a part without one: one concat, where a slice
    // per part would make a zero-padded copy of x's size each and backward would add them.
    graph::record("split", {x}, parts, {}, [d, shapes](Node&, const Grads& g) -> Grads {
      const Tensor* like = nullptr;
      for (const Tensor& gi : g)
        if (gi.defined()) like = &gi;
      if (!like) return {Tensor()};
      std::vector<Tensor> pieces;
      for (size_t i = 0; i < g.size(); i++)
        pieces.push_back(g[i].defined() ? g[i] : zeros(shapes[i], like->dtype(), like->device_ptr()));
      return {concat(pieces, d)};
    });
  }
  return parts;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  check_defined("chunk", "x", x);
  ENGINE_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  const int64_t d = normalize_dim("chunk", dim, x.dim());
  const int64_t n = x.shape()[d], step = (n + chunks - 1) / chunks;
  std::vector<int64_t> sizes;
  for (int64_t left = n; left > 0; left -= step) sizes.push_back(std::min(step, left));
  if (sizes.empty()) sizes.push_back(0);  // an empty dimension gives one empty chunk
  return split(x, sizes, d);
}

// ---------------------------------------------------------------------------------------------------
// index_select and gather, with their scatter-add gradients

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  OpScope scope("index_select");
  check_defined("index_select", "x", x);
  check_index_dtype("index_select", "index", index);
  check_dim("index_select", "index", index, 1);
  check_same_device("index_select", x, index);
  const int64_t d = normalize_dim("index_select", dim, x.dim());
  Shape shape = x.shape();
  shape[d] = index.numel();
  Tensor out = new_empty(x, shape);
  run_kernel("index_select", out, [&] { cpu::gather("index_select", x, d, expand_index(index, shape, d), out); },
             CUDA_KERNEL(cuda::gather("index_select", x, d, expand_index(index, shape, d), out)));
  engine::count_op("index_select", 0, double(2 * out.nbytes() + index.nbytes()));
  if (graph::any_requires_grad({x})) {
    graph::record("index_select", {x}, {out}, {index}, [d, size = x.shape()[d]](Node& n, const Grads& g) -> Grads {
      return {index_select_backward(g[0], d, n.saved(0), size)};
    });
  }
  return out;
}

Tensor index_select_backward(const Tensor& g, int64_t dim, const Tensor& index, int64_t size) {
  OpScope scope("index_select_backward");
  check_floating("index_select_backward", "g", g);
  check_index_dtype("index_select_backward", "index", index);
  check_dim("index_select_backward", "index", index, 1);
  check_same_device("index_select_backward", g, index);
  const int64_t d = normalize_dim("index_select_backward", dim, g.dim());
  ENGINE_CHECK(g.shape()[d] == index.numel(), "index_select_backward: g of shape ", engine::shape_str(g.shape()),
               " has ", g.shape()[d], " entries along dimension ", dim, " for an index of ", index.numel());
  Shape shape = g.shape();
  shape[d] = size;
  Tensor out = new_empty(g, shape);
  {
    Tensor workspace = scatter_add_rows_workspace(g, size, index.numel());  // the GPU's, freed with this scope
    run_kernel(
        "index_select_backward", out,
        [&] { cpu::scatter_add("index_select_backward", g, d, expand_index(index, g.shape(), d), -1, out); },
        CUDA_KERNEL(cuda::scatter_add("index_select_backward", g, d, expand_index(index, g.shape(), d), -1, out,
                                      workspace)));
  }
  engine::count_op("index_select_backward", double(g.numel()), double(g.nbytes() + index.nbytes() + out.nbytes()));
  if (graph::any_requires_grad({g})) {
    graph::record("index_select_backward", {g}, {out}, {index}, [d](Node& n, const Grads& gg) -> Grads {
      return {index_select(gg[0], d, n.saved(0))};
    });
  }
  return out;
}

namespace {
// gather's shape rule, shared by gather and gather_backward: same rank, index no larger off dim.
void check_gather_shapes(const char* op, const Shape& x_shape, const Tensor& index, int64_t d) {
  bool fits = index.dim() == int64_t(x_shape.size());
  for (int64_t e = 0; fits && e < index.dim(); e++) fits = e == d || index.shape()[e] <= x_shape[e];
  ENGINE_CHECK(fits, op, ": index of shape ", engine::shape_str(index.shape()), " does not fit x of shape ",
               engine::shape_str(x_shape), " (same rank, and no larger than x except along dimension ", d, ")");
}
}  // namespace

Tensor gather_rows(const Tensor& rows, const Tensor& index) {
  ENGINE_CHECK(rows.dim() == 3 && index.dim() == 2 && index.size(0) == rows.size(0), "gather_rows: rows [N, K, C] ",
               "and index [N, k] expected, got ", engine::shape_str(rows.shape()), " and ",
               engine::shape_str(index.shape()));
  const int64_t N = index.size(0), k = index.size(1), C = rows.size(2);
  return gather(rows, 1, contiguous(broadcast_to(reshape(index, {N, k, 1}), {N, k, C})));
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  OpScope scope("gather");
  check_defined("gather", "x", x);
  check_index_dtype("gather", "index", index);
  check_same_device("gather", x, index);
  const int64_t d = normalize_dim("gather", dim, x.dim());
  check_gather_shapes("gather", x.shape(), index, d);
  Tensor out = new_empty(x, index.shape());
  run_kernel("gather", out, [&] { cpu::gather("gather", x, d, index, out); },
             CUDA_KERNEL(cuda::gather("gather", x, d, index, out)));
  engine::count_op("gather", 0, double(2 * out.nbytes() + index.nbytes()));
  if (graph::any_requires_grad({x})) {
    graph::record("gather", {x}, {out}, {index}, [d, xs = x.shape()](Node& n, const Grads& g) -> Grads {
      return {gather_backward(g[0], d, n.saved(0), xs)};
    });
  }
  return out;
}

Tensor gather_backward(const Tensor& g, int64_t dim, const Tensor& index, const Shape& x_shape) {
  OpScope scope("gather_backward");
  check_floating("gather_backward", "g", g);
  check_index_dtype("gather_backward", "index", index);
  check_same_device("gather_backward", g, index);
  ENGINE_CHECK(g.shape() == index.shape(), "gather_backward: g of shape ", engine::shape_str(g.shape()),
               " differs from the index's shape ", engine::shape_str(index.shape()));
  const int64_t d = normalize_dim("gather_backward", dim, int64_t(x_shape.size()));
  check_gather_shapes("gather_backward", x_shape, index, d);
  Tensor out = new_empty(g, x_shape);
  run_kernel("gather_backward", out, [&] { cpu::scatter_add("gather_backward", g, d, index, -1, out); },
             CUDA_KERNEL(cuda::scatter_add("gather_backward", g, d, index, -1, out)));
  engine::count_op("gather_backward", double(g.numel()), double(g.nbytes() + index.nbytes() + out.nbytes()));
  if (graph::any_requires_grad({g})) {
    graph::record("gather_backward", {g}, {out}, {index}, [d](Node& n, const Grads& gg) -> Grads {
      return {gather(gg[0], d, n.saved(0))};
    });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// masked_fill and where

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  OpScope scope("masked_fill");
  check_defined("masked_fill", "x", x);
  check_mask_dtype("masked_fill", "mask", mask);
  check_same_device("masked_fill", x, mask);
  ENGINE_CHECK(broadcast_shapes("masked_fill", x.shape(), mask.shape()) == x.shape(), "masked_fill: mask of shape ",
               engine::shape_str(mask.shape()), " does not broadcast to x's shape ", engine::shape_str(x.shape()));
  Tensor out = empty_like(x);
  run_kernel("masked_fill", out, [&] { cpu::masked_fill(x, mask, value, out); },
             CUDA_KERNEL(cuda::masked_fill(x, mask, value, out)));
  engine::count_op("masked_fill", 0, double(x.nbytes() + mask.nbytes() + out.nbytes()));
  if (graph::any_requires_grad({x})) {
    graph::record("masked_fill", {x}, {out}, {mask}, [](Node& n, const Grads& g) -> Grads {
      return {masked_fill(g[0], n.saved(0), 0.0)};
    });
  }
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  OpScope scope("where");
  check_mask_dtype("where", "cond", cond);
  check_defined("where", "a", a);
  check_defined("where", "b", b);
  check_same_dtype("where", a, b);
  check_same_device("where", a, b);
  check_same_device("where", cond, a);
  Shape shape = broadcast_shapes("where", broadcast_shapes("where", cond.shape(), a.shape()), b.shape());
  Tensor out = new_empty(a, shape);
  run_kernel("where", out, [&] { cpu::where(cond, a, b, out); }, CUDA_KERNEL(cuda::where(cond, a, b, out)));
  engine::count_op("where", 0, double(cond.nbytes() + a.nbytes() + b.nbytes() + out.nbytes()));
  if (graph::any_requires_grad({a, b})) {
    graph::record("where", {a, b}, {out}, {cond}, [sa = a.shape(), sb = b.shape()](Node& n, const Grads& g) -> Grads {
      Tensor c = n.saved(0);
      Tensor ga, gb;
      if (n.needs_input_grad(0)) ga = sum_to(masked_fill(g[0], compare(CompareOp::eq, c, 0.0), 0.0), sa);
      if (n.needs_input_grad(1)) gb = sum_to(masked_fill(g[0], c, 0.0), sb);
      return {ga, gb};
    });
  }
  return out;
}

}  // namespace ops
