// nasnet_test.cpp: NASNet-A Large end to end: the full-size network has exactly timm's nasnetalarge parameter
// count (computed here from the architecture, independently of the modules) and its names; its feature maps have
// slim's sizes at 331 x 331; the tiny config learns on the cpu, bit for bit again with the same seed; meta makes the
// cpu's allocations; --recompute cell is the same computation with less memory; the drop-path schedule is slim's;
// the separable convolution's TF 'SAME' padding matches a direct loop; timm-layout weights load without an aux head;
// and a small timm NASNetALarge (tests/data/nasnet_reference.safetensors, made by tools/bench/nasnet_reference.py)
// gives the same logits, loss and gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/device.h"
#include "engine/safetensors.h"
#include "graph/autograd.h"
#include "models/registry.h"
#include "models/vision/nasnet.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/view.h"
#include "tests/util/error_util.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/nasnet_reference_util.h"
#include "tests/util/recompute_util.h"

using engine::Device;
using engine::DeviceType;
using engine::Tensor;
using models::vision::NasNet;
using models::vision::NasNetConfig;

namespace {

NasNetConfig config(const std::string& size) {
  models::ModelConfig c;
  c.name = "nasnet_large";
  c.size = size;
  return NasNetConfig::from(c);
}

std::shared_ptr<Device> cpu() { return Device::create(DeviceType::cpu, size_t(1) << 32); }
std::shared_ptr<Device> meta() { return Device::create(DeviceType::meta, size_t(1) << 40); }

// timm's nasnetalarge, term by term (no biases but the classifier's; BatchNorm2d has 2 C parameters).
int64_t conv(int64_t in, int64_t out, int64_t k) { return out * in * k * k; }
int64_t bn(int64_t c) { return 2 * c; }
int64_t separable(int64_t in, int64_t out, int64_t k) { return in * k * k + in * out; }  // depthwise + pointwise
int64_t branch(int64_t in, int64_t out, int64_t k, bool stem = false) {                  // BranchSeparables
  const int64_t mid = stem ? out : in;
  return separable(in, mid, k) + bn(mid) + separable(mid, out, k) + bn(out);
}
int64_t act_conv_bn(int64_t in, int64_t out) { return conv(in, out, 1) + bn(out); }
int64_t factorized(int64_t in, int64_t out_each) { return 2 * conv(in, out_each, 1) + bn(2 * out_each); }
// FirstCell / NormalCell combinations at f filters: sep5 + sep3, sep5 + sep3, sep3 (pools and identities are free).
int64_t normal_ops(int64_t f) { return 2 * branch(f, f, 5) + 3 * branch(f, f, 3); }
// Reduction combinations: sep5(R) + sep7(L), sep7(L), sep5(L), sep3(comb0); L has l channels.
int64_t reduction_ops(int64_t l, int64_t f, bool stem = false) {
  return branch(f, f, 5) + branch(l, f, 7, stem) + branch(l, f, 7, stem) + branch(l, f, 5, stem) + branch(f, f, 3);
}

int64_t timm_nasnetalarge_parameters(int64_t classes) {
  const int64_t c = 168, stem = 96;
  int64_t n = conv(3, stem, 3) + bn(stem);
  n += act_conv_bn(stem, c / 4) + reduction_ops(stem, c / 4, true);                    // cell_stem_0
  n += act_conv_bn(c, c / 2) + factorized(stem, c / 4) + reduction_ops(c / 2, c / 2);  // cell_stem_1
  // Stack s at f = c 2^s: a FirstCell, then 5 NormalCells; reduction cells between the stacks.
  int64_t prev_prev = c, prev = 2 * c;  // channels of the two maps before the stack (stem 0, stem 1)
  for (int s = 0; s < 3; s++) {
    const int64_t f = c << s;
    int64_t first_left = prev_prev;
    if (s > 0) {
      n += act_conv_bn(prev_prev, f) + act_conv_bn(prev, f) + reduction_ops(f, f);  // reads cell 4 and cell 5
      first_left = 6 * (f / 2);  // the FirstCell's x_prev is the map the reduction read as its x_prev: cell 4
      prev = 4 * f;
    }
    n += act_conv_bn(prev, f) + factorized(first_left, f / 2) + normal_ops(f);           // the FirstCell
    n += act_conv_bn(s > 0 ? 4 * f : 2 * c, f) + act_conv_bn(6 * f, f) + normal_ops(f);  // cell 1 of the stack
    n += 4 * (act_conv_bn(6 * f, f) + act_conv_bn(6 * f, f) + normal_ops(f));
    prev_prev = 6 * f, prev = 6 * f;
  }
  return n + 4032 * classes + classes;  // last_linear
}

}  // namespace

TEST(NasNet, ParameterCountEqualsTimm) {
  // timm.create_model('nasnetalarge', num_classes=1001): 88,757,183 parameters (counted with timm on the GPU
  // machine: tools/bench/nasnet_parity.py prints it); 1000 classes: 88,753,150 (timm's results table: 88.75 M).
  EXPECT_EQ(timm_nasnetalarge_parameters(1001), 88757183);
  EXPECT_EQ(timm_nasnetalarge_parameters(1000), 88753150);
  auto dev = meta();
  engine::DeviceGuard guard(dev);
  NasNet timm(config("timm"));
  EXPECT_EQ(timm.module().num_parameters(), timm_nasnetalarge_parameters(1001));
  // The recipe's model adds slim's aux head on cell_11's 2016 channels at 21 x 21: pooled to 6 x 6.
  NasNet full(config("imagenet"));
  const int64_t aux = conv(2016, 128, 1) + bn(128) + conv(128, 768, 6) + bn(768) + 768 * 1001 + 1001;
  EXPECT_EQ(full.module().num_parameters(), timm_nasnetalarge_parameters(1001) + aux);
  std::set<std::string> names;
  for (const auto& [n, t] : timm.module().named_parameters()) names.insert(n);
  for (const auto& [n, t] : timm.module().named_buffers()) names.insert(n);
  for (const char* n : {"conv0.conv.weight", "conv0.bn.running_var", "cell_stem_0.conv_1x1.conv.weight",
                        "cell_stem_0.comb_iter_0_right.separable_1.depthwise_conv2d.weight",
                        "cell_stem_1.path_2.conv.weight", "cell_stem_1.final_path_bn.bias", "cell_0.path_1.conv.weight",
                        "cell_1.conv_prev_1x1.bn.running_mean", "reduction_cell_0.comb_iter_4_left.bn_sep_2.weight",
                        "cell_6.path_2.conv.weight", "reduction_cell_1.conv_1x1.conv.weight",
                        "cell_17.comb_iter_1_right.separable_2.pointwise_conv2d.weight", "last_linear.bias"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_EQ(names.count("aux_head.fc.weight"), 0u);
  // KRSC: the 7x7 depthwise filters of cell_stem_0's widening branch, [96, 7, 7, 1].
  for (const auto& [n, p] : timm.module().named_parameters()) {
    if (n == "cell_stem_0.comb_iter_0_right.separable_1.depthwise_conv2d.weight") {
      EXPECT_EQ(p.shape(), (engine::Shape{96, 7, 7, 1}));
    }
  }
}

TEST(NasNet, FullSizeMapsHaveSlimsSizes) {
  EXPECT_EQ(models::vision::nasnet_feature_sizes(331), (std::vector<int64_t>{165, 83, 42, 21, 11}));
  auto dev = meta();
  engine::DeviceGuard guard(dev);
  auto c = config("imagenet");
  c.batch = 2;
  NasNet model(c);
  auto& net = model.net();
  ASSERT_EQ(net.cells.size(), 22u);
  EXPECT_EQ(net.cell_names[net.aux_after], "cell_11");
  // x and x_prev of a few cells (indices into {conv0, cells...}): cell_6 reads reduction_cell_0 and cell_4.
  auto index_of = [&](const std::string& name) {
    for (size_t i = 0; i < net.cells.size(); i++)
      if (net.cell_names[i] == name) return i + 1;
    return size_t(0);
  };
  const size_t cell_6 = index_of("cell_6") - 1;
  EXPECT_EQ(net.x_of[cell_6], index_of("reduction_cell_0"));
  EXPECT_EQ(net.prev_of[cell_6], index_of("cell_4"));
  EXPECT_EQ(net.prev_of[index_of("cell_7") - 1], index_of("reduction_cell_0"));
  EXPECT_EQ(net.prev_of[index_of("reduction_cell_1") - 1], index_of("cell_10"));
  // Output channels: stems 168 and 336, stacks 1008 / 2016 / 4032, reductions 1344 and 2688.
  const int64_t expected[] = {168,  336,  1008, 1008, 1008, 1008, 1008, 1008, 1344, 2016, 2016,
                              2016, 2016, 2016, 2016, 2688, 4032, 4032, 4032, 4032, 4032, 4032};
  for (size_t i = 0; i < 22; i++) EXPECT_EQ(net.cells[i]->out_channels(), expected[i]) << net.cell_names[i];
  models::Batch batch = model.make_batch(1);
  EXPECT_EQ(batch.at("images").shape(), (engine::Shape{2, 331, 331, 3}));
  EXPECT_EQ(net.forward(batch.at("images"), 0).logits.shape(), (engine::Shape{2, 1001}));
  model.train_step(1);                                              // a whole step on meta: shapes and allocations only
  EXPECT_GT(dev->ledger().peak_bytes(), size_t(88757183) * 4 * 4);  // params + grads + 2 RMSProp slots at least
}

TEST(NasNet, DropPathScheduleIsSlims) {
  auto dev = meta();
  engine::DeviceGuard guard(dev);
  auto c = config("imagenet");
  c.batch = 2;
  NasNet model(c);
  const auto& net = model.net();
  // keep = 1 - min(1, step / 250000) x (cell + 1) / 22 x 0.3
  EXPECT_EQ(net.drop_path_keep(0, 21), 1.0);
  EXPECT_NEAR(net.drop_path_keep(250000, 21), 0.7, 1e-15);
  EXPECT_NEAR(net.drop_path_keep(500000, 21), 0.7, 1e-15);
  EXPECT_NEAR(net.drop_path_keep(125000, 10), 1 - 0.5 * 11.0 / 22.0 * 0.3, 1e-15);  // 0.925
  EXPECT_NEAR(net.drop_path_keep(250000, 0), 1 - 0.3 / 22.0, 1e-15);
  NasNet timm(config("timm"));
  EXPECT_EQ(timm.net().drop_path_keep(250000, 21), 1.0);
}

TEST(NasNet, TinyLearnsOnCpu) {
  auto dev = cpu();
  engine::DeviceGuard guard(dev);
  models::ModelConfig mc;
  mc.name = "nasnet_large";
  mc.size = "tiny";
  auto model = models::create_model(mc);  // through the registry
  std::vector<double> losses;             // the main loss (the aux head's is 0.4 of the total)
  for (int s = 1; s <= 60; s++) {
    models::StepResult r = model->train_step(s);
    losses.push_back(r.losses.at("main"));
    EXPECT_NEAR(r.loss, r.losses.at("main") + 0.4 * r.losses.at("aux"), 1e-5 * r.loss);
  }
  // Label smoothing 0.1 over 5 classes: about log 5 untrained (the stems' batch norm makes it a little lower).
  EXPECT_NEAR(losses[0], std::log(5.0), 0.3) << "an untrained model predicts roughly uniformly";
  double first = 0, last = 0;  // drop path and batches of 8 make single steps noisy: means
  for (int k = 0; k < 5; k++) first += losses[size_t(k)] / 5;
  for (int k = 0; k < 10; k++) last += losses[size_t(59 - k)] / 10;
  EXPECT_LT(last, 0.6 * first) << "first " << first << " last " << last;
}

TEST(NasNet, SameSeedSameLossesBitForBit) {
  auto run = [](uint64_t seed) {
    engine::DeviceGuard guard(cpu());
    auto c = config("tiny");
    c.seed = seed;
    NasNet model(c);  // drop path and dropout: masks from the seeded generator
    std::vector<double> losses;
    for (int s = 1; s <= 6; s++) losses.push_back(model.train_step(s).loss);
    return losses;
  };
  std::vector<double> a = run(1);
  EXPECT_EQ(a, run(1));
  EXPECT_NE(a, run(2));
}

TEST(NasNet, MetaMakesTheSameAllocationsAsCpu) {
  std::string csv[2];
  int k = 0;
  for (auto dev : {cpu(), meta()}) {
    engine::DeviceGuard guard(dev);
    NasNet model(config("tiny"));
    for (int s = 1; s <= 3; s++) model.train_step(s);  // step 1 without drop path, 2 and 3 with
    dev->ledger().check();
    csv[k++] = dev->ledger().events_csv();
  }
  EXPECT_EQ(csv[0], csv[1]);
}

// --recompute cell: each cell keeps only its inputs and runs again in backward: the same steps bit for bit, meta ==
// cpu, and the full-size peak below half the plain run's.
TEST(NasNet, RecomputedCellsTrainTheSameWithLessMemory) {
  models::ModelConfig tiny, full;
  tiny.name = full.name = "nasnet_large";
  tiny.size = "tiny";
  full.batch = 16;
  testutil::expect_recompute_layer_is_exact(tiny, full, 0.5, "cell");
  models::ModelConfig bad = full;
  bad.recompute = "layer";
  EXPECT_ERROR_HAS(NasNetConfig::from(bad), "--recompute layer", "cell");
}

TEST(NasNet, SeparableConvPadsAsTensorFlowSame) {
  // A 5x5 depthwise at stride 2 over 6 x 6: out 3, total padding (3 - 1) 2 + 5 - 6 = 3, i.e. 1 before and 2 after
  // (asymmetric: the explicit pad2d path); over 7 x 7: 2 and 2 (inside the convolution). A direct loop as reference.
  auto dev = cpu();
  engine::DeviceGuard guard(dev);
  engine::manual_seed(3);
  models::vision::SeparableConv2d sep(2, 3, 5, 2);
  for (int64_t size : {6, 7}) {
    Tensor x = ops::randn({1, size, size, 2});
    graph::NoGrad ng;
    Tensor y = sep.forward(x);
    const int64_t out = (size + 1) / 2, total = (out - 1) * 2 + 5 - size, before = total / 2;
    ASSERT_EQ(y.shape(), (engine::Shape{1, out, out, 3}));
    const std::vector<double> xv = x.to_double(), dw = sep.depthwise_conv2d->weight.to_double(),
                              pw = sep.pointwise_conv2d->weight.to_double(), yv = y.to_double();
    for (int64_t i = 0; i < out; i++)
      for (int64_t j = 0; j < out; j++)
        for (int64_t o = 0; o < 3; o++) {
          double ref = 0;
          for (int64_t c = 0; c < 2; c++) {
            double d = 0;  // depthwise [2, 5, 5, 1]
            for (int64_t a = 0; a < 5; a++)
              for (int64_t b = 0; b < 5; b++) {
                const int64_t h = i * 2 - before + a, w = j * 2 - before + b;
                if (h >= 0 && h < size && w >= 0 && w < size)
                  d += xv[size_t((h * size + w) * 2 + c)] * dw[size_t((c * 5 + a) * 5 + b)];
              }
            ref += d * pw[size_t(o * 2 + c)];  // pointwise [3, 1, 1, 2]
          }
          EXPECT_NEAR(yv[size_t((i * out + j) * 3 + o)], ref, 1e-5) << size << " at " << i << "," << j << "," << o;
        }
  }
}

TEST(NasNet, LoadsTimmWeightsWithoutAnAuxHead) {
  auto dev = cpu();
  engine::DeviceGuard guard(dev);
  NasNet a(config("tiny"));
  auto c = config("tiny");
  c.seed = 7;
  NasNet b(c);
  const auto aux_before = b.net().aux_head->fc->weight.to_double();
  // a's weights as a timm state dict: convolutions OIHW, num_batches_tracked, no aux head.
  std::map<std::string, Tensor> timm;
  {
    graph::NoGrad ng;
    for (const auto& [n, t] : a.module().named_parameters())
      if (n.rfind("aux_head.", 0) != 0)
        timm[n] = t.dim() == 4 ? ops::contiguous(ops::permute(t, {0, 3, 1, 2})) : ops::clone(t);
    for (const auto& [n, t] : a.module().named_buffers())
      if (n.rfind("aux_head.", 0) != 0) timm[n] = ops::clone(t);
    timm["conv0.bn.num_batches_tracked"] = ops::zeros({}, engine::DType::i64);
  }
  const std::vector<std::string> loaded = b.load_weights(timm);
  EXPECT_EQ(loaded.size(), timm.size() - 1);  // all but num_batches_tracked
  for (const auto& [n, t] : b.module().named_parameters()) {
    if (n.rfind("aux_head.", 0) == 0) continue;
    Tensor want = a.module().named_parameters()[0].second;
    for (const auto& [m, u] : a.module().named_parameters())
      if (m == n) want = u;
    EXPECT_EQ(testutil::max_abs_diff(t, want), 0.0) << n;
  }
  EXPECT_EQ(b.net().aux_head->fc->weight.to_double(), aux_before) << "the aux head keeps its values";
  timm["cell_0.no_such.weight"] = ops::zeros({1});
  EXPECT_ERROR_HAS(b.load_weights(timm), "cell_0.no_such.weight");
  timm.erase("cell_0.no_such.weight");
  timm.erase("cell_1.conv_1x1.conv.weight");
  EXPECT_ERROR_HAS(b.load_weights(timm), "cell_1.conv_1x1.conv.weight");
}

TEST(NasNet, SyntheticDataIsSeededAndLabelled) {
  auto x = models::vision::synthetic_classification(4, 32, 5, 1, 3);
  auto y = models::vision::synthetic_classification(4, 32, 5, 1, 3);
  auto z = models::vision::synthetic_classification(4, 32, 5, 1, 4);
  EXPECT_EQ(x.images.shape(), (engine::Shape{4, 32, 32, 3}));
  EXPECT_EQ(x.labels.shape(), (engine::Shape{4}));
  EXPECT_EQ(x.images.to_double(), y.images.to_double());
  EXPECT_EQ(x.labels.to_double(), y.labels.to_double());
  EXPECT_NE(x.images.to_double(), z.images.to_double());
  // The centre pixel lies in the rectangle (every image's covers it): within the noise (0.2) of its
  // class's colour, and images of the same class share it.
  const std::vector<double> img = x.images.to_double(), lab = x.labels.to_double();
  for (double l : lab) EXPECT_TRUE(l >= 0 && l < 5) << l;
  for (int64_t n = 0; n < 4; n++)
    for (int64_t m = 0; m < 4; m++)
      for (int64_t ch = 0; ch < 3 && lab[size_t(n)] == lab[size_t(m)]; ch++)
        EXPECT_NEAR(img[size_t(((n * 32 + 16) * 32 + 16) * 3 + ch)], img[size_t(((m * 32 + 16) * 32 + 16) * 3 + ch)],
                    0.4 + 1e-6);
}

// timm's NASNetALarge on a small network (tests/util/nasnet_reference_util.h): logits, loss, every gradient and the
// loss after one update against timm's float64 ones. Covers the wiring, the TF 'SAME' padding (asymmetric at every
// even map: cell_stem_1's 24 x 24, the reductions' 12 x 12 and 6 x 6), the pools' divisors, the factorized
// reduction's shifted path, timm's names and the optimizer.
TEST(NasNet, MatchesTimmOnASmallNetwork) { testutil::expect_nasnet_matches_timm_reference(cpu()); }
