// stylegan_test.cpp: StyleGAN v1 on the cpu and meta: the 1024 networks' parameter counts from the architecture
// (term by term here: the paper's 26.2 M and 23.1 M), the R1 penalty's double backward through a whole (tiny, f64)
// discriminator against finite differences, the fused resampling convs against their unfused definitions, the tiny
// model training (both losses finite and moving, G's moving average following G), meta making the cpu's
// allocations, and --r1-every's saving on the steps without the penalty.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "engine/device.h"
#include "engine/safetensors.h"
#include "graph/autograd.h"
#include "graph/module.h"
#include "models/registry.h"
#include "models/vision/stylegan.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/resample.h"
#include "tests/util/gradcheck_util.h"

using engine::Device;
using engine::DeviceType;
using engine::DType;
using engine::Tensor;
using models::vision::StyleGAN;
using models::vision::StyleGANConfig;

namespace {

StyleGANConfig config(const std::string& size, int64_t r1_every = 1) {
  models::ModelConfig c;
  c.name = "stylegan";
  c.size = size;
  c.r1_every = r1_every;
  return StyleGANConfig::from(c);
}

}  // namespace

TEST(StyleGAN, ParameterCountsAt1024FromTheArchitecture) {
  auto device = Device::create(DeviceType::meta, size_t(1) << 40);
  engine::DeviceGuard guard(device);
  StyleGAN model(config("1024"));
  auto nf = [](int64_t stage) { return std::min<int64_t>(8192 >> stage, 512); };
  const int64_t w = 512;
  // Mapping: 8 dense 512 -> 512 with biases.
  int64_t g = 8 * (512 * 512 + 512);
  // Synthesis: per layer its conv (none for the constant, which is 4 x 4 x 512), noise strengths and biases (C each)
  // and the style dense w -> 2C with its bias; ToRGB 1x1 to 3 with bias.
  auto layer = [&](int64_t conv, int64_t c) { return conv + c + c + w * 2 * c + 2 * c; };
  g += layer(16 * nf(1), nf(1)) + layer(9 * nf(1) * nf(1), nf(1));
  for (int64_t res = 3; res <= 10; res++)
    g += layer(9 * nf(res - 2) * nf(res - 1), nf(res - 1)) + layer(9 * nf(res - 1) * nf(res - 1), nf(res - 1));
  g += nf(9) * 3 + 3;
  EXPECT_EQ(model.net().G->num_parameters(), g);
  EXPECT_EQ(g, 26212019);  // the paper's 26.2 M
  // D: FromRGB 1x1, per resolution 1024 ... 8 two 3x3 convs, then the 4x4 conv on C + 1 maps, dense 16C -> 512, -> 1.
  int64_t d = 3 * nf(9) + nf(9);
  for (int64_t res = 10; res >= 3; res--)
    d += 9 * nf(res - 1) * nf(res - 1) + nf(res - 1) + 9 * nf(res - 1) * nf(res - 2) + nf(res - 2);
  d += 9 * (nf(1) + 1) * nf(1) + nf(1) + 16 * nf(1) * nf(0) + nf(0) + nf(0) + 1;
  EXPECT_EQ(model.net().D->num_parameters(), d);
  EXPECT_EQ(d, 23077137);  // the paper's 23.1 M
  EXPECT_EQ(model.config().num_layers(), 18);
}

// R1 = |dD(x)/dx|^2: its gradient in x is a second derivative of the whole discriminator (every op's double
// backward: convs, the fused downscaling conv, blur, leaky ReLU, minibatch stddev, dense), checked against finite
// differences of R1 itself in f64.
TEST(StyleGAN, TheR1PenaltysDoubleBackwardThroughTheDiscriminator) {
  StyleGANConfig c = config("tiny");
  c.resolution = 8;  // one 8x8 block: all of D's ops, few parameters
  graph::ParameterDtypeScope f64(DType::f64);
  models::vision::StyleGANDiscriminator D(c);
  Tensor x = testutil::rand_input({4, 8, 8, 3});
  testutil::Fn r1 = [&D](const std::vector<Tensor>& in) {
    // The finite differences evaluate R1 itself, which needs the first backward: gradients on, x a leaf.
    const bool outer = in[0].requires_grad();
    graph::EnableGrad on(true);
    Tensor xin = outer ? in[0] : in[0].detach().set_requires_grad(true);
    Tensor g = graph::grad({ops::sum(D.forward(xin))}, {xin}, {}, outer)[0];
    return ops::sum(ops::mul(g, g));
  };
  testutil::expect_gradcheck(r1, {x});
}

// The fused resampling convs (from 128 up) against their definitions (f64). Down: the stride-2 conv with the averaged
// 4x4 kernel is the 3x3 conv then the 2x2 average, exactly. Up: the transposed conv with the summed 4x4 kernel (as
// StyleGAN builds it, unflipped) is nearest upsampling then the 3x3 conv of the kernel turned by 180 degrees, exactly.
TEST(StyleGAN, FusedResamplingConvsEqualTheirDefinitions) {
  graph::ParameterDtypeScope f64(DType::f64);
  models::vision::EqualizedConv conv(5, 6, 3, std::sqrt(2.0)), turned(5, 6, 3, std::sqrt(2.0));
  {
    graph::NoGrad ng;
    std::vector<double> w = conv.weight.to_double(), r(w.size());  // [6, 3, 3, 5]
    for (int64_t o = 0; o < 6; o++)
      for (int64_t y = 0; y < 3; y++)
        for (int64_t x = 0; x < 3; x++)
          for (int64_t i = 0; i < 5; i++)
            r[size_t(((o * 3 + (2 - y)) * 3 + (2 - x)) * 5 + i)] = w[size_t(((o * 3 + y) * 3 + x) * 5 + i)];
    ops::copy_(turned.weight, ops::from_vector(r, {6, 3, 3, 5}, DType::f64));
  }
  Tensor x = ops::rand({2, 8, 8, 5}, -1, 1, DType::f64);
  auto expect_equal = [](const Tensor& a, const Tensor& b, const char* what) {
    ASSERT_EQ(a.shape(), b.shape()) << what;
    const std::vector<double> av = a.to_double(), bv = b.to_double();
    for (size_t i = 0; i < av.size(); i++) EXPECT_NEAR(av[i], bv[i], 1e-10) << what << " element " << i;
  };
  expect_equal(conv.conv_up(x, true), turned.conv_up(x, false), "up");
  expect_equal(conv.conv_down(x, true), conv.conv_down(x, false), "down");
}

TEST(StyleGAN, TinyTrainsOnCpu) {
  auto device = Device::create(DeviceType::cpu, size_t(1) << 32);
  engine::DeviceGuard guard(device);
  StyleGAN model(config("tiny"));
  const Tensor g0 = model.net().G->mapping_layers[0]->weight;
  const std::vector<double> before = g0.to_double(), gs_before = model.gs()[0].second.to_double();
  EXPECT_EQ(before, gs_before) << "Gs starts as G";
  std::vector<models::StepResult> steps;
  for (int64_t s = 1; s <= 4; s++) steps.push_back(model.train_step(s));
  for (const auto& r : steps) {
    EXPECT_TRUE(std::isfinite(r.losses.at("loss_D")) && std::isfinite(r.losses.at("loss_G")));
    EXPECT_GT(r.losses.at("R1"), 0.0);
  }
  EXPECT_NE(steps[0].losses.at("loss_D"), steps[3].losses.at("loss_D"));
  // Gs moves toward G by (1 - beta) per step: it has left its start, and stays closer to it than G.
  const std::vector<double> after = g0.to_double(), gs_after = model.gs()[0].second.to_double();
  double moved_g = 0, moved_gs = 0;
  for (size_t i = 0; i < after.size(); i++) {
    moved_g += std::fabs(after[i] - before[i]);
    moved_gs += std::fabs(gs_after[i] - gs_before[i]);
  }
  EXPECT_GT(moved_gs, 0.0);
  EXPECT_LT(moved_gs, moved_g);
}

TEST(StyleGAN, MetaMakesTheCpusAllocations) {
  std::string csv[2];
  int i = 0;
  for (DeviceType t : {DeviceType::cpu, DeviceType::meta}) {
    auto device = Device::create(t, size_t(1) << 32);
    engine::DeviceGuard guard(device);
    StyleGAN model(config("tiny"));
    for (int64_t s = 1; s <= 2; s++) model.train_step(s);
    csv[i++] = device->ledger().events_csv();
  }
  EXPECT_EQ(csv[0], csv[1]);
}

// --r1-every 4: steps 2-4 skip the penalty (and its double backward), step 5 has it; the peak of a step without it is
// lower; the probe schedule reaches the first penalized step after the optimizer state exists.
TEST(StyleGAN, LazyR1SavesMemoryOnTheStepsWithoutIt) {
  auto step_peaks = [](int64_t every) {
    auto device = Device::create(DeviceType::meta, size_t(1) << 40);
    engine::DeviceGuard guard(device);
    StyleGAN model(config("tiny", every));
    std::vector<size_t> peaks;
    for (int64_t s = 1; s <= 5; s++) {
      device->ledger().reset_peak();
      model.train_step(s);
      peaks.push_back(device->ledger().peak_bytes());
    }
    EXPECT_EQ(model.probe_schedule().back(), every + 1);
    return peaks;
  };
  const std::vector<size_t> every = step_peaks(1), lazy = step_peaks(4);
  EXPECT_LT(lazy[2], every[2]) << "step 3: no R1 with --r1-every 4";
  EXPECT_EQ(lazy[4], every[4]) << "step 5: R1 again, the same step";
}

// G's path, second derivatives included (f64, tiny widths): a synthesis layer of each kind (the constant, a conv, an
// upsampling one: noise, bias, leaky ReLU, instance norm, style modulation) in x and w, and the mapping network
// (pixel norm, equalized dense) in z; D's first derivatives in its input (R1's gradient).
TEST(StyleGAN, EveryLayerHasFirstAndSecondDerivatives) {
  graph::ParameterDtypeScope f64(DType::f64);
  StyleGANConfig c = config("tiny");
  c.resolution = 8;
  using Kind = models::vision::SynthesisLayer::Kind;
  for (Kind kind : {Kind::constant, Kind::conv, Kind::up}) {
    SCOPED_TRACE(int(kind));
    models::vision::SynthesisLayer layer(kind, 3, 4, 6, kind == Kind::up);
    Tensor x = testutil::rand_input({2, 4, 4, 3}), w = testutil::rand_input({2, 6});
    const engine::Generator at = engine::generator();
    const bool constant = kind == Kind::constant;  // no input: only w
    testutil::Fn f = [&layer, at, constant](const std::vector<Tensor>& in) {
      engine::generator() = at;  // the same noise every call
      return constant ? layer.forward(Tensor(), in[0]) : layer.forward(in[0], in[1]);
    };
    const std::vector<Tensor> inputs = constant ? std::vector<Tensor>{w} : std::vector<Tensor>{x, w};
    testutil::expect_gradcheck(f, inputs);
    testutil::expect_double_backward(f, inputs);
  }
  models::vision::StyleGANGenerator G(c);
  testutil::Fn map = [&G](const std::vector<Tensor>& in) { return G.mapping(in[0]); };
  Tensor z = testutil::rand_input({3, c.latent});
  testutil::expect_gradcheck(map, {z});
  testutil::expect_double_backward(map, {z});
  models::vision::StyleGANDiscriminator D(c);
  testutil::Fn d = [&D](const std::vector<Tensor>& in) { return D.forward(in[0]); };
  testutil::expect_gradcheck(d, {testutil::rand_input({4, 8, 8, 3})});
}

// 200 steps of the tiny model: no NaN, both losses move; and two runs from one seed are the same run.
TEST(StyleGAN, TwoHundredStepsWithoutNaNAndSeeded) {
  std::vector<double> runs[2];
  for (int run = 0; run < 2; run++) {
    auto device = Device::create(DeviceType::cpu, size_t(1) << 32);
    engine::DeviceGuard guard(device);
    StyleGAN model(config("tiny"));
    const int steps = run == 0 ? 200 : 3;
    double d_min = 1e30, d_max = -1e30;
    for (int64_t s = 1; s <= steps; s++) {
      models::StepResult r = model.train_step(s);
      for (const auto& [name, v] : r.losses) ASSERT_TRUE(std::isfinite(v)) << name << " at step " << s;
      d_min = std::min(d_min, r.losses.at("loss_D")), d_max = std::max(d_max, r.losses.at("loss_D"));
      if (s <= 3) {
        for (const auto& [name, v] : r.losses) runs[run].push_back(v);
      }
    }
    if (run == 0) {
      EXPECT_GT(d_max - d_min, 0.1);
    }
  }
  EXPECT_EQ(runs[0], runs[1]);
}

// Parity with PyTorch (tests/data/stylegan_reference.safetensors, written by tools/bench/stylegan_parity.py: NVlabs'
// networks at the tiny widths at 128 x 128, where the fused resampling convs run; same weights and inputs, float64):
// G's images, D's scores, the R1 penalty, both losses, the gradient of D's loss in two D weights and that of R1
// alone (the second backward only) in two more.
TEST(StyleGAN, MatchesPyTorchWithTheSameWeights) {
  auto device = Device::create(DeviceType::cpu, size_t(1) << 32);
  engine::DeviceGuard guard(device);
  StyleGANConfig c = config("tiny");
  c.resolution = 128;
  StyleGAN model(c);
  std::map<std::string, Tensor> file = engine::load_safetensors("tests/data/stylegan_reference.safetensors", device);
  std::map<std::string, Tensor> weights;
  for (const auto& [name, t] : file)
    if (name.rfind("G.", 0) == 0 || name.rfind("D.", 0) == 0) weights[name] = t;
  EXPECT_EQ(model.load_weights(weights).size(),
            model.net().named_parameters().size() + model.net().named_buffers().size());
  auto close = [](const Tensor& got, const Tensor& want, double tol, const std::string& what) {
    ASSERT_EQ(engine::numel_of(got.shape()), engine::numel_of(want.shape())) << what;
    const std::vector<double> g = got.to_double(), w = want.to_double();
    double scale = 0, worst = 0;
    for (double v : w) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < g.size(); i++) worst = std::max(worst, std::fabs(g[i] - w[i]) / std::max(scale, 1e-30));
    EXPECT_LE(worst, tol) << what;
    std::printf("%s: worst difference from PyTorch float64 %.2e of its largest value\n", what.c_str(), worst);
  };
  std::mt19937_64 rng(1);
  Tensor fake = model.generate(file.at("input.z"), false, rng);
  close(fake, file.at("expected.fake"), 1e-5, "G's images");
  const Tensor real = file.at("input.real");
  {
    Tensor fake_scores = model.net().D->forward(fake), real_scores = model.net().D->forward(real);
    close(fake_scores, file.at("expected.fake_scores"), 1e-5, "D(fake)");
    close(real_scores, file.at("expected.real_scores"), 1e-5, "D(real)");
  }
  Tensor r1;
  Tensor loss_d = model.discriminator_loss(real, fake.detach(), true, &r1);
  close(r1, file.at("expected.R1"), 1e-4, "R1");
  close(loss_d, file.at("expected.loss_D"), 1e-5, "loss_D");
  close(model.generator_loss(fake), file.at("expected.loss_G"), 1e-5, "loss_G");
  const auto& D = *model.net().D;
  std::vector<Tensor> g = graph::grad({loss_d}, {D.dense0->weight, D.from_rgb->weight}, {}, false, true);
  close(g[0], file.at("expected.dD.Dense0"), 1e-4, "dloss_D/dDense0");
  close(g[1], file.at("expected.dD.FromRGB"), 1e-4, "dloss_D/dFromRGB");
  std::vector<Tensor> h = graph::grad({ops::sum(r1)}, {D.dense0->weight, D.blocks[0].conv1->weight});
  close(h[0], file.at("expected.dR1.Dense0"), 1e-4, "dR1/dDense0");
  close(h[1], file.at("expected.dR1.Conv1_down128"), 1e-4, "dR1/dConv1_down (fused, 128)");
}
