// lr_schedule.cpp: the schedules of lr_schedule.h.
#include "ops/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"

namespace ops {

namespace {
void check_step(const char* schedule, int64_t step) {
  ENGINE_CHECK(step >= 0, schedule, ": step must be >= 0, got ", step);
}
}  // namespace

// ---------------------------------------------------------------------------------------------------
ConstantLr::ConstantLr(double base) : base_(base) {
  ENGINE_CHECK(base >= 0, "constant lr: base rate must be >= 0, got ", base);
}

double ConstantLr::lr(int64_t step) const {
  check_step("constant lr", step);
  return base_;
}

std::string ConstantLr::describe() const { return engine::str("constant(lr ", base_, ")"); }

// ---------------------------------------------------------------------------------------------------
LinearWarmupDecay::LinearWarmupDecay(double base, int64_t warmup, int64_t total, bool tf_bert)
    : base_(base), warmup_(warmup), total_(total), tf_bert_(tf_bert) {
  ENGINE_CHECK(base >= 0, "linear warmup/decay: base rate must be >= 0, got ", base);
  ENGINE_CHECK(warmup >= 0 && total > 0 && warmup <= total, "linear warmup/decay: need 0 <= warmup <= total and ",
               "total > 0, got warmup ", warmup, ", total ", total);
}

double LinearWarmupDecay::lr(int64_t step) const {
  check_step("linear warmup/decay", step);
  if (step < warmup_) return base_ * double(step) / double(warmup_);
  if (tf_bert_) return base_ * (1.0 - double(std::min(step, total_)) / double(total_));
  if (total_ == warmup_) return 0.0;
  return base_ * std::max(0.0, double(total_ - step) / double(total_ - warmup_));
}

std::string LinearWarmupDecay::describe() const {
  return engine::str("linear_warmup_decay(lr ", base_, ", warmup ", warmup_, ", total ", total_,
                     tf_bert_ ? ", google-research/bert form)" : ")");
}

// ---------------------------------------------------------------------------------------------------
InverseSqrt::InverseSqrt(double base, int64_t warmup, double warmup_init_lr)
    : base_(base), warmup_init_lr_(warmup_init_lr < 0 ? (warmup > 0 ? 0.0 : base) : warmup_init_lr), warmup_(warmup) {
  ENGINE_CHECK(base >= 0, "inverse_sqrt: base rate must be >= 0, got ", base);
  ENGINE_CHECK(warmup >= 0, "inverse_sqrt: warmup must be >= 0, got ", warmup);
}

double InverseSqrt::lr(int64_t step) const {
  check_step("inverse_sqrt", step);
  if (step < warmup_) return warmup_init_lr_ + double(step) * (base_ - warmup_init_lr_) / double(warmup_);
  // fairseq with warmup 0 would compute 0^-0.5 at step 0; we take the rate at step 1 instead (= base).
  double w = double(std::max<int64_t>(warmup_, 1));
  return base_ * std::sqrt(w) / std::sqrt(double(std::max<int64_t>(step, 1)));
}

std::string InverseSqrt::describe() const {
  return engine::str("inverse_sqrt(lr ", base_, ", warmup ", warmup_, ", warmup_init_lr ", warmup_init_lr_, ")");
}

// ---------------------------------------------------------------------------------------------------
PolyLr::PolyLr(double base, int64_t max_steps, double power) : base_(base), max_steps_(max_steps), power_(power) {
  ENGINE_CHECK(base >= 0, "poly lr: base rate must be >= 0, got ", base);
  ENGINE_CHECK(max_steps > 0, "poly lr: max_steps must be > 0, got ", max_steps);
  ENGINE_CHECK(power > 0, "poly lr: power must be > 0, got ", power);
}

double PolyLr::lr(int64_t step) const {
  check_step("poly lr", step);
  return base_ * std::pow(1.0 - double(std::min(step, max_steps_)) / double(max_steps_), power_);
}

std::string PolyLr::describe() const {
  return engine::str("poly(lr ", base_, ", max_steps ", max_steps_, ", power ", power_, ")");
}

ExponentialDecay::ExponentialDecay(double base, double rate, double decay_steps, bool staircase)
    : base_(base), rate_(rate), decay_steps_(decay_steps), staircase_(staircase) {
  ENGINE_CHECK(base >= 0, "exponential decay lr: base rate must be >= 0, got ", base);
  ENGINE_CHECK(rate > 0 && rate <= 1, "exponential decay lr: rate must be in (0, 1], got ", rate);
  ENGINE_CHECK(decay_steps > 0, "exponential decay lr: decay_steps must be > 0, got ", decay_steps);
}

double ExponentialDecay::lr(int64_t step) const {
  check_step("exponential decay lr", step);
  const double e = double(step) / decay_steps_;
  return base_ * std::pow(rate_, staircase_ ? std::floor(e) : e);
}

std::string ExponentialDecay::describe() const {
  return engine::str("exponential_decay(lr ", base_, ", rate ", rate_, " every ", decay_steps_, " steps",
                     staircase_ ? ", staircase" : "", ")");
}

DarknetSteps::DarknetSteps(double base, int64_t burn_in, double power, std::vector<int64_t> steps,
                           std::vector<double> scales)
    : base_(base), burn_in_(burn_in), power_(power), steps_(std::move(steps)), scales_(std::move(scales)) {
  ENGINE_CHECK(base >= 0, "darknet steps lr: base rate must be >= 0, got ", base);
  ENGINE_CHECK(burn_in >= 0, "darknet steps lr: burn_in must be >= 0, got ", burn_in);
  ENGINE_CHECK(power > 0, "darknet steps lr: power must be > 0, got ", power);
  ENGINE_CHECK(steps_.size() == scales_.size(), "darknet steps lr: ", steps_.size(), " steps but ", scales_.size(),
               " scales: give one scale per step");
  for (size_t i = 1; i < steps_.size(); i++)
    ENGINE_CHECK(steps_[i] > steps_[i - 1], "darknet steps lr: steps must increase, got ", steps_[i - 1], " then ",
                 steps_[i]);
}

double DarknetSteps::lr(int64_t step) const {
  check_step("darknet steps lr", step);
  const int64_t b = step + 1;  // darknet's batch number of this update
  if (b < burn_in_) return base_ * std::pow(double(b) / double(burn_in_), power_);
  double rate = base_;
  for (size_t i = 0; i < steps_.size() && steps_[i] <= b; i++) rate *= scales_[i];
  return rate;
}

std::string DarknetSteps::describe() const {
  std::string steps;
  for (size_t i = 0; i < steps_.size(); i++) steps += engine::str(i ? "," : "", steps_[i], " x", scales_[i]);
  return engine::str("darknet_steps(lr ", base_, ", burn_in ", burn_in_, ", power ", power_, ", steps ", steps, ")");
}

WarmupMultiStep::WarmupMultiStep(double base, int64_t warmup, double factor, std::vector<int64_t> milestones,
                                 double gamma)
    : base_(base), warmup_(warmup), factor_(factor), milestones_(std::move(milestones)), gamma_(gamma) {
  ENGINE_CHECK(base >= 0 && warmup >= 0 && factor >= 0 && factor <= 1 && gamma > 0, "warmup multi-step lr: base ", base,
               ", warmup ", warmup, ", factor ", factor, " and gamma ", gamma,
               ": expected base >= 0, warmup >= 0, factor in [0, 1], gamma > 0");
  for (size_t i = 1; i < milestones_.size(); i++)
    ENGINE_CHECK(milestones_[i] > milestones_[i - 1], "warmup multi-step lr: milestones must increase, got ",
                 milestones_[i - 1], " then ", milestones_[i]);
}

double WarmupMultiStep::lr(int64_t step) const {
  check_step("warmup multi-step lr", step);
  double rate = base_;
  if (step < warmup_) {
    const double alpha = double(step) / double(warmup_);
    rate *= factor_ * (1 - alpha) + alpha;
  }
  for (int64_t m : milestones_)
    if (m <= step) rate *= gamma_;
  return rate;
}

std::string WarmupMultiStep::describe() const {
  std::string steps;
  for (size_t i = 0; i < milestones_.size(); i++) steps += engine::str(i ? "," : "", milestones_[i]);
  return engine::str("warmup_multistep(lr ", base_, ", warmup ", warmup_, " from x", factor_, ", x", gamma_, " at ",
                     steps.empty() ? "none" : steps, ")");
}

}  // namespace ops
