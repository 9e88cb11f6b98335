// deeplabv3_test.cpp: DeepLabv3 end to end: the tiny config learns on the cpu, the meta device makes the cpu's
// allocations, the full-size (voc) network has exactly torchvision's parameter count (computed here from the
// architecture, independently of the modules), output stride 16, PyTorch-layout weights load, and the
// synthetic data is seeded.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/device.h"
#include "graph/autograd.h"
#include "models/registry.h"
#include "models/vision/deeplabv3.h"
#include "ops/factory.h"
#include "ops/view.h"
#include "ops/elementwise.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/recompute_util.h"

using engine::Device;
using engine::DeviceType;
using engine::Tensor;
using models::vision::DeepLabV3;
using models::vision::DeepLabV3Config;

namespace {

DeepLabV3Config config(const std::string& size) {
  models::ModelConfig c;
  c.name = "deeplabv3";
  c.size = size;
  return DeepLabV3Config::from(c);
}

std::shared_ptr<Device> cpu() { return Device::create(DeviceType::cpu, size_t(1) << 32); }
std::shared_ptr<Device> meta() { return Device::create(DeviceType::meta, size_t(1) << 40); }

// torchvision's counts, term by term: a KxK convolution has out * in * K * K weights (+ out with bias), a
// BatchNorm2d 2 * C (running statistics are buffers).
int64_t conv(int64_t in, int64_t out, int64_t k, bool bias = false) { return out * in * k * k + (bias ? out : 0); }
int64_t bn(int64_t c) { return 2 * c; }

int64_t resnet101_backbone_parameters() {
  int64_t n = conv(3, 64, 7) + bn(64), in = 64;
  const int64_t blocks[4] = {3, 4, 23, 3}, planes[4] = {64, 128, 256, 512};
  for (int s = 0; s < 4; s++)
    for (int64_t b = 0; b < blocks[s]; b++) {
      const int64_t p = planes[s];
      n += conv(in, p, 1) + bn(p) + conv(p, p, 3) + bn(p) + conv(p, 4 * p, 1) + bn(4 * p);
      if (b == 0) n += conv(in, 4 * p, 1) + bn(4 * p);  // downsample
      in = 4 * p;
    }
  return n;
}

int64_t deeplab_head_parameters(int64_t classes) {
  int64_t aspp = conv(2048, 256, 1) + bn(256) + 3 * (conv(2048, 256, 3) + bn(256)) + conv(2048, 256, 1) + bn(256) +
                 conv(5 * 256, 256, 1) + bn(256);
  return aspp + conv(256, 256, 3) + bn(256) + conv(256, classes, 1, true);
}

}  // namespace

TEST(DeepLabV3, ParameterCountEqualsTorchvision) {
  // Published totals: torchvision resnet101 = 44,549,160 (with its 1000-way fc), deeplabv3_resnet101 =
  // 60,996,202 (with the aux classifier FCNHead(1024, 21)): the analytic count reproduces both.
  const int64_t backbone = resnet101_backbone_parameters(), head = deeplab_head_parameters(21);
  EXPECT_EQ(backbone + conv(2048, 1000, 1, true), 44549160);
  const int64_t aux = conv(1024, 256, 3) + bn(256) + conv(256, 21, 1, true);
  EXPECT_EQ(backbone + head + aux, 60996202);
  auto dev = meta();
  engine::DeviceGuard guard(dev);
  DeepLabV3 model(config("voc"));
  EXPECT_EQ(model.module().num_parameters(), backbone + head);
  EXPECT_EQ(model.module().num_parameters(), 58630997);
  // torchvision's names, e.g.:
  std::set<std::string> names;
  for (const auto& [n, t] : model.module().named_parameters()) names.insert(n);
  for (const char* n :
       {"backbone.conv1.weight", "backbone.layer3.22.conv2.weight", "backbone.layer4.0.downsample.0.weight",
        "backbone.layer4.0.downsample.1.bias", "classifier.0.convs.0.0.weight", "classifier.0.convs.3.1.weight",
        "classifier.0.convs.4.1.weight", "classifier.0.convs.4.2.bias", "classifier.0.project.0.weight",
        "classifier.1.weight", "classifier.2.weight", "classifier.4.weight", "classifier.4.bias"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_EQ(model.net().backbone->layers[2][0]->conv2->weight.shape(), (engine::Shape{256, 3, 3, 256}));  // KRSC
}

TEST(DeepLabV3, FullSizeMetaStepHasOutputStride16) {
  auto dev = meta();
  engine::DeviceGuard guard(dev);
  auto c = config("voc");
  c.batch = 2;
  DeepLabV3 model(c);
  // Layer4 dilations: 2 x multi-grid (1, 2, 4); layer4 keeps layer3's resolution.
  const auto& layer4 = model.net().backbone->layers[3];
  EXPECT_EQ(layer4[0]->conv2->params.dilation_h, 2);
  EXPECT_EQ(layer4[1]->conv2->params.dilation_h, 4);
  EXPECT_EQ(layer4[2]->conv2->params.dilation_h, 8);
  EXPECT_EQ(layer4[0]->conv2->params.stride_h, 1);
  models::Batch batch = model.make_batch(1);
  Tensor features = model.net().backbone->forward(batch.at("images"));
  EXPECT_EQ(features.shape(), (engine::Shape{2, 33, 33, 2048}));  // 513 / 16, rounded up
  features = Tensor();
  Tensor logits = model.net().forward(batch.at("images"));
  EXPECT_EQ(logits.shape(), (engine::Shape{2, 513, 513, 21}));
  logits = Tensor();
  model.train_step(1);  // a whole step on meta: shapes and allocations only
  EXPECT_GT(dev->ledger().peak_bytes(), size_t(58630997) * 4 * 3);  // params + grads + momentum at least
}

TEST(DeepLabV3, TorchvisionVariantHasItsDilationsAndRates) {
  auto dev = meta();
  engine::DeviceGuard guard(dev);
  auto c = config("torchvision");
  c.batch = 1;
  DeepLabV3 model(c);
  EXPECT_EQ(model.module().num_parameters(), 58630997);
  // replace_stride_with_dilation = [False, True, True]: a dilated stage's first block keeps the previous rate.
  const auto& layers = model.net().backbone->layers;
  EXPECT_EQ(layers[2][0]->conv2->params.dilation_h, 1);
  EXPECT_EQ(layers[2][1]->conv2->params.dilation_h, 2);
  EXPECT_EQ(layers[2][22]->conv2->params.dilation_h, 2);
  EXPECT_EQ(layers[3][0]->conv2->params.dilation_h, 2);
  EXPECT_EQ(layers[3][2]->conv2->params.dilation_h, 4);
  EXPECT_EQ(model.net().aspp->convs[3]->params.dilation_h, 36);
  Tensor features = model.net().backbone->forward(model.make_batch(1).at("images"));
  EXPECT_EQ(features.shape(), (engine::Shape{1, 65, 65, 2048}));  // output stride 8
}

TEST(DeepLabV3, TinyLearnsOnCpu) {
  auto dev = cpu();
  engine::DeviceGuard guard(dev);
  models::ModelConfig mc;
  mc.name = "deeplabv3";
  mc.size = "tiny";
  auto model = models::create_model(mc);  // through the registry
  std::vector<double> losses;
  for (int s = 1; s <= 20; s++) losses.push_back(model->train_step(s).loss);
  const double first = (losses[0] + losses[1]) / 2;
  const double last = (losses[15] + losses[16] + losses[17] + losses[18] + losses[19]) / 5;
  EXPECT_NEAR(losses[0], std::log(5.0), 0.7) << "an untrained model predicts roughly uniformly";
  EXPECT_LT(last, 0.6 * first) << "first " << first << " last " << last;
}

TEST(DeepLabV3, SameSeedSameLossesBitForBit) {
  auto run = [](uint64_t seed) {
    engine::DeviceGuard guard(cpu());
    auto c = config("tiny");
    c.seed = seed;
    DeepLabV3 model(c);  // dropout 0.1: masks from the seeded generator
    std::vector<double> losses;
    for (int s = 1; s <= 3; s++) losses.push_back(model.train_step(s).loss);
    return losses;
  };
  std::vector<double> a = run(1);
  EXPECT_EQ(a, run(1));
  EXPECT_NE(a, run(2));
}

TEST(DeepLabV3, MetaMakesTheSameAllocationsAsCpu) {
  std::string csv[2];
  int k = 0;
  for (auto dev : {cpu(), meta()}) {
    engine::DeviceGuard guard(dev);
    DeepLabV3 model(config("tiny"));
    for (int s = 1; s <= 2; s++) model.train_step(s);
    dev->ledger().check();
    csv[k++] = dev->ledger().events_csv();
  }
  EXPECT_EQ(csv[0], csv[1]);
}

TEST(DeepLabV3, LoadsPyTorchLayoutWeights) {
  auto dev = cpu();
  engine::DeviceGuard guard(dev);
  DeepLabV3 a(config("tiny"));
  auto c = config("tiny");
  c.seed = 7;
  DeepLabV3 b(c);
  // a's weights as a torchvision state dict: convolutions OIHW, plus num_batches_tracked entries.
  std::map<std::string, Tensor> torch;
  {
    graph::NoGrad ng;
    for (const auto& [n, t] : a.module().named_parameters())
      torch[n] = t.dim() == 4 ? ops::contiguous(ops::permute(t, {0, 3, 1, 2})) : ops::clone(t);
    for (const auto& [n, t] : a.module().named_buffers()) torch[n] = ops::clone(t);
    torch["backbone.bn1.num_batches_tracked"] = ops::zeros({}, engine::DType::i64);
  }
  b.load_weights(torch);
  auto pa = a.module().named_parameters(), pb = b.module().named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); i++)
    EXPECT_EQ(testutil::max_abs_diff(pa[i].second, pb[i].second), 0.0) << pa[i].first;
  // An engine-layout file loads as it is; a file mixing both layouts is refused.
  std::map<std::string, Tensor> engine_file;
  for (const auto& [n, t] : a.module().named_parameters()) engine_file[n] = t.detach();
  for (const auto& [n, t] : a.module().named_buffers()) engine_file[n] = t.detach();
  EXPECT_EQ(b.load_weights(engine_file).size(), engine_file.size());
  engine_file["backbone.conv1.weight"] = torch["backbone.conv1.weight"];
  EXPECT_THROW(b.load_weights(engine_file), engine::Error);
}

TEST(DeepLabV3, SyntheticDataIsSeeded) {
  auto x = models::vision::synthetic_segmentation(2, 32, 5, 255, 1, 3);
  auto y = models::vision::synthetic_segmentation(2, 32, 5, 255, 1, 3);
  auto z = models::vision::synthetic_segmentation(2, 32, 5, 255, 1, 4);
  EXPECT_EQ(x.images.shape(), (engine::Shape{2, 32, 32, 3}));
  EXPECT_EQ(x.labels.shape(), (engine::Shape{2 * 32 * 32}));
  EXPECT_EQ(x.images.to_double(), y.images.to_double());
  EXPECT_EQ(x.labels.to_double(), y.labels.to_double());
  EXPECT_NE(x.labels.to_double(), z.labels.to_double());
  EXPECT_NE(x.images.to_double(), z.images.to_double());
  const std::vector<double> labels = x.labels.to_double();
  std::set<int64_t> seen(labels.begin(), labels.end());
  EXPECT_TRUE(seen.count(0) && seen.count(255));
  for (int64_t l : seen) EXPECT_TRUE((l >= 0 && l < 5) || l == 255) << l;
  // The scene table is what was painted: the centre of each image's last rectangle shows its class.
  const std::vector<int64_t> scenes = models::vision::synthetic_segmentation_scenes(2, 32, 5, 1, 3);  // [2, 3, 5]
  for (int64_t n = 0; n < 2; n++) {
    int64_t last = -1;
    for (int64_t r = 0; r < 3; r++)
      if (scenes[size_t((n * 3 + r) * 5)] >= 1) last = r;
    ASSERT_GE(last, 0) << "image " << n << " has no rectangle";
    const int64_t* row = scenes.data() + (n * 3 + last) * 5;  // class, top, left, height, width
    EXPECT_LT(row[0], 5);
    const int64_t cy = row[1] + row[3] / 2, cx = row[2] + row[4] / 2;
    EXPECT_EQ(labels[size_t((n * 32 + cy) * 32 + cx)], double(row[0])) << "image " << n;
  }
}

// --recompute layer: each ResNet bottleneck keeps only its input and runs again in backward: the same steps bit
// for bit (running statistics updated once), meta == cpu, and the full-size peak below half the plain run's
// (activations of one bottleneck at a time instead of all 33).
TEST(DeepLabV3, RecomputedBottlenecksTrainTheSameWithLessMemory) {
  models::ModelConfig tiny, full;
  tiny.name = full.name = "deeplabv3";
  tiny.size = "tiny";
  testutil::expect_recompute_layer_is_exact(tiny, full, 0.5);
  models::ModelConfig bad = full;
  bad.recompute = "attention";
  EXPECT_THROW(DeepLabV3Config::from(bad), engine::Error);
}
