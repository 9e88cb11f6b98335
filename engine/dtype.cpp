// dtype.cpp: sizes, names and the IEEE half-precision conversions.
#include "engine/dtype.h"

#include "engine/error.h"

namespace engine {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
    case DType::f64: case DType::i64: return 8;
    case DType::u8: case DType::boolean: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
  }
  return "?";
}

double dtype_epsilon(DType t) {
  switch (t) {
    case DType::f32:
      return 0x1p-23;
    case DType::f64:
      return 0x1p-52;
    case DType::bf16:
      return 0x1p-7;
    case DType::f16:
      return 0x1p-10;
    default:
      throw Error(str("dtype_epsilon: ", dtype_name(t), " is not a floating dtype"));
  }
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f64;
}

// ---------------------------------------------------------------------------------------------------
// IEEE 754 binary16 <-> binary32, round to nearest even, with subnormals, infinities and NaN.
f16::f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) { bits = uint16_t(sign | 0x7e00u); return; }  // NaN
  if (mag >= 0x477ff000u) { bits = uint16_t(sign | 0x7c00u); return; }  // overflow -> inf
  if (mag < 0x38800000u) {  // subnormal or zero in half
    if (mag < 0x33000000u) { bits = uint16_t(sign); return; }  // rounds to zero
    uint32_t m = (mag & 0x7fffffu) | 0x800000u;
    int shift = 113 - int(mag >> 23) + 13;  // bits to drop
    uint32_t half_m = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) half_m++;
    bits = uint16_t(sign | half_m);
    return;
  }
  uint32_t h = ((mag - 0x38000000u) >> 13);
  uint32_t rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  bits = uint16_t(sign | h);
}

f16::operator float() const {
  uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t man = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (man == 0) {
      out = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do { man <<= 1; e++; } while (!(man & 0x400u));
      out = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (man << 13);
  } else {
    out = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

namespace {
bool g_tf32 = false;
}  // namespace
void set_allow_tf32(bool on) { g_tf32 = on; }
bool allow_tf32() { return g_tf32; }

}  // namespace engine
