// tensor.cpp: storage lifetime, views and host copies.
#include "engine/tensor.h"

#include <cstring>

#include "engine/error.h"

namespace engine {

// Shapes come from users (flags, files) too: a product that wraps around int64 is an Error, never a small,
// wrong size (the message is built only then: these run for every tensor).
int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n))
      throw Error(str("shape ", shape_str(s), " has more elements than a 64-bit count holds"));
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = int64_t(s.size()) - 1; i >= 0; i--) {
    st[i] = acc;
    if (__builtin_mul_overflow(acc, s[i], &acc))
      throw Error(str("shape ", shape_str(s), " has more elements than a 64-bit count holds"));
  }
  return st;
}

std::string shape_str(const Shape& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); i++) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << shape_str(s); }

// ---------------------------------------------------------------------------------------------------
Storage::Storage(std::shared_ptr<Device> d, size_t bytes, Category c) : device(std::move(d)) {
  block = device->allocate(bytes, c);
}

Storage::~Storage() {
  if (!released_) device->release(block);
}

void Storage::release() {
  ENGINE_CHECK(!released_, "Storage::release: '", owner(), "' is released already");
  released_category_ = category();
  released_owner_ = owner();
  device->release(block);
  released_ = true;
}

void Storage::restore() {
  ENGINE_CHECK(released_, "Storage::restore: '", owner(), "' is not released");
  block = device->allocate(block.bytes, released_category_);
  released_ = false;
  set_owner(released_owner_);
}

void Storage::throw_released() const {
  throw Error(str("'", released_owner_,
                  "' was read while ZeRO-3 had it released: under --zero 3 a parameter exists "
                  "whole only inside the forward (and backward) of the module that registers it; this one was used "
                  "outside it (a weight shared with another module, or read by its parent). Train this model with "
                  "--zero 2, or register the parameter where it is used"));
}

// ---------------------------------------------------------------------------------------------------
Tensor Tensor::empty(const Shape& shape, DType dtype, std::shared_ptr<Device> device) {
  return empty(shape, dtype, std::move(device), context().category);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, std::shared_ptr<Device> device, Category category) {
  for (int64_t d : shape)
    ENGINE_CHECK(d >= 0, "cannot create a tensor of shape ", shape_str(shape), ": negative dimension");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  if (!device) device = default_device();
  size_t bytes = 0;
  if (__builtin_mul_overflow(size_t(numel_of(shape)), dtype_size(dtype), &bytes))
    throw Error(str("a tensor of shape ", shape_str(shape), " needs more bytes than a 64-bit size holds"));
  AllocationScope what(impl->shape, dtype);
  impl->storage = std::make_shared<Storage>(std::move(device), bytes, category);
  return Tensor(std::move(impl));
}

Tensor Tensor::view_of(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->storage = base.storage();
  return Tensor(std::move(impl));
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  int64_t i = d < 0 ? d + n : d;
  ENGINE_CHECK(i >= 0 && i < n, "dimension ", d, " is out of range for a tensor of shape ", shape_str(shape()));
  return impl_->shape[i];
}

bool Tensor::is_contiguous() const {
  int64_t expect = 1;
  for (int64_t i = dim() - 1; i >= 0; i--) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expect) return false;
    expect *= impl_->shape[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  void* base = impl_->storage->data();
  if (!base) return nullptr;
  return static_cast<char*>(base) + impl_->offset * int64_t(dtype_size(dtype()));
}

void Tensor::check_data(DType t) const {
  ENGINE_CHECK(defined(), "data access on an undefined tensor");
  ENGINE_CHECK(t == dtype(), "data<", dtype_name(t), ">() on a tensor of dtype ", dtype_name(dtype()));
  ENGINE_CHECK(device().type() != DeviceType::meta, "data access on a meta tensor: meta tensors hold no data");
}

namespace {
double load_as_double(const char* p, DType t) {
  switch (t) {
    case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::f64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::bf16: { bf16 v; std::memcpy(&v, p, 2); return float(v); }
    case DType::f16: { f16 v; std::memcpy(&v, p, 2); return float(v); }
    case DType::i32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::i64: { int64_t v; std::memcpy(&v, p, 8); return double(v); }
    case DType::u8: case DType::boolean: return double(uint8_t(*p));
  }
  return 0;
}
}  // namespace

std::vector<char> Tensor::to_host_bytes() const {
  const size_t es = dtype_size(dtype());
  std::vector<char> out(nbytes());
  if (out.empty()) return out;
  const size_t base = impl_->storage->block.offset;
  if (is_contiguous()) {
    device().copy_to_host(out.data(), base + size_t(impl_->offset) * es, out.size());
    return out;
  }
  // Copy the whole storage range this view spans to the host, then gather its elements along the strides.
  int64_t lo = 0, hi = 0;
  for (int64_t i = 0; i < dim(); i++) {
    const int64_t span = (impl_->shape[i] - 1) * impl_->strides[i];
    (span < 0 ? lo : hi) += span;
  }
  std::vector<char> host(size_t(hi - lo + 1) * es);
  device().copy_to_host(host.data(), base + size_t((impl_->offset + lo) * int64_t(es)), host.size());
  std::vector<int64_t> idx(size_t(dim()), 0);
  for (int64_t n = 0; n < numel(); n++) {
    int64_t off = -lo;
    for (int64_t i = 0; i < dim(); i++) off += idx[size_t(i)] * impl_->strides[i];
    std::memcpy(out.data() + size_t(n) * es, host.data() + size_t(off) * es, es);
    for (int64_t i = dim() - 1; i >= 0 && ++idx[size_t(i)] == impl_->shape[i]; i--) idx[size_t(i)] = 0;
  }
  return out;
}

std::vector<double> Tensor::to_double() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  if (out.empty() || is_meta()) return out;
  const std::vector<char> bytes = to_host_bytes();
  const size_t es = dtype_size(dtype());
  for (size_t n = 0; n < out.size(); n++) out[n] = load_as_double(bytes.data() + n * es, dtype());
  return out;
}

double Tensor::item() const {
  ENGINE_CHECK(numel() == 1, "item() needs a one-element tensor, got shape ", shape_str(shape()));
  return to_double()[0];
}

void Tensor::copy_from_host(const void* src, size_t bytes) {
  ENGINE_CHECK(is_contiguous(), "copy_from_host needs a contiguous tensor");
  ENGINE_CHECK(bytes == nbytes(), "copy_from_host: ", bytes, " bytes for a tensor of ", nbytes());
  device().copy_to_device(impl_->storage->block.offset + size_t(impl_->offset) * dtype_size(dtype()), src, bytes);
}

Tensor& Tensor::set_requires_grad(bool r) {
  ENGINE_CHECK(!r || is_floating(dtype()), "requires_grad on a tensor of dtype ", dtype_name(dtype()),
               ": only floating tensors have gradients");
  impl_->requires_grad = r;
  return *this;
}

Tensor Tensor::detach() const {
  Tensor t = view_of(*this, shape(), strides(), offset());
  return t;
}

}  // namespace engine
