// gradcheck_util.h: gradient checks against central finite differences, in f64 on the cpu.
//
//   expect_gradcheck(f, inputs)          first derivatives of every input of f
//   expect_double_backward(f, inputs)    second derivatives (gradients of gradients, create_graph)
//
// f maps input tensors to one output tensor. The scalar checked is L = sum(f(x) * w) for a fixed random w,
// so every output element matters and a wrong element cannot hide in a sum.
#pragma once
#include <functional>
#include <vector>

#include "engine/tensor.h"

namespace testutil {

using engine::Tensor;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Random f64 leaf tensor on the cpu that requires grad.
Tensor rand_input(const engine::Shape& shape, double low = -1.0, double high = 1.0, bool requires_grad = true);

// Returns the largest error |analytic - numeric| / (atol + rtol * |numeric|) seen (<= 1 passes) and adds
// a gtest failure naming the input and element when it exceeds 1.
double expect_gradcheck(const Fn& f, const std::vector<Tensor>& inputs, double eps = 1e-6, double atol = 1e-7,
                        double rtol = 1e-5);
double expect_double_backward(const Fn& f, const std::vector<Tensor>& inputs, double eps = 1e-6,
                              double atol = 1e-6, double rtol = 1e-4);

// Largest absolute difference between two tensors' values (shapes must match).
double max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace testutil
