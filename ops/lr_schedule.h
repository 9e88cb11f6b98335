// lr_schedule.h: learning-rate schedules, lr(step) as a pure function of the step.
//
// `step` counts the optimizer updates already done: lr(0) is the rate of the first update. This is the
// convention of fairseq (lr_scheduler.step_update(num_updates) after each update and step_update(0) at
// start), of Hugging Face's LambdaLR schedules, and of TF's global_step. A pure function (no internal
// counter) means resuming from a checkpoint only needs the optimizer's step count.
//
// Usage in a training loop:  opt.set_lr(schedule.lr(opt.step_count()));  opt.step();
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ops {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lr(int64_t step) const = 0;
  // One line for the run header, e.g. "inverse_sqrt(lr 0.0005, warmup 4000, warmup_init_lr 0)".
  virtual std::string describe() const = 0;
};

// lr(step) = base.
class ConstantLr : public LrSchedule {
 public:
  explicit ConstantLr(double base);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  double base_;
};

// Linear warmup from 0 to base over `warmup` steps, then linear decay to 0 at `total` steps (BERT).
//   Hugging Face get_linear_schedule_with_warmup (default):
//     step < warmup:  base * step / warmup
//     else:           base * max(0, (total - step) / (total - warmup))
//   google-research/bert optimization.py (tf_bert = true): the decay line starts at step 0, so the rate
//   drops from base to base * (1 - warmup / total) when warmup ends:
//     step < warmup:  base * step / warmup
//     else:           base * (1 - min(step, total) / total)
class LinearWarmupDecay : public LrSchedule {
 public:
  LinearWarmupDecay(double base, int64_t warmup, int64_t total, bool tf_bert = false);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  double base_;
  int64_t warmup_, total_;
  bool tf_bert_;
};

// fairseq inverse_sqrt (fairseq/optim/lr_scheduler/inverse_square_root_schedule.py):
//   warmup_init_lr < 0 (fairseq's default -1) means 0 when warmup > 0, else base
//   step < warmup:  warmup_init_lr + step * (base - warmup_init_lr) / warmup
//   else:           base * sqrt(warmup) / sqrt(step)
// With warmup_init_lr = 0 this is base * min(step / warmup, sqrt(warmup / step)); note lr(0) = 0 then:
// fairseq's first update runs at warmup_init_lr.
class InverseSqrt : public LrSchedule {
 public:
  InverseSqrt(double base, int64_t warmup, double warmup_init_lr = -1);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  double base_, warmup_init_lr_;
  int64_t warmup_;
};

// Poly (DeepLab: TF polynomial_decay with end lr 0; jfzhang95/pytorch-deeplab-xception's "poly"):
//   base * (1 - min(step, max_steps) / max_steps)^power        (power 0.9 in DeepLab)
class PolyLr : public LrSchedule {
 public:
  PolyLr(double base, int64_t max_steps, double power = 0.9);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  double base_;
  int64_t max_steps_;
  double power_;
};

// TF's exponential_decay (the NASNet recipe: rate 0.97 every 2.4 epochs, staircase):
//   base * rate^(step / decay_steps), the exponent floored when staircase (TF's staircase=True)
class ExponentialDecay : public LrSchedule {
 public:
  ExponentialDecay(double base, double rate, double decay_steps, bool staircase = true);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  double base_, rate_, decay_steps_;
  bool staircase_;
};

// Darknet's burn-in + steps policy (pjreddie/darknet src/network.c get_current_rate; YOLOv3's cfg: burn_in 1000,
// power 4, steps 400000,450000, scales .1,.1). Darknet counts b = the updates done INCLUDING the one being made
// (its `seen` grows before the update), so with step = updates already done, b = step + 1:
//   b < burn_in:  base * (b / burn_in)^power
//   else:         base * the product of scales[i] over every i with steps[i] <= b
class DarknetSteps : public LrSchedule {
 public:
  DarknetSteps(double base, int64_t burn_in, double power, std::vector<int64_t> steps, std::vector<double> scales);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  double base_;
  int64_t burn_in_;
  double power_;
  std::vector<int64_t> steps_;
  std::vector<double> scales_;
};

// maskrcnn-benchmark's WarmupMultiStepLR (solver/lr_scheduler.py, warm-up "linear"), at update `step` (its
// last_epoch, the updates already done):
//   step < warmup:  base * (factor (1 - step / warmup) + step / warmup) * gamma^(milestones <= step)
//   else:           base * gamma^(the number of milestones <= step)
class WarmupMultiStep : public LrSchedule {
 public:
  WarmupMultiStep(double base, int64_t warmup, double factor, std::vector<int64_t> milestones, double gamma = 0.1);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  double base_;
  int64_t warmup_;
  double factor_;
  std::vector<int64_t> milestones_;
  double gamma_;
};

}  // namespace ops
