// model.cpp: the default training and evaluation steps.
#include "models/model.h"

#include <cmath>
#include <limits>

#include "engine/context.h"
#include "engine/format.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"
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

StepResult Model::train_step(int64_t step) {
  module().train();
  StepResult r;
  Tensor l;
  {
    engine::PhaseScope phase(Phase::forward);
    Batch batch;
    {
      engine::CategoryScope input(Category::input);
      batch = make_batch(step);
    }
    l = loss(batch);
    r.items = items(batch);
  }
  const bool scaled = precision_ == Precision::fp16;
  // fp16: backward from loss x scale, so that small gradients stay above f16's smallest normal.
  graph::backward(scaled ? ops::mul(l, loss_scaler_.scale) : l);
  {
    engine::PhaseScope phase(Phase::optimizer);
    bool apply = true;
    if (scaled) {
      // One norm pass both clips (against max_norm x scale, i.e. max_norm after unscaling) and detects an
      // overflow; the optimizer divides by the scale inside its update.
      const double limit = clip_norm_ > 0 ? clip_norm_ * loss_scaler_.scale : std::numeric_limits<double>::infinity();
      const double scale = loss_scaler_.scale;
      apply = loss_scaler_.update(std::isfinite(ops::clip_grad_norm(module().parameters(), limit)));
      optimizer_->set_grad_scale(1.0 / scale);
      if (!apply)
        r.details.push_back(engine::str("fp16: gradients overflowed at loss scale ", scale,
                                        ": update skipped, scale now ", loss_scaler_.scale));
    } else if (clip_norm_ > 0) {
      ops::clip_grad_norm(module().parameters(), clip_norm_);
    }
    if (apply) {
      if (schedule_) optimizer_->set_lr(schedule_->lr(optimizer_->step_count()));
      optimizer_->step();
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
    batch = make_batch(step);
  }
  StepResult r;
  r.loss = loss(batch).item();
  r.losses["loss"] = r.loss;
  r.items = items(batch);
  return r;
}

}  // namespace models
