// op.cpp: the shared argument checks and dispatch.
#include "ops/op.h"

#include <algorithm>
#include <vector>

#include "ops/profile.h"

namespace ops {

void check_defined(const char* op, const char* arg, const Tensor& t) {
  ENGINE_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

void check_floating(const char* op, const char* arg, const Tensor& t) {
  check_defined(op, arg, t);
  ENGINE_CHECK(engine::is_floating(t.dtype()), op, ": argument '", arg, "' must be a floating tensor, got ",
               engine::dtype_name(t.dtype()));
}

void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected) {
  check_defined(op, arg, t);
  ENGINE_CHECK(t.dtype() == expected, op, ": argument '", arg, "' must be ", engine::dtype_name(expected),
               ", got ", engine::dtype_name(t.dtype()));
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  ENGINE_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ: ", engine::dtype_name(a.dtype()), " and ",
               engine::dtype_name(b.dtype()), " (cast one with ops::to)");
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  ENGINE_CHECK(a.device_ptr() == b.device_ptr(), op, ": tensors are on different devices (", a.device().name(),
               " and ", b.device().name(), ")");
}

void check_dim(const char* op, const char* arg, const Tensor& t, int64_t ndim) {
  check_defined(op, arg, t);
  ENGINE_CHECK(t.dim() == ndim, op, ": argument '", arg, "' must have ", ndim, " dimensions, got shape ",
               engine::shape_str(t.shape()));
}

int64_t normalize_dim(const char* op, int64_t dim, int64_t ndim) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  ENGINE_CHECK(d >= 0 && d < ndim, op, ": dimension ", dim, " is out of range for ", ndim, " dimensions");
  return d;
}

Tensor empty_like(const Tensor& like) { return Tensor::empty(like.shape(), like.dtype(), like.device_ptr()); }

Tensor new_empty(const Tensor& like, const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, like.device_ptr());
}

Tensor new_empty(const Tensor& like, const Shape& shape) { return new_empty(like, shape, like.dtype()); }

Tensor new_workspace(const Tensor& like, const Shape& shape, DType dtype, const std::string& what) {
  Tensor t = Tensor::empty(shape, dtype, like.device_ptr(), engine::Category::workspace);
  t.storage()->annotate("the GPU kernel's workspace: " + what);
  return t;
}

Tensor new_empty_in_layout_of(const Tensor& layout, const Shape& shape, DType dtype) {
  const size_t n = shape.size();
  ENGINE_CHECK(layout.dim() == int64_t(n) && n >= 1, "new_empty_in_layout_of: a layout of ", layout.dim(),
               " dimensions for a shape of ", n);
  std::vector<size_t> order(n);  // memory order, outermost first
  for (size_t d = 0; d < n; d++) order[d] = d;
  std::stable_sort(order.begin(), order.end() - 1,
                   [&](size_t a, size_t b) { return layout.strides()[a] > layout.strides()[b]; });
  Shape stored(n), strides(n);
  for (size_t k = 0; k < n; k++) stored[k] = shape[order[k]];
  Tensor base = Tensor::empty(stored, dtype, layout.device_ptr());  // contiguous in memory order
  for (size_t k = 0; k < n; k++) strides[order[k]] = base.strides()[k];
  return Tensor::view_of(base, shape, strides, base.offset());
}

void run_kernel(const char* op, const Tensor& like, const std::function<void()>& cpu,
                const std::function<void()>& cuda) {
  const DeviceType type = like.device().type();
  if (type == DeviceType::meta) return;
  ENGINE_CHECK(type != DeviceType::cuda || cuda, op,
               ": this op has no cuda kernel yet; run it with --device cpu or meta");
  const bool timed = kernel_timing();  // engine_train --profile (ops/profile.h)
  if (timed) begin_kernel_timing(op, like);
  if (type == DeviceType::cpu)
    cpu();
  else
    cuda();
  if (timed) end_kernel_timing();
}

}  // namespace ops
