// yolo_cuda_test.cpp: YOLOv3 target assignment on the GPU against the cpu reference (targets and weights,
// the ignore rule included, for f32, f64 and bf16 predictions), its bad-label Error, its ledger against meta,
// and the tiny yolov3 model's first steps on cuda against the cpu.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/device.h"
#include "models/vision/yolov3.h"
#include "ops/factory.h"
#include "ops/yolo.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Tensor;

namespace {

// boxes [N, M, 4] and labels [N, M]: a few real boxes per image (random sizes and places), then padding.
std::pair<Tensor, Tensor> random_truths(int64_t N, int64_t M, int64_t classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> centre(0.01f, 0.99f), size(0.02f, 0.7f);
  std::vector<float> boxes(size_t(N * M * 4), 0.f);
  std::vector<int64_t> labels(size_t(N * M), -1);
  for (int64_t n = 0; n < N; n++) {
    const int64_t real = int64_t(rng() % 6);  // 0 to 5 boxes
    for (int64_t m = 0; m < real; m++) {
      float* b = boxes.data() + (n * M + m) * 4;
      b[0] = centre(rng), b[1] = centre(rng), b[2] = size(rng), b[3] = size(rng);
      labels[size_t(n * M + m)] = int64_t(rng() % uint64_t(classes));
    }
  }
  return {ops::from_vector(boxes, {N, M, 4}), ops::from_vector(labels, {N, M}, DType::i64)};
}

ops::YoloTargetParams params(std::vector<int64_t> mask) {
  ops::YoloTargetParams p;
  p.anchors = {{10, 13}, {16, 30}, {33, 23}, {30, 61}, {62, 45}, {59, 119}, {116, 90}, {156, 198}, {373, 326}};
  p.mask = mask;
  p.image_w = p.image_h = 256;
  p.ignore_thresh = 0.5;
  return p;
}

}  // namespace

TEST(YoloCuda, TargetsMatchTheCpu) {
  const int64_t classes = 4;
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (int64_t scale = 0; scale < 3; scale++) {
      const int64_t cells = 8 << scale;  // strides 32, 16, 8 at 256
      const std::vector<int64_t> mask = {6 - 3 * scale, 7 - 3 * scale, 8 - 3 * scale};
      auto [boxes, labels] = random_truths(5, 100, classes, uint64_t(17 + scale));
      // Raw predictions in [-2, 2]: decoded boxes of many sizes, some overlapping truths by more than 0.5.
      Tensor pred = testutil::cpu_input({5, cells, cells, 3, 5 + classes}, dt, -2, 2);
      testutil::expect_cuda_matches_cpu_multi(
          engine::str("yolo_targets ", engine::dtype_name(dt), " scale ", scale),
          [&](const std::vector<Tensor>& in) {
            ops::YoloTargets t = ops::yolo_targets(in[0], in[1], in[2], params(mask));
            return std::vector<Tensor>{t.target, t.weight};
          },
          {pred, boxes, labels});
    }
  }
}

TEST(YoloCuda, BadLabelIsAnError) {
  auto [boxes, labels] = random_truths(2, 10, 3, 5);
  std::vector<int64_t> bad(20, -1);
  bad[13] = 3;  // of 3 classes
  Tensor pred = testutil::to_cuda(ops::zeros({2, 4, 4, 3, 8}));
  Tensor bad_labels = testutil::to_cuda(ops::from_vector(bad, {2, 10}, DType::i64));
  testutil::expect_cuda_throws(
      "yolo_targets", [&] { ops::yolo_targets(pred, testutil::to_cuda(boxes), bad_labels, params({0, 1, 2})); },
      "labels: index 3 is out of range for a dimension of size 3");
  // The device is usable afterwards.
  ops::YoloTargets t = ops::yolo_targets(pred, testutil::to_cuda(boxes), testutil::to_cuda(labels), params({0, 1, 2}));
  EXPECT_EQ(testutil::to_cpu(t.weight).shape(), (engine::Shape{2, 4, 4, 3, 8}));
}

TEST(YoloCuda, LedgerMatchesMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor pred = ops::zeros({2, 8, 8, 3, 85});
    ops::yolo_targets(pred, ops::zeros({2, 100, 4}), ops::full({2, 100}, -1, DType::i64), params({0, 1, 2}));
  });
}

TEST(YoloCuda, TinyYoloV3StepsLikeTheCpu) {
  std::vector<double> losses[2];
  int k = 0;
  for (auto dev : {engine::Device::create(engine::DeviceType::cpu, size_t(1) << 32), testutil::cuda_device()}) {
    engine::DeviceGuard guard(dev);
    models::ModelConfig c;
    c.name = "yolov3";
    c.size = "tiny";
    models::vision::YoloV3 model(models::vision::YoloV3Config::from(c));
    for (int s = 1; s <= 3; s++) losses[k].push_back(model.train_step(s).loss);
    k++;
  }
  // Step 1 is the same weights and data on both devices: the forward, the targets and the loss agree to
  // 1e-3. Later steps start from weights that went through one or two updates at lr 1e-2, where the devices'
  // different summation orders (implicit-GEMM convolutions, batch-norm chunks) have grown: measured on the
  // H200, 2.6e-3 relative at step 3 (35.37 vs 35.47), so those steps are held to 1e-2.
  for (int s = 0; s < 3; s++)
    EXPECT_NEAR(losses[1][size_t(s)], losses[0][size_t(s)], (s == 0 ? 1e-3 : 1e-2) * losses[0][size_t(s)])
        << "step " << s + 1;
}
