// elementwise.h: pointwise ops with NumPy broadcasting, casts and copies.
//
// Binary ops need equal dtypes (cast explicitly with to()); shapes broadcast as in NumPy. FLOPs: one per
// output element (a transcendental counts one too); bytes: inputs read + output written.
// Backward rules are engine ops: add/sub/mul/div reduce the gradient back to each input's shape with
// sum_to(); unary ops use unary_backward (g * f'(s), one kernel) whose own rule gives double backward.
#pragma once
#include "engine/tensor.h"
#include "ops/elementwise_math.h"

namespace ops {

using engine::DType;
using engine::Shape;
using engine::Tensor;

// Broadcast shape of two shapes, or an Error naming `op` and both shapes.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

// --- binary ---------------------------------------------------------------------------------------
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

// --- unary ----------------------------------------------------------------------------------------
Tensor unary(UnaryOp op, const Tensor& x, double alpha = 0, double beta = 0);
// g * f'(s) where s is the saved input or output (see elementwise_math.h).
Tensor unary_backward(UnaryOp op, const Tensor& g, const Tensor& s, double alpha = 0, double beta = 0);
Tensor add(const Tensor& x, double c);    // x + c
Tensor mul(const Tensor& x, double c);    // x * c
Tensor scale(const Tensor& x, double c);  // x * c
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor leaky_relu(const Tensor& x, double slope);
Tensor gelu(const Tensor& x);       // erf form (BERT, XLM)
Tensor gelu_tanh(const Tensor& x);  // tanh approximation
Tensor pow(const Tensor& x, double exponent);
Tensor erf(const Tensor& x);
Tensor softplus(const Tensor& x);  // log(1 + exp(x)), overflow-free (StyleGAN's logistic losses)

// --- comparisons (no gradient; result dtype bool, 1 or 0) -------------------------------------------
Tensor compare(CompareOp op, const Tensor& x, double c);
Tensor compare(CompareOp op, const Tensor& a, const Tensor& b);

// --- casts, copies, broadcasting views ---------------------------------------------------------------
Tensor to(const Tensor& x, DType dtype);  // differentiable between floating types
Tensor clone(const Tensor& x);            // a contiguous copy (differentiable)
Tensor contiguous(const Tensor& x);       // x itself when already contiguous
// A view of x broadcast to `shape` (stride 0 on expanded dimensions); backward sums back.
Tensor broadcast_to(const Tensor& x, const Shape& shape);

// --- in place (not recorded: only on tensors that need no gradient, or under NoGrad) ----------------
void add_(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a += alpha * b (b broadcasts)
void mul_(const Tensor& a, double c);                            // a *= c
void fill_(const Tensor& a, double value);
void copy_(const Tensor& dst, const Tensor& src);  // same shape; casts between dtypes

}  // namespace ops
