// precision.h: --precision fp32 | tf32 | bf16 | fp16, the numeric recipe of a training step.
//
//   fp32  every tensor f32, GEMMs in true fp32 (what the 2020 frameworks ran by default).
//   tf32  every tensor f32; cuBLASLt GEMMs with TF32 tensor-core inputs (engine::set_allow_tf32), f32
//         accumulate. On cpu and meta identical to fp32 (Eigen computes in f32; meta computes nothing).
//   bf16  mixed precision: the parameters the model computes with, their gradients and every activation are
//   fp16  bf16 (or f16); the optimizer keeps an f32 master copy of each weight (state "<name>.master",
//         category `optimizer`, owner "<name>/master") and f32 slots, and writes the rounded weight back
//         in the same fused pass. Reductions inside the kernels (layer norm and batch-norm statistics,
//         softmax, the losses' log-sum-exp) run in f32; every loss is returned in f32 (ops/loss.h).
//         Per parameter: 2 (weight) + 2 (grad) + 4 (master) + 8 (Adam) = 16 bytes, against 16 in fp32 —
//         the saving is the activations, which halve.
//         fp16 adds dynamic loss scaling (LossScaler, PyTorch's GradScaler defaults): the loss is multiplied
//         by the scale before backward; a step whose gradients overflowed (non-finite norm) is skipped and
//         the scale halved; after 2000 finite steps it doubles. The optimizer divides by the scale inside
//         its update (ParamUpdate::grad_scale), with the clip coefficient: no extra pass over the gradients.
//         Without fp16 nothing on the host needs the norm: the clip coefficient is computed on the device
//         (ops::clip_coefficient) and the update reads it there (ParamUpdate::scale_by), so the step never waits.
//
// Buffers (running statistics, position tables) stay f32; a model that adds one to an activation casts it
// to the activation's dtype (Model::compute_dtype()). Synthetic float inputs are made in the compute dtype.
#pragma once
#include <cstdint>
#include <string>

#include "engine/dtype.h"
#include "graph/module.h"
#include "ops/optimizer.h"

namespace models {

enum class Precision { fp32, tf32, bf16, fp16 };
const char* precision_name(Precision p);
Precision precision_from_name(const std::string& name);  // else an Error listing the four
// The dtype of parameters and activations: f32 for fp32/tf32, bf16, f16.
engine::DType compute_dtype(Precision p);

// Casts every floating parameter of `module` to `dtype` in place (the Tensor handles the module, its
// optimizer and any tied module share now hold the low-precision copy) and gives the optimizer that updates it
// (the first of `optimizers` that holds its name: a GAN has one per network) the original f32 tensor as the
// master weight; a parameter no optimizer holds (a frozen network, or inference: no optimizers) keeps only its
// low-precision copy and the f32 tensor is freed. Done once, after the model is built and before its first step.
void lower_parameters(const graph::Module& module, const std::vector<ops::Optimizer*>& optimizers, engine::DType dtype);

// fp16 dynamic loss scaling (torch.cuda.amp.GradScaler's defaults).
struct LossScaler {
  double scale = 65536.0;     // 2^16
  double growth = 2.0, backoff = 0.5;
  int64_t growth_interval = 2000;
  int64_t good_steps = 0;     // finite steps since the last change
  int64_t skipped = 0;        // steps skipped for overflow, in all
  // After a step's gradients were checked: true if the update may be applied. Adjusts the scale.
  bool update(bool finite);
};

}  // namespace models
