// dtype.h: the element types a tensor can hold, and the two 16-bit float formats as plain structs.
//
// bf16 and f16 are stored as raw 16-bit patterns; the CPU reference converts them to float for every
// arithmetic operation (round-to-nearest-even on the way back), which is what the GPU's conversion
// instructions do, so a CPU result is the exact reference for the CUDA kernels.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace engine {

enum class DType : uint8_t { f32, bf16, f16, f64, i32, i64, u8, boolean };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", ... (also the CLI spelling)
bool is_floating(DType t);
// The machine epsilon of a floating dtype (torch.finfo(dtype).eps: 2^-23 for f32, 2^-7 for bf16, ...).
double dtype_epsilon(DType t);
// TF32 for f32 products (--precision tf32: cuBLASLt's FAST_TF32, the convolutions' TF32 tensor-core kernels); off by
// default (true fp32, as in 2020). Process-wide, and read on every device: which kernel (and workspace) a convolution
// takes depends on it (ops/conv_params.h's conv2d_winograd), so meta must see the same switch as the GPU.
void set_allow_tf32(bool on);
bool allow_tf32();

// ---------------------------------------------------------------------------------------------------
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a (quiet) NaN
      bits = uint16_t((u >> 16) | 0x40);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    bits = uint16_t(u >> 16);
  }
  explicit operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f);
  explicit operator float() const;
};

// The type CPU kernels accumulate in: double for f64, float for everything else.
template <typename T> struct acc { using type = float; };
template <> struct acc<double> { using type = double; };
template <> struct acc<int32_t> { using type = double; };
template <> struct acc<int64_t> { using type = double; };
template <typename T> using acc_t = typename acc<T>::type;

// Map C++ types to DType (used by Tensor::data<T>() to check the caller's type).
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<f16>() { return DType::f16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<bool>() { return DType::boolean; }

}  // namespace engine
