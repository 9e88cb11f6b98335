// model.cpp: the default training and evaluation steps.
#include "models/model.h"

#include <cmath>
#include <stdexcept>

#include "engine/context.h"
#include "engine/format.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/optimizer.h"
#ifdef ENGINE_CUDA
#include "engine/cuda/runtime.h"
#endif

namespace models {

using engine::Category;
using engine::Phase;

void Model::set_precision(Precision p) {
  ENGINE_CHECK(optimizer_->step_count() == 0, "set_precision: the model has already taken a step");
  precision_ = p;
#ifdef ENGINE_CUDA
  engine::cuda::set_allow_tf32(p == Precision::tf32);  // process-wide: the last model built decides
#endif
  if (compute_dtype() != engine::DType::f32) lower_parameters(module(), *optimizer_, compute_dtype());
}

std::string first_non_finite_parameter(const graph::Module& module) {
  graph::NoGrad no_grad;
  auto params = module.named_parameters();
  if (params.empty()) return "";
  std::vector<Tensor> tensors;
  for (const auto& [name, p] : params) tensors.push_back(p);
  const std::vector<double> sums = ops::squared_norms(tensors).to_double();
  for (size_t i = 0; i < params.size(); i++)
    if (!std::isfinite(sums[i])) return params[i].first;
  return "";
}

void Model::set_fixed_batch(Batch batch) {
  ENGINE_CHECK(!batch.empty(), "the fixed batch holds no tensors: give a batch file with the tensors the model's "
               "batches have (see its make_batch)");
  for (const auto& [name, t] : batch)
    ENGINE_CHECK(t.numel() > 0, "the fixed batch's tensor '", name, "' is empty (shape ", engine::shape_str(t.shape()),
                 "): a step needs at least one item");
  fixed_batch_ = std::move(batch);
}

Batch Model::next_batch(int64_t step) { return fixed_batch_.empty() ? make_batch(step) : fixed_batch_; }

Tensor Model::batch_loss(const Batch& batch) {
  if (fixed_batch_.empty()) return loss(batch);
  try {
    return loss(batch);
  } catch (const std::out_of_range&) {  // std::map::at: the model read a name the batch file lacks
    std::string names;
    for (const auto& [name, t] : batch)
      names += (names.empty() ? "" : ", ") + name + " " + engine::shape_str(t.shape());
    throw engine::Error(engine::str("the fixed batch lacks a tensor the model reads; it holds: ", names,
                                    ". Write the names and shapes the model's own batches have (see its make_batch)"));
  }
}

StepResult Model::train_step(int64_t step) {
  module().train();
  StepResult r;
  Tensor l;
  {
    engine::PhaseScope phase(Phase::forward);
    Batch batch;
    {
      engine::CategoryScope input(Category::input);
      engine::MemoryScope owner("batch");
      batch = next_batch(step);
    }
    l = batch_loss(batch);
    r.items = items(batch);
  }
  const bool scaled = precision_ == Precision::fp16;
  // fp16: backward from loss x scale, so that small gradients stay above f16's smallest normal.
  graph::backward(scaled ? ops::mul(l, loss_scaler_.scale) : l);
  {
    engine::PhaseScope phase(Phase::optimizer);
    // Clipping and fp16 unscaling are folded into the update: one norm pass over the gradients, then the
    // optimizer multiplies each gradient by (1 / scale) x (the clip coefficient) inside its fused kernel,
    // instead of a scaling pass per gradient (torch.nn.utils.clip_grad_norm_'s g *= max_norm / (norm + 1e-6)).
    bool apply = true;
    double grad_scale = 1;
    if (scaled || clip_norm_ > 0) {
      const double unscale = scaled ? 1.0 / loss_scaler_.scale : 1.0;
      const double norm = ops::grad_norm(module().parameters()) * unscale;
      grad_scale = unscale;
      if (clip_norm_ > 0 && norm > clip_norm_) grad_scale *= clip_norm_ / (norm + 1e-6);
      if (scaled) {
        const double scale = loss_scaler_.scale;
        apply = loss_scaler_.update(std::isfinite(norm));
        if (!apply)
          r.details.push_back(engine::str("fp16: gradients overflowed at loss scale ", scale,
                                          ": update skipped, scale now ", loss_scaler_.scale));
      }
    }
    if (apply) {
      optimizer_->set_grad_scale(grad_scale);
      if (schedule_) optimizer_->set_lr(schedule_->lr(optimizer_->step_count()));
      optimizer_->step();
    } else {
      optimizer_->allocate_state();  // the layout as if the update had run (see Optimizer::allocate_state)
    }
    optimizer_->zero_grad();
  }
  r.loss = l.item();
  r.losses["loss"] = r.loss;
  return r;
}

StepResult Model::eval_step(int64_t step) {
  module().eval();
  graph::NoGrad ng;
  engine::PhaseScope phase(Phase::forward);
  Batch batch;
  {
    engine::CategoryScope input(Category::input);
    engine::MemoryScope owner("batch");
    batch = next_batch(step);
  }
  StepResult r;
  r.loss = batch_loss(batch).item();
  r.losses["loss"] = r.loss;
  r.items = items(batch);
  return r;
}

}  // namespace models
