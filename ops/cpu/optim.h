// cpu/optim.h: CPU reference kernels of the optimizer family: one fused pass per parameter tensor.
//
// Every tensor in a ParamUpdate is contiguous with one shape and dtype (ops/optim.cpp checks it), so the
// kernels walk a flat index. Math in acc_t<T>; hyperparameters and bias corrections are computed once on
// the host in double and converted.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/rng.h"  // ENGINE_HD
#include "engine/tensor.h"
#include "ops/optim.h"

namespace ops::cpu {

// The clip coefficient of the gradients' norm sqrt(sums[0] + ... + sums[n - 1]) (added in order, as grad_norm
// does on the host): max_norm / (norm + 1e-6) when norm > max_norm, else 1 (NaN: 1). ENGINE_HD: the cuda kernel
// (cuda/optim.cu) computes it with this code, so both devices give the host's double to the bit.
ENGINE_HD double clip_coefficient_of(const double* sums, int64_t n, double max_norm) {
  double total = 0;
  for (int64_t i = 0; i < n; i++) total += sums[i];
  const double norm = sqrt(total);
  return norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

void sgd_update(const ParamUpdate& t, const SgdStep& h);
void adam_update(const ParamUpdate& t, const AdamStep& h);
void adamax_update(const ParamUpdate& t, const AdamaxStep& h);
void rmsprop_update(const ParamUpdate& t, const RmsPropStep& h);
// out[i] = sum of xs[i]^2 over its elements, accumulated in double (out: [n] f64, contiguous xs).
void squared_norms(const std::vector<engine::Tensor>& xs, const engine::Tensor& out);
// sums[0] = ops::clip_coefficient's factor of the norm sqrt(sums[0] + ... + sums[n - 1]) (added in order).
void clip_coefficient(const engine::Tensor& sums, double max_norm);

}  // namespace ops::cpu
