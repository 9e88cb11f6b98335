// factory.h: tensors made from nothing: constants, ranges, host data and random numbers.
//
// Each takes an optional device (default: engine::default_device()). Random tensors draw from the
// engine's counter-based generator (engine/rng.h), so they are reproducible from the seed.
#pragma once
#include <memory>
#include <vector>

#include "engine/tensor.h"

namespace ops {

using engine::Device;
using engine::DType;
using engine::Shape;
using engine::Tensor;
using DevicePtr = std::shared_ptr<Device>;

Tensor zeros(const Shape& shape, DType dtype = DType::f32, DevicePtr device = nullptr);
Tensor ones(const Shape& shape, DType dtype = DType::f32, DevicePtr device = nullptr);
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, DevicePtr device = nullptr);
Tensor ones_like(const Tensor& t);
Tensor arange(int64_t n, DType dtype = DType::i64, DevicePtr device = nullptr);  // 0, 1, ..., n-1
Tensor scalar(double value, DType dtype = DType::f32, DevicePtr device = nullptr);  // shape []

// From host data (values converted to dtype).
Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f32,
                   DevicePtr device = nullptr);
Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::f32,
                   DevicePtr device = nullptr);
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::i64,
                   DevicePtr device = nullptr);

// A copy of t on another device (through host memory; contiguous result; no gradient).
Tensor to_device(const Tensor& t, DevicePtr device);

// Uniform in [low, high) and normal(mean, std), from the default generator.
Tensor rand(const Shape& shape, double low = 0, double high = 1, DType dtype = DType::f32,
            DevicePtr device = nullptr);
Tensor randn(const Shape& shape, double mean = 0, double std = 1, DType dtype = DType::f32,
             DevicePtr device = nullptr);
// Integers uniform in [0, high).
Tensor randint(const Shape& shape, int64_t high, DType dtype = DType::i64, DevicePtr device = nullptr);

}  // namespace ops
