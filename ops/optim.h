// optim.h: the optimizers' fused multi-tensor updates (SGD, Adam/AdamW, Adamax, RMSProp), Adafactor's update (not
// fused: its factored statistics need reductions) and the global gradient norm (clipping, fp16's overflow check).
//
// Each *_update is one op over a list of parameters that share one set of hyperparameters: one pass over each
// parameter, its gradient and its slots (and f32 master weight under mixed precision), no temporaries. The cpu
// kernels in ops/cpu/optim.cpp (one parameter at a time) are the reference; ops/cuda/optim.cu updates up to
// 48 parameters per kernel launch (a model's thousand small tensors in a few dozen launches, not a thousand).
// The stateful optimizers that call them, one slot set per parameter, are ops/optimizer.h.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace ops {

using engine::Tensor;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// ---------------------------------------------------------------------------------------------------
// Fused updates (the kernels' interface; also used directly by the CUDA tests).
//
// ParamUpdate names the tensors one parameter's update touches: all contiguous, one shape, one device.
// The math runs in acc_t<T> (f32, or f64 for f64 tensors); hyperparameters arrive as doubles.
// Without a master copy, param, grad and slots share one dtype. Mixed precision (models/precision.h): a
// bf16/f16 parameter has an f32 `master` copy; the kernel then loads and stores the weight in `master`
// (f32 math, f32 slots), reads the bf16/f16 grad, and writes the weight rounded to nearest-even into
// `param` (the copy the model computes with), in the same pass.
struct ParamUpdate {
  Tensor param, grad;
  std::vector<Tensor> slots;  // in the order of the optimizer's slot_names()
  Tensor master;              // f32 master weight, or undefined
  double grad_scale = 1;      // the gradient is multiplied by this first (1 / the fp16 loss scale)
  // Or by element 0 of this f64 tensor on the parameter's device, a factor computed there (clip_coefficient) that
  // the update reads as it runs, so the host never waits for it; grad_scale is then 1.
  Tensor scale_by{};
};
// The parameters one update op touches: any mix of dtypes and master copies, all on one device. Parameters
// are independent, so the order of the list does not change any result.
using ParamUpdates = std::vector<ParamUpdate>;

struct SgdStep {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer starts as a copy of the gradient (PyTorch)
};
struct AdamStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled_weight_decay = false;  // AdamW
  int64_t step = 1;                     // this parameter's step, 1 on its first: the bias corrections
};
struct AdamaxStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;
};
struct RmsPropStep {
  double lr = 0, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0;
  bool centered = false;
  bool tf_style = false;  // eps inside the sqrt, lr inside the momentum buffer (see RmsProp)
};

struct AdafactorStep {
  double lr = 0, beta2_decay = -0.8, eps1 = 0, eps2 = 1e-3, d = 1, weight_decay = 0;
  int64_t step = 1;
};

// slots: SGD {momentum_buffer} when momentum != 0, else {}.
void sgd_update(const ParamUpdates& ts, const SgdStep& h);
// slots: {exp_avg, exp_avg_sq}.
void adam_update(const ParamUpdates& ts, const AdamStep& h);
// slots: {exp_avg, exp_inf}.
void adamax_update(const ParamUpdates& ts, const AdamaxStep& h);
// slots: {square_avg, [momentum_buffer if momentum != 0], [grad_avg if centered]}.
void rmsprop_update(const ParamUpdates& ts, const RmsPropStep& h);
// slots: {row_var, col_var} (shapes: Adafactor::slots_for) for 2 or more dimensions, else {variance}. Written with
// the engine's ops (reductions and pointwise ops) on any device: not one pass, and it allocates temporaries of the
// parameter's size (at most two at a time beside the gradient and the weight), tagged as the optimizer's.
void adafactor_update(const ParamUpdates& ts, const AdafactorStep& h);

// ---------------------------------------------------------------------------------------------------
// torch.nn.utils.clip_grad_norm_: the L2 norm of all gradients together (undefined grads skipped),
// accumulated in f64; when norm > max_norm every grad is scaled in place by max_norm / (norm + 1e-6).
// Returns the norm before clipping (NaN/inf propagate into the grads, as in PyTorch). On meta devices
// there are no values: the norm reads 0 and nothing is scaled (the allocations are the same).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The same L2 norm of all gradients, scaling nothing (Model::train_step folds the clip coefficient into
// the optimizer's update instead: ParamUpdate::grad_scale).
double grad_norm(const std::vector<Tensor>& params);
// The clip coefficient of grad_norm's norm, computed on the gradients' device: a [1] f64 tensor holding
// max_norm / (norm + 1e-6) when norm > max_norm, else 1 (a NaN norm gives 1, as the host's test does), with norm the
// square root of grad_norm's sum in its order, so that the value is the host's to the bit. For an update's
// ParamUpdate::scale_by: nothing waits for the GPU. Undefined when no gradient is. Meta: no value.
Tensor clip_coefficient(const std::vector<Tensor>& params, double max_norm);
// Squared L2 norm of each tensor, summed in f64: a new [n] f64 tensor on xs' device (xs non-empty).
Tensor squared_norms(const std::vector<Tensor>& xs);
// Elements per partial sum of squared_norms, on every device: the cpu sums chunks of this size in order, the
// cuda kernel one chunk per block, and the f64 workspace holds one partial per chunk, so the three must agree
// (meta allocates that workspace too).
constexpr int64_t kNormChunk = int64_t(1) << 16;

}  // namespace ops
