// tensor.h: the Tensor handle.
//
// A Tensor is a cheap, copyable handle (shared_ptr) to a TensorImpl: shape, strides (in elements), an
// element offset into a Storage, a dtype, and the autograd fields. A Storage is one arena block; it goes
// back to the allocator the moment its last reference (tensor, view or saved-for-backward copy) drops.
// Views (reshape of a contiguous tensor, permute, slice) share the storage and allocate nothing.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/dtype.h"

namespace graph { struct Node; }

namespace engine {

using Shape = std::vector<int64_t>;
int64_t numel_of(const Shape& s);
Shape contiguous_strides(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3, 4]"

// One arena block holding tensor data.
struct Storage {
  Storage(std::shared_ptr<Device> d, size_t bytes, Category c);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const {
    check_live();
    return device->pointer(block.offset);
  }
  // ZeRO-3 (graph/parameter_shards.h): a parameter's block goes back to the arena between its uses and is allocated
  // again (same bytes, category and owner; new contents: the caller refills it) before the next. Every tensor and
  // view of the storage keeps its handle meanwhile. Reading a released storage is an Error; `on_use`, set by whoever
  // released it, brings it back (backward calls it for a saved tensor whose storage is released).
  void release();
  void restore();
  bool released() const { return released_; }
  void check_live() const {  // an Error naming the parameter when released
    if (released_) throw_released();
  }
  std::function<void()> on_use;
  // Gradients of several parameters side by side (ops::linear's stacked weights: one dW product for q, k and v):
  // each parameter takes its rows as its gradient, a view, instead of a copy (graph/autograd.cpp, AccumulateGrad);
  // the block lives until the last of them is released.
  bool stacked_gradients = false;
  // (On a released storage these change what restore() will tag the block with; annotate does nothing.)
  void set_category(Category c) {
    if (released_)
      released_category_ = c;
    else
      device->ledger().retag(block.id, c);
  }
  void annotate(const std::string& reason) {
    if (!released_) device->ledger().annotate(block.id, reason);
  }
  Category category() const { return released_ ? released_category_ : device->ledger().category(block.id); }
  void set_owner(std::string owner) {
    if (released_)
      released_owner_ = std::move(owner);
    else
      device->ledger().set_owner(block.id, std::move(owner));
  }
  const std::string& owner() const { return released_ ? released_owner_ : device->ledger().owner(block.id); }
  std::shared_ptr<Device> device;
  Device::Block block;

 private:
  [[noreturn]] void throw_released() const;
  bool released_ = false;
  Category released_category_ = Category::param;
  std::string released_owner_;
};

struct TensorImpl {
  Shape shape, strides;
  int64_t offset = 0;  // in elements, into storage
  DType dtype = DType::f32;
  std::shared_ptr<Storage> storage;
  // autograd
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;         // accumulated gradient (leaves)
  std::shared_ptr<graph::Node> grad_fn;     // the node that produced this tensor (non-leaves)
  int output_nr = 0;                        // which output of grad_fn
  std::string name;                         // parameter name, for reports
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // A new tensor of uninitialized data, tagged with the current context's category (or `category`).
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, std::shared_ptr<Device> device = nullptr);
  static Tensor empty(const Shape& shape, DType dtype, std::shared_ptr<Device> device, Category category);
  // A view of `base`'s storage with its own shape, strides and element offset.
  static Tensor view_of(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int64_t dim() const { return int64_t(impl_->shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return numel_of(impl_->shape); }
  int64_t offset() const { return impl_->offset; }
  DType dtype() const { return impl_->dtype; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  Device& device() const { return *impl_->storage->device; }
  const std::shared_ptr<Device>& device_ptr() const { return impl_->storage->device; }
  bool is_meta() const { return device().type() == DeviceType::meta; }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  bool same_storage(const Tensor& o) const { return impl_->storage == o.impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // Raw data (cpu/cuda). data<T>() checks that T matches the dtype and that the device has data.
  void* data_ptr() const;
  template <typename T> T* data() const {
    check_data(dtype_of<T>());
    return static_cast<T*>(data_ptr());
  }
  // Copies to / from host memory in element order (works for any strides; meta gives zeros).
  std::vector<double> to_double() const;
  // The elements' raw bytes in row-major order, gathered along the strides (a checkpoint's data).
  std::vector<char> to_host_bytes() const;
  double item() const;  // a one-element tensor's value
  void copy_from_host(const void* src, size_t bytes);  // contiguous tensors only

  // autograd
  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& set_requires_grad(bool r);
  Tensor grad() const { return impl_->grad ? Tensor(impl_->grad) : Tensor(); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  const std::shared_ptr<graph::Node>& grad_fn() const { return impl_->grad_fn; }
  // A tensor that shares this data but has no autograd history.
  Tensor detach() const;

  const std::string& name() const { return impl_->name; }
  Tensor& set_name(std::string n) { impl_->name = std::move(n); return *this; }
  void set_category(Category c) const { impl_->storage->set_category(c); }

 private:
  void check_data(DType t) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Shape& s);

}  // namespace engine
