// cpu/optim.h: CPU reference kernels of the optimizer family: one fused pass per parameter tensor.
//
// Every tensor in a ParamUpdate is contiguous with one shape and dtype (ops/optim.cpp checks it), so the
// kernels walk a flat index. Math in acc_t<T>; hyperparameters and bias corrections are computed once on
// the host in double and converted.
#pragma once
#include <vector>

#include "engine/tensor.h"
#include "ops/optim.h"

namespace ops::cpu {

void sgd_update(const ParamUpdate& t, const SgdStep& h);
void adam_update(const ParamUpdate& t, const AdamStep& h);
void adamax_update(const ParamUpdate& t, const AdamaxStep& h);
void rmsprop_update(const ParamUpdate& t, const RmsPropStep& h);
// out[i] = sum of xs[i]^2 over its elements, accumulated in double (out: [n] f64, contiguous xs).
void squared_norms(const std::vector<engine::Tensor>& xs, const engine::Tensor& out);

}  // namespace ops::cpu
