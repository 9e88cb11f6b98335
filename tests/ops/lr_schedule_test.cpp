// lr_schedule_test.cpp: each schedule against values computed by hand (shown in the comments).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/error.h"
#include "ops/lr_schedule.h"

TEST(LrSchedule, Constant) {
  ops::ConstantLr s(0.1);
  EXPECT_EQ(s.lr(0), 0.1);
  EXPECT_EQ(s.lr(1000000), 0.1);
}

TEST(LrSchedule, LinearWarmupThenLinearDecayHuggingFace) {
  // base 1e-4, warmup 10, total 110: warmup 1e-5 per step, then decay 1e-6 per step to 0 at 110.
  ops::LinearWarmupDecay s(1e-4, 10, 110);
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_NEAR(s.lr(1), 1e-5, 1e-18);
  EXPECT_NEAR(s.lr(5), 5e-5, 1e-18);
  EXPECT_NEAR(s.lr(10), 1e-4, 1e-18);     // peak
  EXPECT_NEAR(s.lr(11), 0.99e-4, 1e-18);  // (110 - 11) / 100
  EXPECT_NEAR(s.lr(60), 0.5e-4, 1e-18);
  EXPECT_EQ(s.lr(110), 0.0);
  EXPECT_EQ(s.lr(500), 0.0);  // clamped, never negative
}

TEST(LrSchedule, LinearWarmupThenLinearDecayGoogleBert) {
  // google-research/bert: the decay line base * (1 - step / total) starts at step 0; warmup overrides it.
  ops::LinearWarmupDecay s(1e-4, 10, 100, /*tf_bert=*/true);
  EXPECT_NEAR(s.lr(5), 5e-5, 1e-18);
  EXPECT_NEAR(s.lr(10), 0.9e-4, 1e-18);  // not 1e-4: the jump at the end of warmup
  EXPECT_NEAR(s.lr(50), 0.5e-4, 1e-18);
  EXPECT_EQ(s.lr(100), 0.0);
  EXPECT_EQ(s.lr(150), 0.0);
}

TEST(LrSchedule, InverseSqrtAsFairseq) {
  // fairseq defaults: warmup_init_lr -1 -> 0. base 5e-4, warmup 4000.
  ops::InverseSqrt s(5e-4, 4000);
  EXPECT_EQ(s.lr(0), 0.0);               // fairseq's first update runs at warmup_init_lr
  EXPECT_NEAR(s.lr(1), 1.25e-7, 1e-20);  // 5e-4 / 4000
  EXPECT_NEAR(s.lr(2000), 2.5e-4, 1e-18);
  EXPECT_NEAR(s.lr(4000), 5e-4, 1e-18);     // decay_factor / sqrt(4000) = base
  EXPECT_NEAR(s.lr(16000), 2.5e-4, 1e-18);  // base * sqrt(4000 / 16000) = base / 2
  EXPECT_NEAR(s.lr(36000), 5e-4 / 3, 1e-18);
  // = base * min(step / warmup, sqrt(warmup / step)) when warmup_init_lr = 0
  for (int64_t step : {1, 100, 3999, 4000, 4001, 10000, 123456})
    EXPECT_NEAR(s.lr(step), 5e-4 * std::min(step / 4000.0, std::sqrt(4000.0 / step)), 1e-18) << step;

  // warmup_init_lr 1e-7 (common in fairseq recipes): lr = 1e-7 + step * (5e-4 - 1e-7) / 4000 during warmup.
  ops::InverseSqrt w(5e-4, 4000, 1e-7);
  EXPECT_NEAR(w.lr(0), 1e-7, 1e-20);
  EXPECT_NEAR(w.lr(2000), 1e-7 + 2000 * (5e-4 - 1e-7) / 4000, 1e-18);
  EXPECT_NEAR(w.lr(4000), 5e-4, 1e-18);

  // No warmup: warmup_init_lr defaults to base, and the decay is base / sqrt(step).
  ops::InverseSqrt nw(1e-3, 0);
  EXPECT_NEAR(nw.lr(1), 1e-3, 1e-18);
  EXPECT_NEAR(nw.lr(4), 0.5e-3, 1e-18);
}

TEST(LrSchedule, PolyAsDeepLab) {
  // base 0.007, max 30000 steps, power 0.9: base * (1 - step / max)^0.9
  ops::PolyLr s(0.007, 30000, 0.9);
  EXPECT_EQ(s.lr(0), 0.007);
  EXPECT_NEAR(s.lr(15000), 0.007 * std::pow(0.5, 0.9), 1e-15);  // 0.007 * 0.535887 = 0.0037512
  EXPECT_NEAR(s.lr(15000), 0.0037512, 1e-7);
  EXPECT_NEAR(s.lr(27000), 0.007 * std::pow(0.1, 0.9), 1e-15);  // 0.007 * 0.125893 = 0.00088125
  EXPECT_EQ(s.lr(30000), 0.0);
  EXPECT_EQ(s.lr(40000), 0.0);
  ops::PolyLr linear(1.0, 4, 1.0);
  EXPECT_EQ(linear.lr(1), 0.75);
}

TEST(LrSchedule, ExponentialDecayAsTfStaircase) {
  // tf.compat.v1.train.exponential_decay(0.03, step, 20018.2, 0.97, staircase=True): NASNet's batch 32 recipe
  // (0.015 x 32 / 16 per 2.4 epochs of 1,281,167 images = 96,088 steps).
  ops::ExponentialDecay s(0.03, 0.97, 96088.0);
  EXPECT_EQ(s.lr(0), 0.03);
  EXPECT_EQ(s.lr(96087), 0.03);
  EXPECT_NEAR(s.lr(96088), 0.0291, 1e-15);
  EXPECT_NEAR(s.lr(3 * 96088 + 5), 0.03 * 0.912673, 1e-15);  // 0.97^3 = 0.912673
  ops::ExponentialDecay smooth(1.0, 0.5, 2.0, /*staircase=*/false);
  EXPECT_NEAR(smooth.lr(1), std::sqrt(0.5), 1e-15);
  EXPECT_THROW(ops::ExponentialDecay(0.1, 1.5, 10), engine::Error);
}

TEST(LrSchedule, BadArgumentsAreErrors) {
  EXPECT_THROW(ops::LinearWarmupDecay(1e-4, 200, 100), engine::Error);
  EXPECT_THROW(ops::PolyLr(0.1, 0), engine::Error);
  EXPECT_THROW(ops::ConstantLr(0.1).lr(-1), engine::Error);
  EXPECT_NE(ops::InverseSqrt(5e-4, 4000).describe().find("warmup 4000"), std::string::npos);
}

TEST(LrSchedule, DarknetBurnInThenStepsAsYoloV3Cfg) {
  // yolov3.cfg: learning_rate 0.001, burn_in 1000, power 4, steps 400000,450000, scales .1,.1. Darknet's batch
  // number b of the update made after `step` updates is step + 1 (get_current_batch after seen += batch).
  ops::DarknetSteps s(1e-3, 1000, 4, {400000, 450000}, {0.1, 0.1});
  EXPECT_NEAR(s.lr(0), 1e-3 * 1e-12, 1e-27);                 // b = 1: (1/1000)^4
  EXPECT_NEAR(s.lr(499), 1e-3 * 0.0625, 1e-18);              // b = 500: (1/2)^4
  EXPECT_NEAR(s.lr(998), 1e-3 * std::pow(0.999, 4), 1e-18);  // b = 999, the last burn-in update
  EXPECT_EQ(s.lr(999), 1e-3);                                // b = 1000
  EXPECT_EQ(s.lr(399998), 1e-3);                             // b = 399999
  EXPECT_NEAR(s.lr(399999), 1e-4, 1e-19);                    // b = 400000: steps[0] <= b
  EXPECT_NEAR(s.lr(449998), 1e-4, 1e-19);
  EXPECT_NEAR(s.lr(449999), 1e-5, 1e-20);
  EXPECT_NEAR(s.lr(600000), 1e-5, 1e-20);
  ops::DarknetSteps constant(0.01, 0, 4, {}, {});  // no burn-in, no steps: constant
  EXPECT_EQ(constant.lr(0), 0.01);
  EXPECT_EQ(constant.lr(12345), 0.01);
  EXPECT_THROW(ops::DarknetSteps(1e-3, 1000, 4, {10, 5}, {0.1, 0.1}), engine::Error);
  EXPECT_THROW(ops::DarknetSteps(1e-3, 1000, 4, {10}, {0.1, 0.1}), engine::Error);
  EXPECT_NE(s.describe().find("burn_in 1000"), std::string::npos) << s.describe();
}

TEST(LrSchedule, WarmupMultiStepIsMaskrcnnBenchmarks) {
  // e2e_mask_rcnn_R_50_FPN_1x: base 0.02, warm-up 500 updates from 1/3, x 0.1 at 60000 and 80000.
  ops::WarmupMultiStep s(0.02, 500, 1.0 / 3, {60000, 80000});
  EXPECT_DOUBLE_EQ(s.lr(0), 0.02 / 3);
  EXPECT_DOUBLE_EQ(s.lr(250), 0.02 * (1.0 / 3 * 0.5 + 0.5));
  EXPECT_DOUBLE_EQ(s.lr(500), 0.02);
  EXPECT_DOUBLE_EQ(s.lr(59999), 0.02);
  EXPECT_DOUBLE_EQ(s.lr(60000), 0.02 * 0.1);
  EXPECT_DOUBLE_EQ(s.lr(80000), 0.02 * 0.1 * 0.1);
  EXPECT_THROW(ops::WarmupMultiStep(0.02, 500, 2.0, {}), engine::Error);
  EXPECT_THROW(ops::WarmupMultiStep(0.02, 500, 0.5, {10, 10}), engine::Error);
}
