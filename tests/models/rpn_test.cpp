// rpn_test.cpp: the RPN's proposal selection (models/vision/rpn.h) against torchvision's
// RegionProposalNetwork.filter_proposals on the same logits, codes and anchors (tests/data/
// detection_reference.safetensors, from tools/bench/detection_parity.py), its fixed slots and padding; the training
// targets and loss against torchvision's assign_targets_to_anchors, encode and compute_loss (with the same sampled
// anchors), the loss's gradient against finite differences; meta.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/device.h"
#include "engine/safetensors.h"
#include "graph/autograd.h"
#include "models/vision/rpn.h"
#include "ops/detection.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/shape.h"
#include "ops/view.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;

TEST(RpnProposals, MatchTorchvisionsFilterProposals) {
  auto file = engine::load_safetensors("tests/data/detection_reference.safetensors", engine::default_device());
  const int64_t K0 = 16 * 24 * 3, K1 = 8 * 12 * 3;
  const Tensor logits = file.at("rpn.objectness"), codes = file.at("rpn.deltas");
  std::vector<Tensor> objectness = {ops::contiguous(ops::slice(logits, 1, 0, K0)),
                                    ops::contiguous(ops::slice(logits, 1, K0, K0 + K1))};
  std::vector<Tensor> deltas = {ops::contiguous(ops::slice(codes, 1, 0, K0)),
                                ops::contiguous(ops::slice(codes, 1, K0, K0 + K1))};
  std::vector<Tensor> anchors = {ops::grid_anchors(16, 24, 4, 4, {32}, {0.5, 1.0, 2.0}),
                                 ops::grid_anchors(8, 12, 8, 8, {64}, {0.5, 1.0, 2.0})};
  models::vision::RpnParams p;
  p.pre_nms_top_n = 200, p.post_nms_top_n = 150;
  Tensor hw = ops::from_vector(std::vector<float>{64, 96, 60, 90}, {2, 2}, DType::f32);
  models::vision::Proposals got = models::vision::rpn_proposals(objectness, deltas, anchors, hw, p);
  ASSERT_EQ(got.boxes.shape(), (Shape{2, 150, 4}));
  const std::vector<double> boxes = got.boxes.to_double(), want_boxes = file.at("expected.rpn.boxes").to_double();
  const std::vector<double> scores = got.scores.to_double(), want_scores = file.at("expected.rpn.scores").to_double();
  const std::vector<double> valid = got.valid.to_double(), count = file.at("expected.rpn.count").to_double();
  for (int64_t n = 0; n < 2; n++)
    for (int64_t j = 0; j < 150; j++) {
      const size_t s = size_t(n * 150 + j);
      EXPECT_EQ(valid[s] != 0, double(j) < count[size_t(n)]) << "image " << n << " slot " << j;
      EXPECT_NEAR(scores[s], want_scores[s], 1e-6) << "image " << n << " slot " << j;
      for (int k = 0; k < 4; k++) EXPECT_NEAR(boxes[s * 4 + k], want_boxes[s * 4 + k], 1e-3) << n << " " << j;
    }
}

TEST(RpnLoss, TargetsAndLossMatchTorchvision) {
  auto file = engine::load_safetensors("tests/data/detection_reference.safetensors", engine::default_device());
  Tensor l0 = ops::grid_anchors(16, 24, 4, 4, {32}, {0.5, 1.0, 2.0});
  Tensor l1 = ops::grid_anchors(8, 12, 8, 8, {64}, {0.5, 1.0, 2.0});
  Tensor anchors = ops::concat({l0, l1}, 0);
  Tensor valid = ops::reshape(
      ops::compare(ops::CompareOp::ne, ops::from_vector(std::vector<double>{1, 1, 1, 1, 1, 0}, {6}, DType::f32), 0.0),
      {2, 3});
  models::vision::RpnTargets t = models::vision::rpn_targets(anchors, file.at("rpn.truths"), valid);
  EXPECT_EQ(t.labels.to_double(), file.at("expected.rpn.labels").to_double());
  // torchvision encodes every anchor, the unmatched ones against truth 0 too: compare all of them.
  EXPECT_LE(testutil::max_abs_diff(t.targets, file.at("expected.rpn.targets")), 1e-4);
  ops::Sampled sampled{file.at("rpn.sampled_index"), file.at("rpn.sampled_label")};
  models::vision::RpnLoss loss =
      models::vision::rpn_loss(file.at("rpn.objectness"), file.at("rpn.deltas"), t.targets, sampled);
  const std::vector<double> want = file.at("expected.rpn.loss").to_double();
  EXPECT_NEAR(loss.objectness.item(), want[0], 1e-5);
  EXPECT_NEAR(loss.box.item(), want[1], 1e-5);
}

TEST(RpnLoss, GradientsOfTheLogitsAndCodes) {
  // f64 logits and codes through the loss (padding slots included), against finite differences.
  Tensor targets = ops::randn({1, 6, 4});
  ops::Sampled sampled{ops::from_vector(std::vector<int64_t>{3, 0, 5, 0}, {1, 4}, DType::i64),
                       ops::from_vector(std::vector<int64_t>{1, 0, 0, -1}, {1, 4}, DType::i64)};
  Tensor logits = testutil::rand_input({1, 6}), codes = testutil::rand_input({1, 6, 4}, -0.3, 0.3);
  testutil::expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        models::vision::RpnLoss l = models::vision::rpn_loss(in[0], in[1], targets, sampled);
        return ops::add(l.objectness, l.box);
      },
      {logits, codes});
}

TEST(RpnProposals, FixedSlotsWithPaddingWhenFewSurvive) {
  // Ten copies of one anchor, no offsets: NMS keeps one; the other slots are padding.
  std::vector<float> a;
  for (int i = 0; i < 10; i++) a.insert(a.end(), {10, 10, 30, 40});
  Tensor anchors = ops::from_vector(a, {10, 4}, DType::f32);
  Tensor logits = ops::from_vector(std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 10}, DType::f32);
  models::vision::RpnParams p;
  p.post_nms_top_n = 5;
  Tensor hw = ops::from_vector(std::vector<float>{100, 100}, {1, 2}, DType::f32);
  models::vision::Proposals got = models::vision::rpn_proposals({logits}, {ops::zeros({1, 10, 4})}, {anchors}, hw, p);
  EXPECT_EQ(got.valid.to_double(), (std::vector<double>{1, 0, 0, 0, 0}));
  const std::vector<double> s = got.scores.to_double();
  EXPECT_NEAR(s[0], 1 / (1 + std::exp(-9.0)), 1e-6);  // the highest logit's box survives
  for (int j = 1; j < 5; j++) EXPECT_EQ(s[size_t(j)], -1.0);
  const std::vector<double> b = got.boxes.to_double();
  EXPECT_EQ(std::vector<double>(b.begin(), b.begin() + 4), (std::vector<double>{10, 10, 30, 40}));
  for (size_t e = 4; e < b.size(); e++) EXPECT_EQ(b[e], 0.0);
}

TEST(RpnProposals, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor anchors = ops::grid_anchors(8, 12, 8, 8, {64}, {0.5, 1.0, 2.0});
    const int64_t K = anchors.size(0);
    models::vision::RpnParams p;
    p.pre_nms_top_n = 100, p.post_nms_top_n = 60;
    Tensor hw = ops::full({2, 2}, 64.0, DType::f32);
    models::vision::Proposals got =
        models::vision::rpn_proposals({ops::randn({2, K})}, {ops::randn({2, K, 4})}, {anchors}, hw, p);
    EXPECT_EQ(got.scores.shape(), (Shape{2, 60}));
    // Training: targets, a balanced draw, the loss and its backward.
    Tensor truths = ops::from_vector(std::vector<float>{4, 4, 40, 30, 20, 10, 60, 50}, {2, 1, 4}, DType::f32);
    models::vision::RpnTargets t = models::vision::rpn_targets(anchors, truths, Tensor());
    Tensor logits = ops::randn({2, K}), codes = ops::randn({2, K, 4});
    logits.set_requires_grad(true);
    codes.set_requires_grad(true);
    models::vision::RpnLoss l =
        models::vision::rpn_loss(logits, codes, t.targets, ops::sample_balanced(t.labels, 64, 0.5));
    graph::backward(ops::add(l.objectness, l.box));
    EXPECT_TRUE(logits.grad().defined());
  });
}
