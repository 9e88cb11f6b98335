// elementwise_math.h: the scalar math of every pointwise op, in one place, shared by the CPU reference
// and the CUDA kernels (ENGINE_HD functions), so both compute the same function by construction.
//
// Each unary op f has: f(x); its derivative f' evaluated from the tensor the op saves for backward
// (the input x, or the output y where that is cheaper: exp, tanh, sigmoid, sqrt, relu, as PyTorch does);
// and d f'/ds, the derivative of that expression with respect to the saved tensor, used by double backward.
#pragma once
#include <cmath>
#include <cstdint>

#include "engine/rng.h"  // ENGINE_HD

namespace ops {

enum class UnaryOp : uint8_t {
  affine,  // alpha * x + beta
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  sigmoid,
  relu,
  leaky_relu,  // slope alpha
  gelu,        // x * Phi(x), erf form
  gelu_tanh,   // tanh approximation
  pow,         // x ^ alpha
  erf,
  softplus,  // log(1 + exp(x)), as max(x, 0) + log1p(exp(-|x|)) (no overflow); f' = sigmoid(x)
};

// True when backward needs the output y rather than the input x.
inline bool unary_saves_output(UnaryOp op) {
  return op == UnaryOp::exp || op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::tanh ||
         op == UnaryOp::sigmoid || op == UnaryOp::relu;
}
inline bool unary_needs_saved(UnaryOp op) { return op != UnaryOp::affine; }

template <typename A> ENGINE_HD A unary_f(UnaryOp op, A x, A alpha, A beta) {
  const A half = A(0.5), one = A(1);
  switch (op) {
    case UnaryOp::affine: return alpha * x + beta;
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return one / std::sqrt(x);
    case UnaryOp::tanh: return std::tanh(x);
    case UnaryOp::sigmoid: return one / (one + std::exp(-x));
    case UnaryOp::relu: return x > A(0) ? x : A(0);
    case UnaryOp::leaky_relu: return x > A(0) ? x : alpha * x;
    case UnaryOp::gelu: return half * x * (one + std::erf(x * A(0.70710678118654752440)));
    case UnaryOp::gelu_tanh: {
      A u = A(0.79788456080286535588) * (x + A(0.044715) * x * x * x);
      return half * x * (one + std::tanh(u));
    }
    case UnaryOp::pow: return std::pow(x, alpha);
    case UnaryOp::erf: return std::erf(x);
    case UnaryOp::softplus:
      return (x > A(0) ? x : A(0)) + std::log1p(std::exp(-(x > A(0) ? x : -x)));
  }
  return A(0);
}

// f'(.) from the saved tensor s (x or y, see unary_saves_output).
template <typename A> ENGINE_HD A unary_df(UnaryOp op, A s, A alpha, A beta) {
  const A half = A(0.5), one = A(1);
  switch (op) {
    case UnaryOp::affine: return alpha;
    case UnaryOp::exp: return s;
    case UnaryOp::log: return one / s;
    case UnaryOp::sqrt: return half / s;
    case UnaryOp::rsqrt: return -half * s * s * s;
    case UnaryOp::tanh: return one - s * s;
    case UnaryOp::sigmoid: return s * (one - s);
    case UnaryOp::relu: return s > A(0) ? one : A(0);
    case UnaryOp::leaky_relu: return s > A(0) ? one : alpha;
    case UnaryOp::gelu: {
      A cdf = half * (one + std::erf(s * A(0.70710678118654752440)));
      A pdf = A(0.39894228040143267794) * std::exp(-half * s * s);
      return cdf + s * pdf;
    }
    case UnaryOp::gelu_tanh: {
      A c = A(0.79788456080286535588), k = A(0.044715);
      A t = std::tanh(c * (s + k * s * s * s));
      A du = c * (one + A(3) * k * s * s);
      return half * (one + t) + half * s * (one - t * t) * du;
    }
    case UnaryOp::pow: return alpha * std::pow(s, alpha - one);
    case UnaryOp::erf: return A(1.12837916709551257390) * std::exp(-s * s);
    case UnaryOp::softplus:
      return one / (one + std::exp(-s));
  }
  return A(0);
}

// d f'(s) / ds: what double backward multiplies by.
template <typename A> ENGINE_HD A unary_d2f(UnaryOp op, A s, A alpha, A beta) {
  const A half = A(0.5), one = A(1);
  switch (op) {
    case UnaryOp::affine: return A(0);
    case UnaryOp::exp: return one;
    case UnaryOp::log: return -one / (s * s);
    case UnaryOp::sqrt: return -half / (s * s);
    case UnaryOp::rsqrt: return A(-1.5) * s * s;
    case UnaryOp::tanh: return A(-2) * s;
    case UnaryOp::sigmoid: return one - A(2) * s;
    case UnaryOp::relu: return A(0);
    case UnaryOp::leaky_relu: return A(0);
    case UnaryOp::gelu: {
      A pdf = A(0.39894228040143267794) * std::exp(-half * s * s);
      return pdf * (A(2) - s * s);
    }
    case UnaryOp::gelu_tanh: {
      A c = A(0.79788456080286535588), k = A(0.044715);
      A t = std::tanh(c * (s + k * s * s * s));
      A sech2 = one - t * t;
      A du = c * (one + A(3) * k * s * s);
      A ddu = c * A(6) * k * s;
      return sech2 * du + half * s * (A(-2) * t * sech2 * du * du + sech2 * ddu);
    }
    case UnaryOp::pow: return alpha * (alpha - one) * std::pow(s, alpha - A(2));
    case UnaryOp::erf: return A(-2.25675833419102514780) * s * std::exp(-s * s);
    case UnaryOp::softplus: {
      const A sig = one / (one + std::exp(-s));
      return sig * (one - sig);
    }
  }
  return A(0);
}

enum class BinaryOp : uint8_t { add, sub, mul, div, maximum, minimum };

template <typename A> ENGINE_HD A binary_f(BinaryOp op, A a, A b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::maximum: return a > b ? a : b;
    case BinaryOp::minimum: return a < b ? a : b;
  }
  return A(0);
}

enum class CompareOp : uint8_t { gt, ge, lt, le, eq, ne };

template <typename A> ENGINE_HD bool compare_f(CompareOp op, A a, A b) {
  switch (op) {
    case CompareOp::gt: return a > b;
    case CompareOp::ge: return a >= b;
    case CompareOp::lt: return a < b;
    case CompareOp::le: return a <= b;
    case CompareOp::eq: return a == b;
    case CompareOp::ne: return a != b;
  }
  return false;
}

}  // namespace ops
