// yolov3_test.cpp: YOLOv3 end to end and its target assignment: a hand-computed assignment (anchor, cell,
// scale, regression targets, the ignore rule), padded box slots count for nothing, the tiny config learns on
// the cpu, the full-size (coco) network has the published parameter count (computed here from yolov3.cfg,
// independently of the modules) and output shapes on meta, meta allocates as the cpu, bf16 steps on meta.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/device.h"
#include "models/registry.h"
#include "models/vision/yolov3.h"
#include "ops/factory.h"
#include "ops/yolo.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/recompute_util.h"

using engine::Device;
using engine::DeviceType;
using engine::Shape;
using engine::Tensor;
using models::vision::YoloV3;
using models::vision::YoloV3Config;

namespace {

YoloV3Config config(const std::string& size) {
  models::ModelConfig c;
  c.name = "yolov3";
  c.size = size;
  return YoloV3Config::from(c);
}

std::shared_ptr<Device> cpu() { return Device::create(DeviceType::cpu, size_t(1) << 32); }
std::shared_ptr<Device> meta() { return Device::create(DeviceType::meta, size_t(1) << 40); }

// Darknet's counts, term by term: a [convolutional] with batch_normalize has out * in * K * K weights and 2 * out
// BN parameters (scales and biases; rolling mean/variance are not trained); without BN, out biases.
int64_t conv(int64_t in, int64_t out, int64_t k, bool bn = true) { return out * in * k * k + (bn ? 2 * out : out); }

int64_t darknet53_parameters() {
  int64_t n = conv(3, 32, 3), c = 32;
  for (int64_t blocks : {1, 2, 8, 8, 4}) {
    n += conv(c, 2 * c, 3);
    c *= 2;
    for (int64_t b = 0; b < blocks; b++) n += conv(c, c / 2, 1) + conv(c / 2, c, 3);
  }
  return n;
}

// yolov3.cfg layers 75-106: per scale 1x1 m, 3x3 2m, 1x1 m, 3x3 2m, 1x1 m, 3x3 2m, 1x1 255 (bias); between
// scales a 1x1 m -> m/2 before the upsampling.
int64_t yolov3_head_parameters() {
  auto head = [](int64_t in, int64_t m) {
    return conv(in, m, 1) + conv(m, 2 * m, 3) + conv(2 * m, m, 1) + conv(m, 2 * m, 3) + conv(2 * m, m, 1) +
           conv(m, 2 * m, 3) + conv(2 * m, 255, 1, false);
  };
  return head(1024, 512) + conv(512, 256, 1) + head(256 + 512, 256) + conv(256, 128, 1) + head(128 + 256, 128);
}

// Element [n, j, i, a, d] of a contiguous [N, H, W, A, D] tensor.
double at(const Tensor& t, int64_t n, int64_t j, int64_t i, int64_t a, int64_t d) {
  const Shape& s = t.shape();
  const int64_t k = (((n * s[1] + j) * s[2] + i) * s[3] + a) * s[4] + d;
  return t.dtype() == engine::DType::f64 ? t.data<double>()[k] : double(t.data<float>()[k]);
}

// A 64 x 64 image, 6 anchors: scale "coarse" (2 x 2 cells) predicts anchors 3-5, "fine" (4 x 4) anchors 0-2.
struct HandCase {
  std::vector<std::array<double, 2>> anchors = {{4, 4}, {8, 8}, {12, 12}, {32, 16}, {20, 32}, {64, 64}};
  ops::YoloTargetParams params(std::vector<int64_t> mask) const {
    ops::YoloTargetParams p;
    p.anchors = anchors;
    p.mask = mask;
    p.image_w = p.image_h = 64;
    p.ignore_thresh = 0.5;
    return p;
  }
};

}  // namespace

TEST(YoloV3, ParameterCountIsThePublishedOne) {
  // 61,949,149: ultralytics/yolov3's model summary for yolov3 at 80 classes ("333 layers, 61949149
  // parameters") and Keras-YOLOv3's "Trainable params: 61,949,149"; the cfg-derived count reproduces it.
  EXPECT_EQ(darknet53_parameters(), 40584928);
  EXPECT_EQ(darknet53_parameters() + yolov3_head_parameters(), 61949149);
  auto dev = meta();
  engine::DeviceGuard guard(dev);
  YoloV3 model(config("coco"));
  EXPECT_EQ(model.net().backbone->num_parameters(), 40584928);
  EXPECT_EQ(model.module().num_parameters(), 61949149);
}

TEST(YoloV3, FullSizeMetaStepHasThreeScales) {
  auto dev = meta();
  engine::DeviceGuard guard(dev);
  YoloV3 model(config("coco"));  // 608 x 608, batch 8
  models::Batch batch = model.make_batch(1);
  EXPECT_EQ(batch.at("boxes").shape(), (Shape{8, 100, 4}));
  EXPECT_EQ(batch.at("labels").shape(), (Shape{8, 100}));
  auto preds = model.net().forward(batch.at("images"));
  EXPECT_EQ(preds[0].shape(), (Shape{8, 19, 19, 255}));
  EXPECT_EQ(preds[1].shape(), (Shape{8, 38, 38, 255}));
  EXPECT_EQ(preds[2].shape(), (Shape{8, 76, 76, 255}));
  preds = {};
  models::StepResult r = model.train_step(1);  // shapes and allocations only
  EXPECT_EQ(r.items, 8);
  EXPECT_EQ(r.losses.count("box") + r.losses.count("object") + r.losses.count("class"), 3u);
  EXPECT_GT(dev->ledger().peak_bytes(), size_t(61949149) * 4 * 3);  // params + grads + momentum at least
}

TEST(YoloV3, TargetAssignmentHandComputed) {
  auto dev = cpu();
  engine::DeviceGuard guard(dev);
  HandCase h;
  // One 16 x 32 px box centred at (48, 16) px, class 1 of 2; slot 1 is padding (its values must not matter).
  Tensor boxes = ops::from_vector(std::vector<float>{0.75f, 0.25f, 0.25f, 0.5f, 0.75f, 0.25f, 0.25f, 0.5f}, {1, 2, 4});
  Tensor labels = ops::from_vector(std::vector<int64_t>{1, -1}, {1, 2});
  // Shape IoUs with the box (16 x 32): anchor 4 (20 x 32) 0.8, anchor 3 (32 x 16) 1/3, ... -> anchor 4, the
  // coarse scale's second (a = 1), at cell i = floor(0.75 * 2) = 1, j = floor(0.25 * 2) = 0.
  Tensor coarse = ops::zeros({1, 2, 2, 3, 7}, engine::DType::f64);
  auto c = ops::yolo_targets(coarse, boxes, labels, h.params({3, 4, 5}));
  ASSERT_EQ(c.target.shape(), (Shape{1, 2, 2, 3, 7}));
  EXPECT_EQ(c.weight.dtype(), engine::DType::f64);
  const double expected[7] = {1.5 - 1, 0.5 - 0, std::log(16.0 / 20), std::log(32.0 / 32), 1, 0, 1};
  for (int d = 0; d < 7; d++) EXPECT_NEAR(at(c.target, 0, 0, 1, 1, d), expected[d], 1e-12) << d;
  const double scale = 2 - 0.25 * 0.5;
  for (int d = 0; d < 4; d++) EXPECT_DOUBLE_EQ(at(c.weight, 0, 0, 1, 1, d), scale);
  for (int d = 4; d < 7; d++) EXPECT_DOUBLE_EQ(at(c.weight, 0, 0, 1, 1, d), 1.0);
  double target_sum = 0, box_weight_sum = 0;
  for (int64_t j = 0; j < 2; j++)
    for (int64_t i = 0; i < 2; i++)
      for (int64_t a = 0; a < 3; a++)
        for (int64_t d = 0; d < 7; d++) {
          target_sum += std::fabs(at(c.target, 0, j, i, a, d));
          if (d < 4) box_weight_sum += at(c.weight, 0, j, i, a, d);
          // Zero predictions decode to anchor-sized boxes at cell centres: only anchor 4's overlaps the box by
          // more than 0.5 (IoU 0.8, and it is the assigned one), so every objectness counts.
          if (d == 4) {
            EXPECT_EQ(at(c.weight, 0, j, i, a, d), 1.0) << j << i << a;
          }
        }
  EXPECT_NEAR(target_sum, 0.5 + 0.5 + std::fabs(std::log(0.8)) + 1 + 1, 1e-12);  // nothing else assigned
  EXPECT_DOUBLE_EQ(box_weight_sum, 4 * scale);
  // The fine scale (anchors 0-2) gets no positive. Its prediction at the box's cell (i = 3, j = 1), anchor 0,
  // decodes to the box (sigmoid(-30) ~ 0: the cell's corner (0.75, 0.25); tw = log(16 / 4), th = log(32 / 4)):
  // not assigned, IoU ~ 1 > 0.5: ignored.
  std::vector<double> fine_values(size_t(4 * 4 * 3 * 7), 0.0);
  fine_values[size_t(((1 * 4 + 3) * 3 + 0) * 7 + 0)] = -30;
  fine_values[size_t(((1 * 4 + 3) * 3 + 0) * 7 + 1)] = -30;
  fine_values[size_t(((1 * 4 + 3) * 3 + 0) * 7 + 2)] = std::log(16.0 / 4);
  fine_values[size_t(((1 * 4 + 3) * 3 + 0) * 7 + 3)] = std::log(32.0 / 4);
  Tensor fine = ops::from_vector(fine_values, {1, 4, 4, 3, 7}, engine::DType::f64);
  auto f = ops::yolo_targets(fine, boxes, labels, h.params({0, 1, 2}));
  for (int64_t j = 0; j < 4; j++)
    for (int64_t i = 0; i < 4; i++)
      for (int64_t a = 0; a < 3; a++)
        for (int64_t d = 0; d < 7; d++) {
          EXPECT_EQ(at(f.target, 0, j, i, a, d), 0.0);
          const bool ignored = j == 1 && i == 3 && a == 0;
          EXPECT_EQ(at(f.weight, 0, j, i, a, d), d == 4 && !ignored ? 1.0 : 0.0) << j << i << a << d;
        }
}

TEST(YoloV3, PaddedBoxesCountForNothing) {
  auto dev = cpu();
  engine::DeviceGuard guard(dev);
  HandCase h;
  Tensor pred = ops::randn({2, 2, 2, 3, 7}, 0, 1, engine::DType::f64);
  // Image 0: one real box then padding with box-like values; image 1: only padding.
  Tensor boxes = ops::from_vector(std::vector<float>{0.75f, 0.25f, 0.25f, 0.5f, 0.3f, 0.3f, 0.4f, 0.4f,  //
                                                     0.5f, 0.5f, 0.5f, 0.5f, 0.2f, 0.2f, 0.1f, 0.1f},
                                  {2, 2, 4});
  Tensor padded = ops::from_vector(std::vector<int64_t>{0, -1, -1, -1}, {2, 2});
  Tensor real_only = ops::from_vector(std::vector<float>{0.75f, 0.25f, 0.25f, 0.5f, 0, 0, 0, 0}, {2, 1, 4});
  Tensor real_labels = ops::from_vector(std::vector<int64_t>{0, -1}, {2, 1});  // image 1: no box
  auto a = ops::yolo_targets(pred, boxes, padded, h.params({3, 4, 5}));
  auto b = ops::yolo_targets(pred, real_only, real_labels, h.params({3, 4, 5}));
  for (int64_t k = 0; k < a.target.numel(); k++) {
    EXPECT_EQ(a.target.data<double>()[k], b.target.data<double>()[k]) << k;
    EXPECT_EQ(a.weight.data<double>()[k], b.weight.data<double>()[k]) << k;
  }
  // Image 1 (all padding): no positives, every objectness a negative.
  for (int64_t k = 2 * 2 * 3 * 7; k < 2 * 2 * 2 * 3 * 7; k++) {
    EXPECT_EQ(a.target.data<double>()[k], 0.0);
    EXPECT_EQ(a.weight.data<double>()[k], k % 7 == 4 ? 1.0 : 0.0);
  }
}

TEST(YoloV3, TargetErrorsNameTheProblem) {
  HandCase h;
  {
    engine::DeviceGuard guard(cpu());
    Tensor pred = ops::zeros({1, 2, 2, 3, 7});
    Tensor boxes = ops::zeros({1, 2, 4});
    EXPECT_THROW(
        ops::yolo_targets(pred, boxes, ops::from_vector(std::vector<int64_t>{2, -1}, {1, 2}), h.params({3, 4, 5})),
        engine::Error);  // class 2 of 2
    Tensor labels = ops::from_vector(std::vector<int64_t>{-1, -1}, {1, 2});
    EXPECT_THROW(ops::yolo_targets(pred, boxes, labels, h.params({3, 4})), engine::Error);        // A = 3
    EXPECT_THROW(ops::yolo_targets(pred, boxes, labels, h.params({3, 4, 9})), engine::Error);     // no anchor 9
    EXPECT_THROW(ops::yolo_targets(pred, ops::zeros({1, 3, 4}), labels, h.params({3, 4, 5})), engine::Error);
    EXPECT_THROW(ops::yolo_targets(ops::zeros({1, 2, 2, 21}), boxes, labels, h.params({3, 4, 5})), engine::Error);
  }
  // The meta device allocates the same outputs and runs nothing.
  std::string csv[2];
  int k = 0;
  for (auto dev : {cpu(), meta()}) {
    engine::DeviceGuard guard(dev);
    Tensor pred = ops::zeros({2, 4, 4, 3, 9});
    auto t = ops::yolo_targets(pred, ops::zeros({2, 100, 4}), ops::full({2, 100}, -1, engine::DType::i64),
                               h.params({0, 1, 2}));
    EXPECT_EQ(t.weight.shape(), (Shape{2, 4, 4, 3, 9}));
    csv[k++] = dev->ledger().events_csv();
  }
  EXPECT_EQ(csv[0], csv[1]);
}

TEST(YoloV3, LossOfZeroPredictionsHandComputed) {
  auto dev = cpu();
  engine::DeviceGuard guard(dev);
  YoloV3 model(config("tiny"));  // 64 x 64, 3 classes: scales 2 x 2, 4 x 4, 8 x 8, 3 anchors each, D = 8
  const auto& anchors = model.config().anchors;
  // One box of exactly anchor 8's shape (the coarse scale's third), centred on the coarse cell (1, 0)'s centre.
  const float w = float(anchors[8][0] / 64), h = float(anchors[8][1] / 64);
  Tensor boxes = ops::from_vector(std::vector<float>{0.75f, 0.25f, w, h, 0, 0, 0, 0}, {1, 2, 4});
  Tensor labels = ops::from_vector(std::vector<int64_t>{2, -1}, {1, 2});
  const auto f64 = engine::DType::f64;  // exact sums (the loss needs no parameters)
  std::array<Tensor, 3> preds = {ops::zeros({1, 2, 2, 24}, f64), ops::zeros({1, 4, 4, 24}, f64),
                                 ops::zeros({1, 8, 8, 24}, f64)};
  // Zero logits: every BCE term is ln 2 whatever its target; tw = th = 0 = the targets (no MSE). Counted:
  // all 3 x (4 + 16 + 64) objectness terms (the only prediction overlapping the box by more than 0.5 is the
  // assigned one), 2 centre terms with weight 2 - w h, 3 class terms.
  const double s = 2 - double(w) * double(h);
  const double expected = (3 * (4 + 16 + 64) + 2 * s + 3) * std::log(2.0);
  EXPECT_NEAR(model.detection_loss(preds, boxes, labels).item(), expected, 1e-9);
  // Two images, the second without boxes: the sum is divided by the batch.
  Tensor boxes2 = ops::from_vector(std::vector<float>{0.75f, 0.25f, w, h, 0, 0, 0, 0}, {2, 1, 4});
  Tensor labels2 = ops::from_vector(std::vector<int64_t>{2, -1}, {2, 1});
  std::array<Tensor, 3> preds2 = {ops::zeros({2, 2, 2, 24}, f64), ops::zeros({2, 4, 4, 24}, f64),
                                  ops::zeros({2, 8, 8, 24}, f64)};
  EXPECT_NEAR(model.detection_loss(preds2, boxes2, labels2).item(), (expected + 252 * std::log(2.0)) / 2, 1e-9);
}

TEST(YoloV3, LossGradientMatchesFiniteDifferences) {
  auto dev = cpu();
  engine::DeviceGuard guard(dev);
  YoloV3 model(config("tiny"));
  // Three boxes (one per scale, by size) and a padded slot; f64 predictions in [-1, 1] on the tiny scales.
  Tensor boxes = ops::from_vector(std::vector<float>{0.3f, 0.6f, 0.2f, 0.3f, 0.7f, 0.2f, 0.6f, 0.5f,  //
                                                     0.5f, 0.5f, 0.05f, 0.08f, 0, 0, 0, 0},
                                  {1, 4, 4});
  Tensor labels = ops::from_vector(std::vector<int64_t>{0, 2, 1, -1}, {1, 4});
  std::vector<Tensor> preds;
  for (int64_t cells : {2, 4, 8})
    preds.push_back(testutil::rand_input({1, cells, cells, 24}));  // f64, requires grad
  testutil::expect_gradcheck(
      [&](const std::vector<Tensor>& p) { return model.detection_loss({p[0], p[1], p[2]}, boxes, labels); }, preds);
}

TEST(YoloV3, TinyLearnsOnCpu) {
  auto dev = cpu();
  engine::DeviceGuard guard(dev);
  models::ModelConfig mc;
  mc.name = "yolov3";
  mc.size = "tiny";
  auto model = models::create_model(mc);  // through the registry
  std::vector<double> losses;
  models::StepResult first;
  for (int s = 1; s <= 10; s++) {
    models::StepResult r = model->train_step(s);
    if (s == 1) first = r;
    losses.push_back(r.loss);
  }
  EXPECT_NEAR(first.loss, first.losses.at("box") + first.losses.at("object") + first.losses.at("class"),
              1e-3 * first.loss);
  const double start = (losses[0] + losses[1]) / 2;
  const double last = (losses[6] + losses[7] + losses[8] + losses[9]) / 4;
  // Most of the fall is the objectness of the many empty anchors (about 3 x 84 x ln 2 per image at first).
  EXPECT_LT(last, 0.3 * start) << "first " << start << " last " << last;
  // eval reports the parts too
  models::StepResult e = model->eval_step(11);
  EXPECT_EQ(e.losses.count("box") + e.losses.count("object") + e.losses.count("class"), 3u);
}

TEST(YoloV3, MetaMakesTheSameAllocationsAsCpu) {
  std::string csv[2];
  int k = 0;
  for (auto dev : {cpu(), meta()}) {
    engine::DeviceGuard guard(dev);
    YoloV3 model(config("tiny"));
    for (int s = 1; s <= 2; s++) model.train_step(s);
    dev->ledger().check();
    csv[k++] = dev->ledger().events_csv();
  }
  EXPECT_EQ(csv[0], csv[1]);
}

TEST(YoloV3, Bf16StepsOnMeta) {
  for (const char* size : {"tiny", "coco"}) {
    auto dev = meta();
    engine::DeviceGuard guard(dev);
    models::ModelConfig mc;
    mc.name = "yolov3";
    mc.size = size;
    mc.batch = 2;
    mc.precision = "bf16";
    auto model = models::create_model(mc);
    EXPECT_EQ(model->compute_dtype(), engine::DType::bf16);
    for (int s = 1; s <= 2; s++) EXPECT_EQ(model->train_step(s).items, 2) << size;
  }
}

TEST(YoloV3, ConfigErrorsAndSeededData) {
  models::ModelConfig mc;
  mc.name = "yolov3";
  mc.data = "/some/coco";
  EXPECT_THROW(YoloV3 model(YoloV3Config::from(mc)), engine::Error);  // no such directory (vision_data_test.cpp)
  mc.data = "";
  mc.size = "huge";
  EXPECT_THROW(YoloV3Config::from(mc), engine::Error);
  auto tx = models::vision::synthetic_detection(2, 64, 3, 100, 1, 3);
  auto ty = models::vision::synthetic_detection(2, 64, 3, 100, 1, 3);
  auto tz = models::vision::synthetic_detection(2, 64, 3, 100, 1, 4);
  EXPECT_EQ(tx.images.shape(), (engine::Shape{2, 64, 64, 3}));
  EXPECT_EQ(tx.images.to_double(), ty.images.to_double());
  EXPECT_NE(tx.images.to_double(), tz.images.to_double());
  EXPECT_EQ(tx.boxes.to_double(), ty.boxes.to_double());
  EXPECT_NE(tx.boxes.to_double(), tz.boxes.to_double());
  auto x = models::vision::synthetic_detection_scenes(2, 64, 3, 100, 1, 3);
  const std::vector<double> boxes = tx.boxes.to_double(), labels = tx.labels.to_double();
  EXPECT_EQ(boxes, std::vector<double>(x.boxes.begin(), x.boxes.end()));
  EXPECT_EQ(labels, std::vector<double>(x.labels.begin(), x.labels.end()));
  // The boxes describe the painted rectangles: each is its scene row (class + 1 is the palette row), and
  // pixels outside every box are the black background (noise only, |v| <= 0.2f).
  const std::vector<double> image = tx.images.to_double();  // [2, 64, 64, 3]
  for (int64_t n = 0; n < 2; n++) {
    std::vector<int> covered(64 * 64, 0);
    for (int64_t m = 0; m < 100 && x.labels[size_t(n * 100 + m)] >= 0; m++) {
      const float* b = x.boxes.data() + (n * 100 + m) * 4;
      const int64_t left = std::lround((b[0] - b[2] / 2) * 64), top = std::lround((b[1] - b[3] / 2) * 64);
      const int64_t w = std::lround(b[2] * 64), h = std::lround(b[3] * 64);
      for (int64_t yy = top; yy < top + h; yy++)
        for (int64_t xx = left; xx < left + w; xx++) covered[size_t(yy * 64 + xx)] = 1;
      const int64_t* row = x.rectangles.data() + (n * 4 + m) * 5;  // class + 1, top, left, height, width
      EXPECT_EQ((std::vector<int64_t>{row[0], row[1], row[2], row[3], row[4]}),
                (std::vector<int64_t>{x.labels[size_t(n * 100 + m)] + 1, top, left, h, w}))
          << "image " << n << " box " << m;
    }
    for (int64_t p = 0; p < 64 * 64; p++) {
      if (covered[size_t(p)]) continue;
      for (int64_t c = 0; c < 3; c++) ASSERT_LE(std::abs(image[size_t((n * 64 * 64 + p) * 3 + c)]), 0.2 + 1e-6) << p;
    }
  }
  for (int64_t n = 0; n < 2; n++) {
    int64_t real = 0;
    for (int64_t m = 0; m < 100; m++) {
      const int64_t l = x.labels[size_t(n * 100 + m)];
      EXPECT_TRUE(l >= -1 && l < 3);
      if (l < 0) continue;
      real++;
      const float* b = x.boxes.data() + (n * 100 + m) * 4;
      EXPECT_TRUE(b[0] > 0 && b[0] < 1 && b[2] > 0 && b[2] <= 0.5 && b[3] > 0 && b[3] <= 0.5);
    }
    EXPECT_GE(real, 1);
    EXPECT_LE(real, 4);
  }
}

// --recompute layer: each Darknet residual block keeps only its input and runs again in backward: the same steps
// bit for bit (running statistics updated once), meta == cpu, and the full-size peak below 0.7 of the plain
// run's (the heads and the blocks' downsampling convolutions still keep theirs).
TEST(YoloV3, RecomputedResidualBlocksTrainTheSameWithLessMemory) {
  models::ModelConfig tiny, full;
  tiny.name = full.name = "yolov3";
  tiny.size = "tiny";
  testutil::expect_recompute_layer_is_exact(tiny, full, 0.7);
  models::ModelConfig bad = full;
  bad.recompute = "attention";
  EXPECT_THROW(YoloV3Config::from(bad), engine::Error);
}
