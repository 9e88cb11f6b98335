// cuda/factory.h: random tensors on the GPU, drawing exactly the numbers ops/factory.cpp's cpu loop draws:
// element i of a contiguous tensor t takes the uniform at generator position offset + i (rand, randint)
// or offset + 2i and offset + 2i + 1 (randn, Box-Muller), converted to t's dtype as the cpu converts it.
// rand and randint give the cpu's bits; randn agrees to the last bits of the device's log and cos.
// (Constant tensors are fill_: ops/cuda/elementwise.h.)
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ops::cuda {

// low + (high - low) * u
void rand_uniform(const engine::Tensor& t, double low, double high, uint64_t seed, uint64_t offset);
// mean + std * sqrt(-2 log(1 - u1)) * cos(2 pi u2)
void randn(const engine::Tensor& t, double mean, double std, uint64_t seed, uint64_t offset);
// min(floor(u * high), high - 1)
void randint(const engine::Tensor& t, double high, uint64_t seed, uint64_t offset);

}  // namespace ops::cuda
