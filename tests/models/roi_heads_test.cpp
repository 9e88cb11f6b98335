// roi_heads_test.cpp: the box head's targets and loss (models/vision/roi_heads.h) against torchvision's RoIHeads
// (add_gt_proposals, assign_targets_to_proposals, encode) and fastrcnn_loss on the same boxes and a fixed draw
// (tests/data/detection_reference.safetensors, from tools/bench/detection_parity.py); take_samples' padding; the
// loss's gradient; meta.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/device.h"
#include "engine/safetensors.h"
#include "graph/autograd.h"
#include "models/vision/roi_heads.h"
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

namespace {

Tensor mask(const std::vector<double>& v, const Shape& shape) {
  return ops::compare(ops::CompareOp::ne, ops::from_vector(v, shape, DType::f32), 0.0);
}

}  // namespace

TEST(RoiHeads, TargetsAndLossMatchTorchvision) {
  auto file = engine::load_safetensors("tests/data/detection_reference.safetensors", engine::default_device());
  Tensor proposals = file.at("roi.proposals");
  const int64_t P = proposals.size(1);
  Tensor proposal_valid = ops::compare(ops::CompareOp::ge, ops::zeros({2, P}), 0.0);  // all valid
  Tensor truth_valid = mask({1, 1, 1, 1, 1, 0}, {2, 3});
  models::vision::RoiTargets t = models::vision::roi_targets(proposals, proposal_valid, file.at("rpn.truths"),
                                                             file.at("roi.truth_labels"), truth_valid);
  ASSERT_EQ(t.boxes.shape(), (Shape{2, P + 3, 4}));
  EXPECT_EQ(t.labels.to_double(), file.at("expected.roi.labels").to_double());
  // Every target but the engine's padding candidate (image 1's last slot: unused) equals torchvision's; that one
  // is finite all the same.
  EXPECT_LE(testutil::max_abs_diff(ops::slice(t.targets, 1, 0, P + 2),
                                   ops::slice(file.at("expected.roi.targets"), 1, 0, P + 2)),
            1e-4);
  for (double v : t.targets.to_double()) ASSERT_TRUE(std::isfinite(v));
  ops::Sampled sampled{file.at("roi.sampled_index"), file.at("roi.sampled_label")};
  models::vision::RoiTargets s = models::vision::take_samples(t, sampled);
  models::vision::FastRcnnLoss loss =
      models::vision::fastrcnn_loss(file.at("roi.class_logits"), file.at("roi.box_regression"), s.labels, s.targets);
  const std::vector<double> want = file.at("expected.roi.loss").to_double();
  EXPECT_NEAR(loss.classifier.item(), want[0], 1e-5);
  EXPECT_NEAR(loss.box.item(), want[1], 1e-5);
}

TEST(RoiHeads, PaddingSlotsAreMinusOneAndCountForNothing) {
  // One image: two proposals (the second padding), one truth of class 3 on the first proposal, one padding truth.
  Tensor proposals = ops::from_vector(std::vector<float>{0, 0, 10, 10, 50, 50, 60, 60}, {1, 2, 4}, DType::f32);
  Tensor truths = ops::from_vector(std::vector<float>{0, 0, 10, 10, 0, 0, 1, 1}, {1, 2, 4}, DType::f32);
  Tensor labels = ops::from_vector(std::vector<int64_t>{3, 7}, {1, 2}, DType::i64);
  models::vision::RoiTargets t =
      models::vision::roi_targets(proposals, mask({1, 0}, {1, 2}), truths, labels, mask({1, 0}, {1, 2}));
  EXPECT_EQ(t.labels.to_double(), (std::vector<double>{3, -1, 3, -1}));
  EXPECT_EQ(models::vision::sampler_labels(t.labels).to_double(), (std::vector<double>{1, -1, 1, -1}));
  // A draw with one positive and a padding slot: the padding slot's label is -1 whatever its index points at.
  ops::Sampled sampled{ops::from_vector(std::vector<int64_t>{2, 0}, {1, 2}, DType::i64),
                       ops::from_vector(std::vector<int64_t>{1, -1}, {1, 2}, DType::i64)};
  models::vision::RoiTargets s = models::vision::take_samples(t, sampled);
  EXPECT_EQ(s.labels.to_double(), (std::vector<double>{3, -1}));
  // The loss of the padding slot is nothing: changing its logits leaves the loss as it is.
  Tensor logits = ops::randn({2, 8}), regression = ops::randn({2, 32});
  const double a = models::vision::fastrcnn_loss(logits, regression, s.labels, s.targets).classifier.item();
  Tensor other = ops::add(logits, ops::from_vector(std::vector<double>(16, 0.0), {2, 8}, DType::f32));
  const std::vector<double> bumped_values = [&] {
    std::vector<double> v = other.to_double();
    for (int k = 8; k < 16; k++) v[size_t(k)] += 5.0;
    return v;
  }();
  const double b = models::vision::fastrcnn_loss(ops::from_vector(bumped_values, {2, 8}, DType::f32), regression,
                                                 s.labels, s.targets)
                       .classifier.item();
  EXPECT_DOUBLE_EQ(a, b);
}

TEST(RoiHeads, FastRcnnLossGradients) {
  Tensor labels = ops::from_vector(std::vector<int64_t>{2, 0, -1, 1}, {1, 4}, DType::i64);
  Tensor targets = ops::randn({1, 4, 4});
  Tensor logits = testutil::rand_input({4, 3}), regression = testutil::rand_input({4, 12}, -0.3, 0.3);
  testutil::expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        models::vision::FastRcnnLoss l = models::vision::fastrcnn_loss(in[0], in[1], labels, targets);
        return ops::add(l.classifier, l.box);
      },
      {logits, regression});
}

// The mask loss against its definition written here: the mean over the foreground slots' pixels of
// max(x, 0) - x t + log(1 + exp(-|x|)) for x the slot's own class's logit; and its gradient.
TEST(RoiHeads, MaskLossIsTheForegroundsMeanBce) {
  const int64_t R = 5, M = 3, C = 4;
  Tensor logits = testutil::rand_input({R, M, M, C}, -3, 3), targets = testutil::rand_input({R, M, M}, 0, 1, false);
  Tensor labels = ops::from_vector(std::vector<int64_t>{2, 0, 3, -1, 1}, {1, R}, DType::i64);
  const std::vector<double> x = logits.to_double(), t = targets.to_double();
  const int64_t label[R] = {2, 0, 3, -1, 1};
  double total = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < R; r++) {
    if (label[r] <= 0) continue;
    for (int64_t p = 0; p < M * M; p++) {
      const double v = x[size_t((r * M * M + p) * C + label[r])], y = t[size_t(r * M * M + p)];
      total += std::max(v, 0.0) - v * y + std::log1p(std::exp(-std::abs(v)));
      count++;
    }
  }
  EXPECT_NEAR(models::vision::mask_loss(logits, labels, targets).item(), total / double(count), 1e-12);
  testutil::expect_gradcheck(
      [&](const std::vector<Tensor>& in) { return models::vision::mask_loss(in[0], labels, targets); }, {logits});
  // No foreground slot: 0, not 0 / 0.
  Tensor none = ops::from_vector(std::vector<int64_t>{0, 0, -1, 0, 0}, {1, R}, DType::i64);
  EXPECT_EQ(models::vision::mask_loss(logits, none, targets).item(), 0.0);
}

TEST(RoiHeads, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor proposals = ops::mul(ops::rand({2, 40, 4}), 50.0);
    proposals = ops::concat({ops::slice(proposals, 2, 0, 2), ops::add(ops::slice(proposals, 2, 0, 2), 20.0)}, 2);
    Tensor truths = ops::contiguous(ops::slice(proposals, 1, 0, 3));
    Tensor labels = ops::full({2, 3}, 2.0, DType::i64);
    Tensor ok = ops::compare(ops::CompareOp::ge, ops::zeros({2, 40}), 0.0);
    Tensor truth_ok = ops::compare(ops::CompareOp::ge, ops::zeros({2, 3}), 0.0);
    models::vision::RoiTargets t =
        models::vision::roi_targets(ops::contiguous(proposals), ok, truths, labels, truth_ok);
    models::vision::RoiTargets s =
        models::vision::take_samples(t, ops::sample_balanced(models::vision::sampler_labels(t.labels), 16, 0.25));
    Tensor logits = ops::randn({32, 4}), regression = ops::randn({32, 16});
    logits.set_requires_grad(true);
    regression.set_requires_grad(true);
    models::vision::FastRcnnLoss l = models::vision::fastrcnn_loss(logits, regression, s.labels, s.targets);
    Tensor masks = ops::randn({16, 7, 7, 4});
    masks.set_requires_grad(true);
    Tensor mask =
        models::vision::mask_loss(masks, ops::contiguous(ops::slice(s.labels, 1, 0, 8)), ops::rand({16, 7, 7}));
    graph::backward(ops::add(ops::add(l.classifier, l.box), mask));
    EXPECT_TRUE(regression.grad().defined());
    EXPECT_TRUE(masks.grad().defined());
  });
}
