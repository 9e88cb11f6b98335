// view.cpp: views and their backward rules.
#include "ops/view.h"

#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/op.h"

namespace ops {

Tensor reshape(const Tensor& x, Shape shape) {
  check_defined("reshape", "x", x);
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); i++) {
    if (shape[i] == -1) {
      ENGINE_CHECK(infer < 0, "reshape: more than one -1 in ", engine::shape_str(shape));
      infer = int64_t(i);
    } else {
      ENGINE_CHECK(shape[i] >= 0, "reshape: negative size in ", engine::shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    ENGINE_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot reshape ", engine::shape_str(x.shape()),
                 " to ", engine::shape_str(shape));
    shape[infer] = x.numel() / known;
  }
  ENGINE_CHECK(engine::numel_of(shape) == x.numel(), "reshape: cannot reshape ", engine::shape_str(x.shape()),
               " (", x.numel(), " elements) to ", engine::shape_str(shape));
  if (shape == x.shape()) return x;
  Tensor src = contiguous(x);
  Tensor y = Tensor::view_of(src, shape, engine::contiguous_strides(shape), src.offset());
  if (graph::any_requires_grad({src})) {
    Shape xs = src.shape();
    graph::record("reshape", {src}, {y}, {}, [xs](Node&, const Grads& g) -> Grads { return {reshape(g[0], xs)}; });
  }
  return y;
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  int64_t s = normalize_dim("flatten", start_dim, x.dim()), e = normalize_dim("flatten", end_dim, x.dim());
  ENGINE_CHECK(s <= e, "flatten: start_dim ", start_dim, " is after end_dim ", end_dim);
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; d++) n *= x.shape()[d];
  shape.push_back(n);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& order) {
  check_defined("permute", "x", x);
  ENGINE_CHECK(int64_t(order.size()) == x.dim(), "permute: order has ", order.size(), " entries for a tensor of ",
               x.dim(), " dimensions");
  Shape shape(order.size()), strides(order.size());
  std::vector<int64_t> inverse(order.size());
  std::vector<bool> seen(order.size(), false);
  for (size_t i = 0; i < order.size(); i++) {
    int64_t d = normalize_dim("permute", order[i], x.dim());
    ENGINE_CHECK(!seen[d], "permute: dimension ", order[i], " appears twice");
    seen[d] = true;
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
    inverse[d] = int64_t(i);
  }
  Tensor y = Tensor::view_of(x, shape, strides, x.offset());
  if (graph::any_requires_grad({x}))
    graph::record("permute", {x}, {y}, {}, [inverse](Node&, const Grads& g) -> Grads {
      return {permute(g[0], inverse)};
    });
  return y;
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> order(size_t(x.dim()));
  for (int64_t i = 0; i < x.dim(); i++) order[i] = i;
  std::swap(order[normalize_dim("transpose", dim0, x.dim())], order[normalize_dim("transpose", dim1, x.dim())]);
  return permute(x, order);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  check_defined("slice", "x", x);
  int64_t d = normalize_dim("slice", dim, x.dim());
  int64_t n = x.shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  end = std::min(end, n);
  ENGINE_CHECK(step > 0, "slice: step must be positive, got ", step);
  ENGINE_CHECK(start >= 0 && start <= end, "slice: range [", start, ", ", end, ") is invalid for dimension ", dim,
               " of size ", n);
  Shape shape = x.shape(), strides = x.strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  Tensor y = Tensor::view_of(x, shape, strides, x.offset() + start * x.strides()[d]);
  if (graph::any_requires_grad({x})) {
    Shape xs = x.shape();
    graph::record("slice", {x}, {y}, {}, [xs, d, start, end, step](Node&, const Grads& g) -> Grads {
      return {slice_backward(g[0], xs, d, start, end, step)};
    });
  }
  return y;
}

Tensor slice_backward(const Tensor& g, const Shape& shape, int64_t dim, int64_t start, int64_t end, int64_t step) {
  OpScope scope("slice_backward");
  Tensor gx = zeros(shape, g.dtype(), g.device_ptr());
  {
    graph::NoGrad ng;
    copy_(slice(gx, dim, start, end, step), g);
  }
  if (graph::any_requires_grad({g}))
    graph::record("slice_backward", {g}, {gx}, {}, [dim, start, end, step](Node&, const Grads& gg) -> Grads {
      return {contiguous(slice(gg[0], dim, start, end, step))};
    });
  return gx;
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  int64_t d = normalize_dim("select", dim, x.dim());
  int64_t n = x.shape()[d];
  int64_t i = index < 0 ? index + n : index;
  ENGINE_CHECK(i >= 0 && i < n, "select: index ", index, " is out of range for dimension ", dim, " of size ", n);
  return squeeze(slice(x, d, i, i + 1), d);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  int64_t d = normalize_dim("unsqueeze", dim, x.dim() + 1);
  Shape shape = x.shape();
  shape.insert(shape.begin() + d, 1);
  return reshape(x, shape);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  int64_t d = normalize_dim("squeeze", dim, x.dim());
  ENGINE_CHECK(x.shape()[d] == 1, "squeeze: dimension ", dim, " has size ", x.shape()[d], ", not 1");
  Shape shape = x.shape();
  shape.erase(shape.begin() + d);
  if (x.is_contiguous()) return reshape(x, shape);
  Shape strides = x.strides();
  strides.erase(strides.begin() + d);
  Tensor y = Tensor::view_of(x, shape, strides, x.offset());
  if (graph::any_requires_grad({x})) {
    Shape xs = x.shape();
    graph::record("squeeze", {x}, {y}, {}, [xs, d](Node&, const Grads& g) -> Grads { return {unsqueeze(g[0], d)}; });
  }
  return y;
}

}  // namespace ops
