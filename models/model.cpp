// model.cpp: the default training and evaluation steps.
#include "models/model.h"

#include "engine/context.h"
#include "graph/autograd.h"

namespace models {

using engine::Category;
using engine::Phase;

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
  graph::backward(l);
  {
    engine::PhaseScope phase(Phase::optimizer);
    if (clip_norm_ > 0) ops::clip_grad_norm(module().parameters(), clip_norm_);
    if (schedule_) optimizer_->set_lr(schedule_->lr(optimizer_->step_count()));
    optimizer_->step();
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
