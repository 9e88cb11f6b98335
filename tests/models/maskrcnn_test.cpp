// maskrcnn_test.cpp: Mask R-CNN's structure against torchvision's (its state-dict names and parameter counts, from
// torchvision 0.29's MaskRCNN with FrozenBatchNorm2d and trainable_layers 3), its outputs against torchvision's
// modules with the same weights (tests/data/maskrcnn_reference.safetensors), the frozen stages, the synthetic scenes
// (boxes, polygons and paint agree), learning on cpu (all five losses fall), seeded determinism, meta == cpu ledgers
// in training and inference, and the full-size step on meta with its fixed counts.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/device.h"
#include "graph/autograd.h"
#include "models/registry.h"
#include "models/vision/maskrcnn.h"
#include "models/vision/roi_heads.h"
#include "ops/detection.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/view.h"
#include "tests/util/maskrcnn_reference_util.h"

using engine::Device;
using engine::DeviceType;
using engine::DType;
using engine::Shape;
using engine::Tensor;
using models::vision::MaskRcnn;
using models::vision::MaskRcnnConfig;

namespace {

MaskRcnnConfig config(const std::string& size, const std::string& backbone = "") {
  models::ModelConfig mc;
  mc.name = "maskrcnn";
  mc.size = size;
  mc.backbone = backbone;
  return MaskRcnnConfig::from(mc);
}

std::shared_ptr<Device> cpu() { return Device::create(DeviceType::cpu, size_t(1) << 32); }
std::shared_ptr<Device> meta() { return Device::create(DeviceType::meta, size_t(1) << 40); }

int64_t trainable(const graph::Module& m) {
  int64_t n = 0;
  for (const auto& [name, p] : m.named_parameters())
    if (p.requires_grad()) n += p.numel();
  return n;
}

}  // namespace

TEST(MaskRcnn, ParameterCountsAreTorchvisions) {
  // torchvision 0.29: MaskRCNN(_resnet_fpn_extractor(resnet50(norm_layer=FrozenBatchNorm2d), 3), num_classes), its
  // sum of p.numel() over parameters() and over those with requires_grad (conv1 and layer1 frozen).
  struct Case {
    const char* size;
    const char* backbone;
    int64_t total, trained;
  };
  for (const Case& c : {Case{"torchvision", "r50", 44401393, 44178993}, Case{"coco", "r50", 44347573, 44125173},
                        Case{"torchvision", "r101", 63341297, 63118897}, Case{"coco", "r101", 63287477, 63065077}}) {
    engine::DeviceGuard guard(meta());
    MaskRcnn model(config(c.size, c.backbone));
    EXPECT_EQ(model.module().num_parameters(), c.total) << c.size << " " << c.backbone;
    EXPECT_EQ(trainable(model.module()), c.trained) << c.size << " " << c.backbone;
  }
}

TEST(MaskRcnn, NamesAreTorchvisionsStateDict) {
  engine::DeviceGuard guard(meta());
  MaskRcnn model(config("torchvision"));
  std::set<std::string> names;
  for (const auto& list : {model.module().named_parameters(), model.module().named_buffers()})
    for (const auto& [name, t] : list) names.insert(name);
  // torchvision's state dict has 360 entries, 53 of them num_batches_tracked (the loader ignores those).
  EXPECT_EQ(names.size(), 360u - 53u);
  for (const char* n :
       {"backbone.body.conv1.weight", "backbone.body.bn1.running_var", "backbone.body.layer1.0.downsample.0.weight",
        "backbone.body.layer4.2.bn3.bias", "backbone.fpn.inner_blocks.3.0.weight", "backbone.fpn.layer_blocks.0.0.bias",
        "rpn.head.conv.0.0.weight", "rpn.head.cls_logits.bias", "rpn.head.bbox_pred.weight",
        "roi_heads.box_head.fc6.weight", "roi_heads.box_head.fc7.bias", "roi_heads.box_predictor.cls_score.weight",
        "roi_heads.box_predictor.bbox_pred.bias", "roi_heads.mask_head.3.0.weight",
        "roi_heads.mask_predictor.conv5_mask.weight", "roi_heads.mask_predictor.mask_fcn_logits.bias"})
    EXPECT_EQ(names.count(n), 1u) << n;
  // Frozen batch norm: weight and bias are buffers, not parameters.
  for (const auto& [name, p] : model.module().named_parameters())
    EXPECT_EQ(name.find(".bn"), std::string::npos) << name << " should be a buffer";
}

TEST(MaskRcnn, MatchesTorchvisionWithTheSameWeights) {
  // torchvision's own modules at the tiny shapes (tools/bench/maskrcnn_parity.py), fp32 on the cpu.
  testutil::expect_maskrcnn_matches_torchvision("tests/data/maskrcnn_reference.safetensors", "tiny", cpu());
}

TEST(MaskRcnn, SyntheticScenesAgreeWithTheirPaint) {
  engine::DeviceGuard guard(cpu());
  MaskRcnnConfig c = config("tiny");
  models::Batch b = models::vision::synthetic_maskrcnn_batch(c, 3, DType::f32, engine::default_device());
  ASSERT_EQ(b.at("images").shape(), (Shape{2, 128, 160, 3}));
  ASSERT_EQ(b.at("polygons").shape(), (Shape{2, 8, 2, 16, 2}));
  // Each truth's polygon rasterized in its own box covers most of it (an ellipse: pi / 4 of the box) and the painted
  // pixels there carry its class's colour (not the black background) where no later object covers them.
  Tensor truth = ops::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7}, {2, 8});
  Tensor masks = ops::polygon_masks(b.at("polygons"), b.at("counts"), b.at("boxes"), truth, 28);
  const std::vector<double> m = masks.to_double(), valid = ops::to(b.at("valid"), DType::f32).to_double();
  int objects = 0;
  for (int64_t g = 0; g < 16; g++) {
    double area = 0;
    for (int64_t e = 0; e < 28 * 28; e++) area += m[size_t(g * 28 * 28 + e)];
    if (valid[size_t(g)] == 0) {
      EXPECT_EQ(area, 0.0) << "padding truth " << g;
      continue;
    }
    objects++;
    EXPECT_NEAR(area / (28 * 28), M_PI / 4, 0.03) << "truth " << g;
  }
  EXPECT_GE(objects, 2);
  // The padding columns (150 .. 159) are zero, as torchvision's batching pads.
  const std::vector<double> px = b.at("images").to_double();
  for (int64_t y = 0; y < 128; y += 17)
    for (int64_t x = 150; x < 160; x++) EXPECT_EQ(px[size_t((y * 160 + x) * 3)], 0.0);
}

TEST(MaskRcnn, TinyLearnsOnCpu) {
  const int kSteps = 120;
  engine::DeviceGuard guard(cpu());
  models::ModelConfig mc;
  mc.name = "maskrcnn";
  mc.size = "tiny";
  auto model = models::create_model(mc);
  // One batch, repeated: the five losses must fall.
  auto* maskrcnn = dynamic_cast<MaskRcnn*>(model.get());
  ASSERT_NE(maskrcnn, nullptr);
  model->set_fixed_batch(maskrcnn->make_batch(1));
  std::map<std::string, std::vector<double>> losses;
  for (int s = 1; s <= kSteps; s++) {
    models::StepResult r = model->train_step(s);
    double sum = 0;
    for (const char* k : {"rpn_objectness", "rpn_box", "classifier", "box", "mask"}) {
      ASSERT_TRUE(r.losses.count(k)) << k;
      losses[k].push_back(r.losses.at(k));
      sum += r.losses.at(k);
    }
    EXPECT_NEAR(r.loss, sum, 1e-4 * std::abs(sum));
  }
  // Four-step means, the first and the last. The box head's regression loss is not among them: it starts near 0 (its
  // early foreground is mostly the truths themselves, whose codes are 0) and grows as the RPN's proposals start to
  // match the truths, a foreground set that keeps changing (torchvision's loss_box_reg rises early in training too);
  // BoxHeadLearnsItsRegressionOnFixedRois trains it where its targets hold still. The RPN's box codes fall slowest
  // (its 1x1 head starts at std 0.01 and each positive's gradient is divided by the 128 sampled anchors).
  auto mean4 = [](const std::vector<double>& v, size_t at) { return (v[at] + v[at + 1] + v[at + 2] + v[at + 3]) / 4; };
  for (const char* k : {"rpn_objectness", "rpn_box", "classifier", "mask"}) {
    const std::vector<double>& v = losses.at(k);
    const double start = mean4(v, 0), end = mean4(v, v.size() - 4);
    EXPECT_LT(end, (std::string(k) == "rpn_box" ? 0.9 : 0.75) * start) << k << ": " << start << " -> " << end;
  }
}

TEST(MaskRcnn, BoxHeadLearnsItsRegressionOnFixedRois) {
  // The second stage alone on RoIs that hold still: each truth jittered by up to 6 pixels, and the truths, sampled
  // once; the backbone, box head and predictor trained on fastrcnn_loss. Both parts fall to a tenth.
  engine::DeviceGuard guard(cpu());
  MaskRcnn model(config("tiny"));
  const MaskRcnnConfig& c = model.config();
  models::Batch b = models::vision::synthetic_maskrcnn_batch(c, 1, DType::f32, engine::default_device());
  models::vision::RoiTargets sampled;
  {
    graph::NoGrad no_grad;
    Tensor proposals = ops::add(b.at("boxes"), ops::rand(b.at("boxes").shape(), -6, 6));
    models::vision::RoiTargets all =
        models::vision::roi_targets(proposals, b.at("valid"), b.at("boxes"), b.at("labels"), b.at("valid"));
    sampled =
        models::vision::take_samples(all, ops::sample_balanced(models::vision::sampler_labels(all.labels), 16, 0.5));
  }
  model.optimizer().set_lr(0.01);
  std::vector<double> box, classifier;
  for (int s = 0; s < 120; s++) {
    std::vector<Tensor> levels = model.net().features(b.at("images"));
    levels.pop_back();
    Tensor drawn = ops::compare(ops::CompareOp::ge, sampled.labels, 0.0);
    auto [logits, regression] =
        model.net().box_head(model.net().pool(levels, sampled.boxes, drawn, models::vision::Pooler::box));
    models::vision::FastRcnnLoss l = models::vision::fastrcnn_loss(logits, regression, sampled.labels, sampled.targets);
    graph::backward(ops::add(l.box, l.classifier));
    model.optimizer().step();
    model.optimizer().zero_grad();
    box.push_back(l.box.item());
    classifier.push_back(l.classifier.item());
  }
  EXPECT_LT(box.back(), 0.1 * box.front()) << box.front() << " -> " << box.back();
  EXPECT_LT(classifier.back(), 0.1 * classifier.front()) << classifier.front() << " -> " << classifier.back();
}

TEST(MaskRcnn, FrozenStagesGetNoGradientAndSeedsRepeat) {
  std::vector<double> runs[2];
  for (int k = 0; k < 2; k++) {
    engine::DeviceGuard guard(cpu());
    MaskRcnn model(config("tiny"));
    for (int s = 1; s <= 2; s++) runs[k].push_back(model.train_step(s).loss);
    if (k == 1) continue;
    for (const auto& [name, p] : model.module().named_parameters()) {
      const bool frozen = name.rfind("backbone.body.conv1.", 0) == 0 || name.rfind("backbone.body.layer1.", 0) == 0;
      EXPECT_EQ(p.requires_grad(), !frozen) << name;
    }
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(MaskRcnn, MetaMakesTheSameAllocationsAsCpu) {
  for (bool inference : {false, true}) {
    std::string csv[2];
    int k = 0;
    for (auto dev : {cpu(), meta()}) {
      engine::DeviceGuard guard(dev);
      MaskRcnnConfig c = config("tiny");
      c.inference = inference;
      MaskRcnn model(c);
      if (inference) {
        models::StepResult r = model.eval_step(1);
        EXPECT_FALSE(r.has_loss);
      } else {
        for (int s = 1; s <= 2; s++) model.train_step(s);
      }
      dev->ledger().check();
      csv[k++] = dev->ledger().events_csv();
    }
    EXPECT_EQ(csv[0], csv[1]) << (inference ? "inference" : "training");
  }
}

TEST(MaskRcnn, DetectionsFillFixedSlots) {
  engine::DeviceGuard guard(cpu());
  MaskRcnnConfig c = config("tiny");
  MaskRcnn model(c);
  model.module().eval();
  MaskRcnn::Detections d = model.detect(model.make_batch(1));
  EXPECT_EQ(d.boxes.shape(), (Shape{2, 10, 4}));
  EXPECT_EQ(d.labels.shape(), (Shape{2, 10}));
  EXPECT_EQ(d.masks.shape(), (Shape{2, 10, 14, 14}));
  // Scores decrease within an image, are -1 in padding (label 0, zero box), and a detection's box lies in its image.
  const std::vector<double> scores = d.scores.to_double(), labels = ops::to(d.labels, DType::f32).to_double(),
                            boxes = d.boxes.to_double();
  for (int64_t n = 0; n < 2; n++)
    for (int64_t k = 0; k < 10; k++) {
      const double s = scores[size_t(n * 10 + k)];
      if (k > 0) {
        EXPECT_LE(s, scores[size_t(n * 10 + k - 1)]);
      }
      if (s < 0) {
        EXPECT_EQ(s, -1.0);
        EXPECT_EQ(labels[size_t(n * 10 + k)], 0.0);
        continue;
      }
      EXPECT_GT(s, c.score_threshold);
      EXPECT_GE(labels[size_t(n * 10 + k)], 1.0);
      EXPECT_LE(boxes[size_t((n * 10 + k) * 4 + 2)], 150.0);
      EXPECT_LE(boxes[size_t((n * 10 + k) * 4 + 3)], 128.0);
    }
}

TEST(MaskRcnn, FullSizeStepOnMetaHasTheFixedCounts) {
  engine::DeviceGuard guard(meta());
  MaskRcnn model(config("coco"));
  models::Batch b = model.make_batch(1);
  EXPECT_EQ(b.at("images").shape(), (Shape{2, 800, 1344, 3}));
  EXPECT_EQ(b.at("boxes").shape(), (Shape{2, 100, 4}));
  EXPECT_EQ(b.at("polygons").shape(), (Shape{2, 100, 4, 64, 2}));
  for (int s = 1; s <= 2; s++) model.train_step(s);
  EXPECT_GT(engine::default_device()->ledger().peak_bytes(), size_t(1) << 30);
}

TEST(MaskRcnn, ConfigErrorsNameTheProblem) {
  auto expect_error = [](const models::ModelConfig& mc, const std::string& text) {
    try {
      engine::DeviceGuard guard(meta());
      models::create_model(mc);
      ADD_FAILURE() << "no error; expected one saying '" << text << "'";
    } catch (const engine::Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  models::ModelConfig mc;
  mc.name = "maskrcnn";
  mc.size = "huge";
  expect_error(mc, "unknown --size 'huge'");
  mc.size = "tiny";
  mc.backbone = "r34";
  expect_error(mc, "unknown --backbone 'r34'");
  mc.backbone = "";
  mc.recompute = "attention";
  expect_error(mc, "--recompute attention does not apply");
  models::ModelConfig yolo;
  yolo.name = "yolov3";
  yolo.backbone = "r101";
  expect_error(yolo, "--backbone chooses maskrcnn's ResNet");
}
