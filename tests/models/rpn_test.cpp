// rpn_test.cpp: the RPN's proposal selection (models/vision/rpn.h) against torchvision's
// RegionProposalNetwork.filter_proposals on the same logits, codes and anchors (tests/data/
// detection_reference.safetensors, from tools/bench/detection_parity.py), its fixed slots and padding, and meta.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/device.h"
#include "engine/safetensors.h"
#include "models/vision/rpn.h"
#include "ops/detection.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/view.h"
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
  });
}
