// vision/stylegan.cpp: StyleGAN v1's layers, networks, losses (with the R1 penalty's double backward) and its
// D-then-G step (see stylegan.h).
#include "models/vision/stylegan.h"

#include <cmath>
#include <random>

#include "engine/error.h"
#include "graph/autograd.h"
#include "models/data/image_set.h"
#include "models/vision/deeplabv3.h"
#include "ops/batch_norm.h"
#include "ops/conv.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/matmul.h"
#include "ops/optimizer.h"
#include "ops/pool.h"
#include "ops/reduce.h"
#include "ops/resample.h"
#include "ops/shape.h"
#include "ops/synthetic.h"
#include "ops/view.h"

namespace models::vision {

using engine::DType;

int64_t StyleGANConfig::log2_resolution() const {
  int64_t r = 0;
  while ((int64_t(1) << r) < resolution) r++;
  return r;
}

int64_t StyleGANConfig::nf(int64_t stage) const { return std::min(fmap_base >> stage, fmap_max); }

double StyleGANConfig::gs_beta() const { return std::pow(0.5, double(batch) / 10000.0); }

StyleGANConfig StyleGANConfig::from(const ModelConfig& c) {
  StyleGANConfig s;
  const std::string size = c.size.empty() ? "1024" : c.size;
  if (size == "tiny") {
    s.resolution = 32;
    s.latent = s.dlatent = s.mapping_fmaps = 32;
    s.mapping_layers = 2;
    s.fmap_base = 128;
    s.fmap_max = 32;
    s.batch = 4;
  } else {
    ENGINE_CHECK(size == "1024", "stylegan: unknown --size '", size, "': expected 1024 (FFHQ 1024 x 1024) or tiny");
  }
  ENGINE_CHECK(c.recompute == "none", "stylegan: --recompute ", c.recompute, " is not available (the R1 penalty's ",
               "double backward cannot run through a recomputed region); use --recompute none");
  s.data = c.data;
  ENGINE_CHECK(c.r1_every >= 1 && c.r1_every <= 1000000, "stylegan: --r1-every ", c.r1_every,
               " must be 1 (every D step, StyleGAN v1) to 1000000");
  if (c.batch) s.batch = c.batch;
  s.r1_every = c.r1_every;
  s.seed = c.seed;
  return s;
}

// ---------------------------------------------------------------------------------------------------
// Layers

namespace {

constexpr double kSqrt2 = 1.41421356237309504880;

Tensor lrelu(const Tensor& x) { return ops::leaky_relu(x, 0.2); }

// The 4x4 kernel of a fused resampling conv from the 3x3 one: padded by one on each side and the four shifted
// 4x4 windows summed (dims 1 and 2 of a KRSC-like [A, 3, 3, B] weight).
Tensor summed_4x4(const Tensor& w) {
  ops::Pad2dParams p;
  p.left = p.right = p.top = p.bottom = 1;
  Tensor padded = ops::pad2d(w, p);  // [A, 5, 5, B]
  auto window = [&](int64_t y, int64_t x) { return ops::slice(ops::slice(padded, 1, y, y + 4), 2, x, x + 4); };
  return ops::add(ops::add(window(1, 1), window(0, 1)), ops::add(window(1, 0), window(0, 0)));
}

}  // namespace

EqualizedLinear::EqualizedLinear(int64_t in, int64_t out, double gain, double lrmul_, bool with_bias)
    : coef(gain / std::sqrt(double(in)) * lrmul_), lrmul(lrmul_) {
  weight = register_parameter("weight", ops::randn({out, in}, 0.0, 1.0 / lrmul_));
  if (with_bias) bias = register_parameter("bias", ops::zeros({out}));
}

Tensor EqualizedLinear::forward(const Tensor& x) const {
  auto s = scope();
  return ops::linear(x, ops::mul(weight, coef), bias.defined() ? ops::mul(bias, lrmul) : Tensor());
}

EqualizedConv::EqualizedConv(int64_t in, int64_t out, int64_t k, double gain, bool with_bias)
    : kernel(k), coef(gain / std::sqrt(double(in * k * k))) {
  weight = register_parameter("weight", ops::randn({out, k, k, in}));  // KRSC
  if (with_bias) bias = register_parameter("bias", ops::zeros({out}));
}

Tensor EqualizedConv::scaled_weight() const { return ops::mul(weight, coef); }

Tensor EqualizedConv::conv(const Tensor& x) const {
  auto s = scope();
  ops::Conv2dParams p;
  p.pad_h = p.pad_w = kernel / 2;
  return ops::conv2d(x, scaled_weight(), Tensor(), p);
}

Tensor EqualizedConv::conv_up(const Tensor& x, bool fused) const {
  if (!fused) return conv(ops::upsample_nearest2d(x, 2 * x.size(1), 2 * x.size(2)));
  auto s = scope();
  // tf.nn.conv2d_transpose with the summed 4x4 kernel, stride 2, 'SAME': PyTorch's ConvTranspose2d(4, 2, 1); the
  // engine's transposed-conv weight is [in, KH, KW, out].
  Tensor w = summed_4x4(ops::contiguous(ops::permute(scaled_weight(), {3, 1, 2, 0})));
  ops::Conv2dParams p;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  return ops::conv_transpose2d(x, w, Tensor(), p);
}

Tensor EqualizedConv::conv_down(const Tensor& x, bool fused) const {
  if (!fused) {
    ops::Pool2dParams p;
    p.kernel_h = p.kernel_w = p.stride_h = p.stride_w = 2;
    return ops::avg_pool2d(conv(x), p);
  }
  auto s = scope();
  Tensor w = ops::mul(summed_4x4(scaled_weight()), 0.25);  // [out, 4, 4, in]
  ops::Conv2dParams p;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  return ops::conv2d(x, w, Tensor(), p);
}

Tensor EqualizedConv::add_bias(const Tensor& x) const { return ops::add(x, bias); }

Blur::Blur(int64_t channels) {
  std::vector<float> f(size_t(channels * 9));
  const float k[3] = {1, 2, 1};
  for (int64_t c = 0; c < channels; c++)
    for (int y = 0; y < 3; y++)
      for (int x = 0; x < 3; x++) f[size_t(c * 9 + y * 3 + x)] = k[y] * k[x] / 16.f;
  filter = register_buffer("filter", ops::from_vector(f, {channels, 3, 3, 1}));
}

Tensor Blur::forward(const Tensor& x) const {
  auto s = scope();
  ops::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  p.groups = x.size(3);
  return ops::conv2d(x, filter.dtype() == x.dtype() ? filter : ops::to(filter, x.dtype()), Tensor(), p);
}

SynthesisLayer::SynthesisLayer(Kind k, int64_t in, int64_t out, int64_t dlatent, bool fused_) : kind(k), fused(fused_) {
  if (k == Kind::constant) {
    const_input = register_parameter("const", ops::ones({1, 4, 4, out}));
  } else {
    conv = register_module("conv", std::make_shared<EqualizedConv>(in, out, 3, kSqrt2, false));
    if (k == Kind::up) blur = register_module("Blur", std::make_shared<Blur>(out));
  }
  noise_strength = register_parameter("noise_strength", ops::zeros({out}));
  bias = register_parameter("bias", ops::zeros({out}));
  style = register_module("StyleMod", std::make_shared<EqualizedLinear>(dlatent, 2 * out, 1.0));
}

Tensor SynthesisLayer::forward(const Tensor& x_in, const Tensor& w) const {
  auto s = scope();
  Tensor x;
  if (kind == Kind::constant) {
    const int64_t N = w.size(0);
    x = ops::contiguous(ops::broadcast_to(const_input, {N, 4, 4, const_input.size(3)}));
  } else if (kind == Kind::up) {
    x = blur->forward(conv->conv_up(x_in, fused));
  } else {
    x = conv->conv(x_in);
  }
  const int64_t N = x.size(0), C = x.size(3);
  // Noise: one normal draw per pixel, every channel scaled by its own learned strength (drawn again in backward).
  x = ops::add(ops::add_noise(x, noise_strength), bias);
  x = ops::instance_norm(lrelu(x), 1e-8);
  Tensor st = ops::reshape(style->forward(w), {N, 1, 1, 2 * C});  // StyleMod: scale then shift
  return ops::add(ops::mul(x, ops::add(ops::slice(st, 3, 0, C), 1.0)), ops::slice(st, 3, C, 2 * C));
}

StyleGANGenerator::StyleGANGenerator(const StyleGANConfig& c) {
  auto mapping_holder = register_module("mapping", std::make_shared<graph::Module>());
  for (int64_t i = 0; i < c.mapping_layers; i++) {
    const int64_t in = i == 0 ? c.latent : c.mapping_fmaps,
                  out = i + 1 == c.mapping_layers ? c.dlatent : c.mapping_fmaps;
    mapping_layers.push_back(mapping_holder->register_module(
        "Dense" + std::to_string(i), std::make_shared<EqualizedLinear>(in, out, kSqrt2, c.mapping_lrmul)));
  }
  auto synthesis = register_module("synthesis", std::make_shared<graph::Module>());
  using Kind = SynthesisLayer::Kind;
  auto four = synthesis->register_module("4x4", std::make_shared<graph::Module>());
  layers.push_back(
      four->register_module("Const", std::make_shared<SynthesisLayer>(Kind::constant, 0, c.nf(1), c.dlatent, false)));
  layers.push_back(
      four->register_module("Conv", std::make_shared<SynthesisLayer>(Kind::conv, c.nf(1), c.nf(1), c.dlatent, false)));
  for (int64_t res = 3; res <= c.log2_resolution(); res++) {
    const int64_t size = int64_t(1) << res;
    auto block = synthesis->register_module(std::to_string(size) + "x" + std::to_string(size),
                                            std::make_shared<graph::Module>());
    const bool fused = size >= 128;  // fused_scale 'auto': min(x.shape[2:]) * 2 >= 128
    layers.push_back(block->register_module(
        "Conv0_up", std::make_shared<SynthesisLayer>(Kind::up, c.nf(res - 2), c.nf(res - 1), c.dlatent, fused)));
    layers.push_back(block->register_module(
        "Conv1", std::make_shared<SynthesisLayer>(Kind::conv, c.nf(res - 1), c.nf(res - 1), c.dlatent, false)));
  }
  to_rgb = synthesis->register_module("ToRGB_lod0",
                                      std::make_shared<EqualizedConv>(c.nf(c.log2_resolution() - 1), 3, 1, 1.0, true));
  dlatent_avg = register_buffer("dlatent_avg", ops::zeros({c.dlatent}));
}

Tensor StyleGANGenerator::mapping(const Tensor& z) const {
  auto s = scope();
  engine::MemoryScope m("mapping");
  Tensor x = ops::mul(z, ops::rsqrt(ops::add(ops::mean(ops::mul(z, z), {1}, true), 1e-8)));  // pixel norm
  for (const auto& l : mapping_layers) x = lrelu(l->forward(x));
  return x;
}

Tensor StyleGANGenerator::synthesis(const std::vector<Tensor>& ws) const {
  auto s = scope();
  engine::MemoryScope m("synthesis");
  Tensor x;
  for (size_t i = 0; i < layers.size(); i++) x = layers[i]->forward(x, ws[i]);
  return to_rgb->add_bias(to_rgb->conv(x));
}

StyleGANDiscriminator::StyleGANDiscriminator(const StyleGANConfig& c) : mbstd_group(c.mbstd_group) {
  const int64_t top = c.log2_resolution();
  from_rgb = register_module("FromRGB_lod0", std::make_shared<EqualizedConv>(3, c.nf(top - 1), 1, kSqrt2));
  for (int64_t res = top; res >= 3; res--) {
    const int64_t size = int64_t(1) << res;
    auto holder = register_module(std::to_string(size) + "x" + std::to_string(size), std::make_shared<graph::Module>());
    Block b;
    b.conv0 =
        holder->register_module("Conv0", std::make_shared<EqualizedConv>(c.nf(res - 1), c.nf(res - 1), 3, kSqrt2));
    b.blur = holder->register_module("Blur", std::make_shared<Blur>(c.nf(res - 1)));
    b.conv1 =
        holder->register_module("Conv1_down", std::make_shared<EqualizedConv>(c.nf(res - 1), c.nf(res - 2), 3, kSqrt2));
    b.fused = size >= 128;  // fused_scale 'auto': min(x.shape[2:]) >= 128
    blocks.push_back(b);
  }
  auto four = register_module("4x4", std::make_shared<graph::Module>());
  conv4 = four->register_module("Conv", std::make_shared<EqualizedConv>(c.nf(1) + 1, c.nf(1), 3, kSqrt2));
  dense0 = four->register_module("Dense0", std::make_shared<EqualizedLinear>(c.nf(1) * 16, c.nf(0), kSqrt2));
  dense1 = four->register_module("Dense1", std::make_shared<EqualizedLinear>(c.nf(0), 1, 1.0));
}

Tensor StyleGANDiscriminator::forward(const Tensor& images) const {
  auto s = scope();
  Tensor x = lrelu(from_rgb->add_bias(from_rgb->conv(images)));
  for (const Block& b : blocks) {
    x = lrelu(b.conv0->add_bias(b.conv0->conv(x)));
    x = lrelu(b.conv1->add_bias(b.conv1->conv_down(b.blur->forward(x), b.fused)));
  }
  // Minibatch standard deviation: per group of G samples (sample n in group n / M, M = N / G), the standard
  // deviation over the group, averaged over pixels and channels: one value per m, appended as a feature map.
  const int64_t N = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  // StyleGAN takes min(4, N) and refuses a batch that it does not divide; here such a batch (5, 6, 7, 9, ...) uses
  // its largest divisor below the group size instead, so that any batch trains (the max-batch search probes them).
  int64_t G = std::min(mbstd_group, N);
  while (N % G) G--;
  const int64_t M = N / G;
  {
    engine::MemoryScope ms("MinibatchStddev");
    Tensor y = ops::reshape(x, {G, M, H, W, C});
    y = ops::sub(y, ops::mean(y, {0}, true));
    y = ops::sqrt(ops::add(ops::mean(ops::mul(y, y), {0}), 1e-8));  // [M, H, W, C]
    y = ops::reshape(ops::mean(y, {1, 2, 3}), {1, M, 1, 1, 1});
    y = ops::reshape(ops::contiguous(ops::broadcast_to(y, {G, M, H, W, 1})), {N, H, W, 1});
    x = ops::concat({x, y}, 3);
  }
  x = lrelu(conv4->add_bias(conv4->conv(x)));
  x = lrelu(dense0->forward(ops::reshape(x, {N, -1})));
  return dense1->forward(x);
}

StyleGANNet::StyleGANNet(const StyleGANConfig& c) {
  G = register_module("G", std::make_shared<StyleGANGenerator>(c));
  D = register_module("D", std::make_shared<StyleGANDiscriminator>(c));
}

// ---------------------------------------------------------------------------------------------------
// The model

StyleGAN::StyleGAN(const ModelConfig& c) : config_(StyleGANConfig::from(c)) { build(); }
StyleGAN::StyleGAN(const StyleGANConfig& c) : config_(c) { build(); }

void StyleGAN::build() {
  const auto& c = config_;
  ENGINE_CHECK(c.resolution >= 8 && (int64_t(1) << c.log2_resolution()) == c.resolution, "stylegan: resolution ",
               c.resolution, " must be a power of two, at least 8");
  // --data: listed and checked now (on meta too), before anything is allocated.
  if (!c.data.empty()) reader_ = std::make_shared<data::ImageSet>(c.data);
  engine::manual_seed(c.seed);
  net_ = std::make_shared<StyleGANNet>(c);
  net_->tag_memory();
  ops::AdamOptions o;
  o.lr = c.lr;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  optimizer_ = std::make_unique<ops::Adam>(net_->G->named_parameters("G"), o);
  optimizer_d_ = std::make_unique<ops::Adam>(net_->D->named_parameters("D"), o);
  // Gs: f32 copies of G's weights (the optimizer category: state of the training, not of the network).
  graph::NoGrad no_grad;
  engine::CategoryScope category(engine::Category::optimizer);
  for (const auto& [name, p] : net_->G->named_parameters("G")) {
    Tensor copy = ops::clone(ops::to(p, DType::f32));
    copy.storage()->set_owner(name + "/Gs");
    gs_.emplace_back(name, copy);
  }
}

std::string StyleGAN::summary() const {
  const auto& c = config_;
  return engine::str("stylegan: mapping ", c.mapping_layers, " x ", c.mapping_fmaps, ", synthesis 4x4 to ",
                     c.resolution, "x", c.resolution, " (", c.num_layers(), " styles; G ", net_->G->num_parameters(),
                     " parameters), D_basic (", net_->D->num_parameters(), "), R1 gamma ", c.r1_gamma,
                     c.r1_every > 1 ? engine::str(" every ", c.r1_every, " D steps") : std::string(), ", style mixing ",
                     c.style_mixing, ", batch ", c.batch,
                     " | data: ", reader_ ? reader_->describe() : std::string("seeded synthetic images"));
}

std::vector<int64_t> StyleGAN::probe_schedule() const {
  std::vector<int64_t> steps;
  for (int64_t s = 1; s <= config_.r1_every + 1; s++) steps.push_back(s);
  return steps;
}

Batch StyleGAN::make_batch(int64_t step) {
  const auto& c = config_;
  if (reader_) {  // decoded on the host; meta: zeros of the same shape
    auto dev = engine::default_device();
    const std::vector<float> images = dev->type() == engine::DeviceType::meta
                                          ? std::vector<float>(size_t(c.batch * c.resolution * c.resolution * 3))
                                          : reader_->batch(c.batch, c.resolution, c.seed, step);
    return {{"images", ops::from_vector(images, {c.batch, c.resolution, c.resolution, 3}, compute_dtype(), dev)}};
  }
  ops::PaintedImages b =
      synthetic_segmentation(c.batch, c.resolution, 5, 255, c.seed, step, compute_dtype(), engine::default_device());
  return {{"images", b.images}};
}

Tensor StyleGAN::generate(const Tensor& z, bool mix, std::mt19937_64& rng) {
  const auto& c = config_;
  StyleGANGenerator& G = *net_->G;
  Tensor w = G.mapping(z);
  {  // dlatent_avg = lerp(mean of w over the batch, dlatent_avg, beta)
    graph::NoGrad ng;
    Tensor batch_avg = ops::to(ops::mean(w, {0}), DType::f32);
    ops::copy_(G.dlatent_avg, ops::add(batch_avg, ops::mul(ops::sub(G.dlatent_avg, batch_avg), c.dlatent_avg_beta)));
  }
  const int64_t layers = c.num_layers();
  int64_t cutoff = layers;
  Tensor w2;
  if (mix && std::uniform_real_distribution<double>(0, 1)(rng) < c.style_mixing) {
    cutoff = 1 + int64_t(rng() % uint64_t(layers - 1));  // uniform in [1, layers)
    w2 = G.mapping(ops::randn(z.shape(), 0, 1, z.dtype(), z.device_ptr()));
  }
  std::vector<Tensor> ws(static_cast<size_t>(layers));
  for (int64_t i = 0; i < layers; i++) ws[size_t(i)] = i < cutoff ? w : w2;
  return G.synthesis(ws);
}

Tensor StyleGAN::loss(const Batch& batch) {
  std::mt19937_64 rng(config_.seed);
  Tensor z = ops::randn({config_.batch, config_.latent}, 0, 1, compute_dtype());
  return generator_loss(generate(z, false, rng));
}

Tensor StyleGAN::discriminator_loss(const Tensor& images, const Tensor& fake, bool r1, Tensor* r1_penalty) {
  const auto& c = config_;
  Tensor real = r1 ? images.detach().set_requires_grad(true) : images;
  Tensor fake_scores = net_->D->forward(fake), real_scores = net_->D->forward(real);
  Tensor per_sample = ops::add(ops::softplus(fake_scores), ops::softplus(ops::neg(real_scores)));  // [N, 1]
  if (r1) {
    Tensor grad;
    {
      engine::MemoryScope g("r1");  // the gradient graph: its memory, and the second backward through it
      grad = graph::grad({ops::sum(real_scores)}, {real}, {}, true)[0];
    }
    Tensor penalty = ops::reshape(ops::sum(ops::mul(grad, grad), {1, 2, 3}), {real.size(0), 1});  // [N, 1]
    per_sample = ops::add(per_sample, ops::mul(penalty, c.r1_gamma * 0.5 * double(c.r1_every)));
    if (r1_penalty) *r1_penalty = penalty;
  }
  return ops::mean(per_sample);
}

Tensor StyleGAN::generator_loss(const Tensor& fake) {
  return ops::mean(ops::softplus(ops::neg(net_->D->forward(fake))));
}

StepResult StyleGAN::train_step(int64_t step) {
  const auto& c = config_;
  module().train();
  StepResult result;
  std::mt19937_64 rng(c.seed * 1000003 + uint64_t(step));  // style mixing's coin and crossover
  const DType dt = compute_dtype();
  const bool r1 = r1_step(step);
  Tensor d_loss, g_loss, r1_penalty;
  // The D step: G's images without a graph, D on them and on the reals; R1 through create_graph.
  {
    engine::PhaseScope phase(engine::Phase::forward);
    Batch batch = input_batch(step);
    result.items = items(batch);
    Tensor fake;
    {
      graph::NoGrad ng;
      engine::MemoryScope s("D_step");
      fake = generate(ops::randn({c.batch, c.latent}, 0, 1, dt), true, rng);
    }
    engine::MemoryScope s("D_step");
    d_loss = discriminator_loss(batch.at("images"), fake, r1, &r1_penalty);
  }
  bool finite = update_network(*optimizer_d_, *net_->D, d_loss, "D", result);
  {  // Gs = lerp(G, Gs, beta) (f32, from G's masters under mixed precision)
    engine::PhaseScope phase(engine::Phase::optimizer);
    graph::NoGrad ng;
    const auto params = net_->G->named_parameters("G");
    for (size_t i = 0; i < params.size(); i++) {
      Tensor master = master_weight(params[i].first);
      Tensor p = master.defined() ? master : ops::to(params[i].second, DType::f32);
      const Tensor& gs = gs_[i].second;
      ops::copy_(gs, ops::add(p, ops::mul(ops::sub(gs, p), c.gs_beta())));
    }
  }
  // The G step: fresh latents, D on G's images; D's gradients from it are dropped.
  {
    engine::PhaseScope phase(engine::Phase::forward);
    engine::MemoryScope s("G_step");
    g_loss = generator_loss(generate(ops::randn({c.batch, c.latent}, 0, 1, dt), true, rng));
  }
  finite = update_network(*optimizer_, *net_->G, g_loss, "G", result) && finite;
  optimizer_d_->zero_grad();
  if (precision_ == Precision::fp16) loss_scaler_.update(finite);
  result.losses["loss_D"] = d_loss.item();
  result.losses["loss_G"] = g_loss.item();
  if (r1) result.losses["R1"] = ops::mean(r1_penalty).item();
  result.loss = result.losses["loss_G"];
  return result;
}

}  // namespace models::vision
