// factory.cpp: constant, host and random tensors.
#include "ops/factory.h"

#include <cmath>

#include "engine/rng.h"
#include "ops/cpu/cpu_util.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/factory.h"
#endif
#include "ops/elementwise.h"
#include "ops/op.h"

namespace ops {

namespace {
DevicePtr or_default(DevicePtr d) { return d ? d : engine::default_device(); }
}  // namespace

Tensor full(const Shape& shape, double value, DType dtype, DevicePtr device) {
  OpScope scope("full");
  Tensor t = Tensor::empty(shape, dtype, or_default(device));
  graph::NoGrad ng;
  fill_(t, value);
  return t;
}

Tensor zeros(const Shape& shape, DType dtype, DevicePtr device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, DevicePtr device) { return full(shape, 1.0, dtype, device); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype(), t.device_ptr()); }
Tensor scalar(double value, DType dtype, DevicePtr device) { return full({}, value, dtype, device); }

Tensor arange(int64_t n, DType dtype, DevicePtr device) {
  std::vector<double> v(size_t(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; i++) v[i] = double(i);
  return from_vector(v, {n}, dtype, device);
}

namespace {
// Writes host doubles into a new tensor of dtype (through an f64 host buffer converted on the host).
template <typename V>
Tensor from_host(const std::vector<V>& values, const Shape& shape, DType dtype, DevicePtr device) {
  OpScope scope("from_vector");
  ENGINE_CHECK(int64_t(values.size()) == engine::numel_of(shape), "from_vector: ", values.size(),
               " values for shape ", engine::shape_str(shape));
  Tensor t = Tensor::empty(shape, dtype, or_default(device));
  if (t.is_meta()) return t;
  std::vector<char> host(t.nbytes());
  ENGINE_ALL_SWITCH(dtype, T, {
    T* p = reinterpret_cast<T*>(host.data());
    for (size_t i = 0; i < values.size(); i++) p[i] = static_cast<T>(static_cast<engine::acc_t<T>>(values[i]));
  });
  t.copy_from_host(host.data(), host.size());
  return t;
}
}  // namespace

Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, DevicePtr device) {
  return from_host(values, shape, dtype, device);
}
Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype, DevicePtr device) {
  return from_host(values, shape, dtype, device);
}
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, DType dtype, DevicePtr device) {
  if (dtype == DType::i64) {  // exact for every int64
    OpScope scope("from_vector");
    ENGINE_CHECK(int64_t(values.size()) == engine::numel_of(shape), "from_vector: ", values.size(),
                 " values for shape ", engine::shape_str(shape));
    Tensor t = Tensor::empty(shape, dtype, or_default(device));
    t.copy_from_host(values.data(), values.size() * sizeof(int64_t));
    return t;
  }
  return from_host(values, shape, dtype, device);
}

Tensor to_device(const Tensor& t, DevicePtr device) {
  OpScope scope("to_device");
  Tensor src = t;
  {
    graph::NoGrad ng;
    src = contiguous(t);
  }
  Tensor out = Tensor::empty(src.shape(), src.dtype(), or_default(device));
  if (src.is_meta() || out.is_meta()) return out;
  std::vector<char> host(src.nbytes());
  src.device().copy_to_host(
      host.data(), src.storage()->block.offset + size_t(src.offset()) * engine::dtype_size(src.dtype()), host.size());
  out.copy_from_host(host.data(), host.size());
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Random: element i takes uniform numbers at generator positions offset + i (rand, randint) or
// offset + 2i, offset + 2i + 1 (randn, Box-Muller). Every device reserves the same numbers.

namespace {
enum class Dist { uniform, normal, integer };

Tensor random(Dist dist, const Shape& shape, double a, double b, DType dtype, DevicePtr device) {
  OpScope scope(dist == Dist::normal ? "randn" : dist == Dist::integer ? "randint" : "rand");
  Tensor t = Tensor::empty(shape, dtype, or_default(device));
  int64_t n = t.numel();
  engine::Generator& gen = engine::generator();
  uint64_t seed = gen.seed;
  uint64_t offset = gen.reserve(uint64_t(dist == Dist::normal ? 2 * n : n));
  run_kernel("random", t, [&] {
    ENGINE_ALL_SWITCH(dtype, T, {
      T* p = static_cast<T*>(t.data_ptr());
      for (int64_t i = 0; i < n; i++) {
        double v;
        if (dist == Dist::uniform) {
          v = a + (b - a) * engine::philox_uniform(seed, offset, uint64_t(i));
        } else if (dist == Dist::integer) {
          v = std::floor(double(engine::philox_uniform(seed, offset, uint64_t(i))) * b);
          if (v >= b) v = b - 1;
        } else {
          double u1 = engine::philox_uniform(seed, offset, uint64_t(2 * i));
          double u2 = engine::philox_uniform(seed, offset, uint64_t(2 * i + 1));
          v = a + b * std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2);
        }
        p[i] = static_cast<T>(static_cast<engine::acc_t<T>>(v));
      }
    });
  }, CUDA_KERNEL(if (dist == Dist::uniform) cuda::rand_uniform(t, a, b, seed, offset);
                 else if (dist == Dist::integer) cuda::randint(t, b, seed, offset);
                 else cuda::randn(t, a, b, seed, offset)));
  return t;
}
}  // namespace

Tensor rand(const Shape& shape, double low, double high, DType dtype, DevicePtr device) {
  return random(Dist::uniform, shape, low, high, dtype, device);
}
Tensor randn(const Shape& shape, double mean, double std, DType dtype, DevicePtr device) {
  return random(Dist::normal, shape, mean, std, dtype, device);
}
Tensor randint(const Shape& shape, int64_t high, DType dtype, DevicePtr device) {
  ENGINE_CHECK(high > 0, "randint: high must be positive, got ", high);
  return random(Dist::integer, shape, 0, double(high), dtype, device);
}

}  // namespace ops
