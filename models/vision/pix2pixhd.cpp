// vision/pix2pixhd.cpp: pix2pixHD's generator, discriminators, VGG19 features, losses, synthetic data and its
// two-optimizer step (see pix2pixhd.h).
#include "models/vision/pix2pixhd.h"

#include <random>

#include "engine/error.h"
#include "graph/autograd.h"
#include "models/data/cityscapes.h"
#include "ops/batch_norm.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/optimizer.h"
#include "ops/pool.h"
#include "ops/resample.h"
#include "ops/shape.h"
#include "ops/synthetic.h"
#include "ops/view.h"

namespace models::vision {

using engine::DType;

Pix2PixHDConfig Pix2PixHDConfig::from(const ModelConfig& c) {
  Pix2PixHDConfig p;
  const std::string size = c.size.empty() ? "1024p" : c.size;
  if (size == "tiny") {
    p.label_nc = 5;
    p.ngf = 4;
    p.n_downsample_global = 2;
    p.n_blocks_global = 2;
    p.n_blocks_local = 1;
    p.ndf = 8;
    p.vgg_widths = {4, 8, 16, 32, 32};
    p.height = 64;
    p.width = 128;
    p.batch = 2;
  } else {
    ENGINE_CHECK(size == "1024p", "pix2pixhd: unknown --size '", size, "': expected 1024p (the study's, 2048 x 1024) ",
                 "or tiny");
  }
  ENGINE_CHECK(c.recompute == "none" || c.recompute == "layer", "pix2pixhd: --recompute ", c.recompute,
               " does not apply (no attention): none, or layer (each ResNet block recomputed in backward)");
  p.data = c.data;
  p.recompute_blocks = c.recompute == "layer";
  if (c.batch) p.batch = c.batch;
  p.seed = c.seed;
  return p;
}

// ---------------------------------------------------------------------------------------------------
namespace {

// networks.weights_init: every convolution's weight normal(0, 0.02); biases are zero here (PyTorch's default init
// would be uniform; parity runs load the weights).
std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  Conv2dOptions o;
  o.in = in, o.out = out, o.kernel = kernel, o.stride = stride, o.padding = padding;
  o.init = nn::Init::normal(0.02);
  return std::make_shared<Conv2d>(o);
}

Tensor reflect_pad(const Tensor& x, int64_t p) {
  ops::Pad2dParams q;
  q.left = q.right = q.top = q.bottom = p;
  q.mode = ops::PadMode::reflect;
  return ops::pad2d(x, q);
}

// nn.AvgPool2d(3, stride=2, padding=[1, 1], count_include_pad=False): the input pyramid of G and of D.
Tensor downsample(const Tensor& x) {
  ops::Pool2dParams p;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
  p.count_include_pad = false;
  return ops::avg_pool2d(x, p);
}

Tensor norm_relu(const Tensor& x) { return ops::relu(ops::instance_norm(x)); }

}  // namespace

ResnetBlock::ResnetBlock(int64_t dim) {
  conv1 = register_module("conv_block.1", conv(dim, dim, 3, 1, 0));
  conv5 = register_module("conv_block.5", conv(dim, dim, 3, 1, 0));
}

Tensor ResnetBlock::forward(const Tensor& x) const {
  auto s = scope();
  Tensor h = norm_relu(conv1->forward(reflect_pad(x, 1)));
  return ops::add(x, ops::instance_norm(conv5->forward(reflect_pad(h, 1))));
}

LocalEnhancer::LocalEnhancer(const Pix2PixHDConfig& c) : recompute_blocks(c.recompute_blocks) {
  const int64_t in = c.input_channels(), ngf_global = c.ngf * 2;
  // netG.model: GlobalGenerator's layers less its last pad, conv and tanh; sequential indices as in PyTorch.
  global = register_module("model", std::make_shared<Global>());
  global->stem = global->register_module("1", conv(in, ngf_global, 7, 1, 0));
  int64_t index = 4, ch = ngf_global;
  for (int64_t i = 0; i < c.n_downsample_global; i++, index += 3, ch *= 2)
    global->down.push_back(global->register_module(std::to_string(index), conv(ch, ch * 2, 3, 2, 1)));
  for (int64_t b = 0; b < c.n_blocks_global; b++, index++)
    global->blocks.push_back(global->register_module(std::to_string(index), std::make_shared<ResnetBlock>(ch)));
  for (int64_t i = 0; i < c.n_downsample_global; i++, index += 3, ch /= 2) {
    ConvTranspose2dOptions o;
    o.in = ch, o.out = ch / 2, o.kernel = 3, o.stride = 2, o.padding = 1, o.output_padding = 1;
    o.init = nn::Init::normal(0.02);
    global->up.push_back(global->register_module(std::to_string(index), std::make_shared<ConvTranspose2d>(o)));
  }
  // netG.model1_1 and model1_2: the local enhancer at full size.
  local_down = register_module("model1_1", std::make_shared<LocalDown>());
  local_down->stem = local_down->register_module("1", conv(in, c.ngf, 7, 1, 0));
  local_down->down = local_down->register_module("4", conv(c.ngf, c.ngf * 2, 3, 2, 1));
  local_up = register_module("model1_2", std::make_shared<LocalUp>());
  for (int64_t b = 0; b < c.n_blocks_local; b++)
    local_up->blocks.push_back(local_up->register_module(std::to_string(b), std::make_shared<ResnetBlock>(c.ngf * 2)));
  ConvTranspose2dOptions o;
  o.in = c.ngf * 2, o.out = c.ngf, o.kernel = 3, o.stride = 2, o.padding = 1, o.output_padding = 1;
  o.init = nn::Init::normal(0.02);
  local_up->up = local_up->register_module(std::to_string(c.n_blocks_local), std::make_shared<ConvTranspose2d>(o));
  local_up->last = local_up->register_module(std::to_string(c.n_blocks_local + 4), conv(c.ngf, c.output_nc, 7, 1, 0));
}

Tensor LocalEnhancer::forward(const Tensor& input) const {
  auto s = scope();
  Tensor g;
  {
    auto gs = global->scope();
    g = norm_relu(global->stem->forward(reflect_pad(downsample(input), 3)));
    for (const auto& d : global->down) g = norm_relu(d->forward(g));
    for (const auto& b : global->blocks) g = forward_block(b, g, recompute_blocks);
    for (const auto& u : global->up) g = norm_relu(u->forward(g));
  }
  Tensor l;
  {
    auto ls = local_down->scope();
    l = norm_relu(local_down->stem->forward(reflect_pad(input, 3)));
    l = norm_relu(local_down->down->forward(l));
  }
  auto us = local_up->scope();
  Tensor x = ops::add(l, g);
  for (const auto& b : local_up->blocks) x = forward_block(b, x, recompute_blocks);
  x = norm_relu(local_up->up->forward(x));
  return ops::tanh(local_up->last->forward(reflect_pad(x, 3)));
}

MultiscaleDiscriminator::MultiscaleDiscriminator(const Pix2PixHDConfig& c) {
  const int64_t in = c.input_channels() + c.output_nc;
  for (int64_t i = 0; i < c.num_d; i++) {
    std::vector<std::shared_ptr<Conv2d>> layers;
    auto add = [&](int64_t j, int64_t from, int64_t to, int64_t stride) {
      auto holder = register_module("scale" + std::to_string(i) + "_layer" + std::to_string(j),
                                    std::make_shared<graph::Module>());
      layers.push_back(holder->register_module("0", conv(from, to, 4, stride, 2)));
    };
    int64_t nf = c.ndf;
    add(0, in, nf, 2);
    for (int64_t n = 1; n < c.n_layers_d; n++) {
      add(n, nf, std::min<int64_t>(nf * 2, 512), 2);
      nf = std::min<int64_t>(nf * 2, 512);
    }
    add(c.n_layers_d, nf, std::min<int64_t>(nf * 2, 512), 1);
    nf = std::min<int64_t>(nf * 2, 512);
    add(c.n_layers_d + 1, nf, 1, 1);
    scales.push_back(layers);
  }
}

std::vector<std::vector<Tensor>> MultiscaleDiscriminator::forward(const Tensor& input) const {
  std::vector<std::vector<Tensor>> result;
  Tensor x = input;
  const size_t n = scales.size();
  for (size_t i = 0; i < n; i++) {
    // Owned by the scale ("D2" the full-size one): the memory report's per-network rows (Pix2PixHD's depth 2).
    engine::MemoryScope scale_scope(engine::str("D", n - 1 - i));
    if (i > 0) x = downsample(x);
    const std::vector<std::shared_ptr<Conv2d>>& layers = scales[n - 1 - i];
    std::vector<Tensor> outs;
    Tensor h = x;
    for (size_t j = 0; j < layers.size(); j++) {
      h = layers[j]->forward(h);
      if (j > 0 && j + 1 < layers.size()) h = ops::instance_norm(h);
      if (j + 1 < layers.size()) h = ops::leaky_relu(h, 0.2);
      outs.push_back(h);
    }
    result.push_back(outs);
  }
  return result;
}

// torchvision vgg19().features: 3x3 convs (padding 1) + ReLU, max-pools at 4, 9, 18, 27; pix2pixHD's slices end at
// relu1_1 (index 1), relu2_1 (6), relu3_1 (11), relu4_1 (20), relu5_1 (29).
namespace {
struct VggLayer {
  int64_t index;
  int width;  // which of the 5 widths; -1: a max-pool
};
constexpr VggLayer kVgg[] = {{0, 0},  {2, 0},   {4, -1}, {5, 1},  {7, 1},  {9, -1}, {10, 2},  {12, 2}, {14, 2},
                             {16, 2}, {18, -1}, {19, 3}, {21, 3}, {23, 3}, {25, 3}, {27, -1}, {28, 4}};
constexpr int64_t kSliceEnds[] = {0, 5, 10, 19, 28};  // the conv whose ReLU ends each slice
}  // namespace

Vgg19Features::Vgg19Features(const std::vector<int64_t>& widths) {
  ENGINE_CHECK(widths.size() == 5, "Vgg19Features: 5 widths expected");
  auto features = register_module("features", std::make_shared<graph::Module>());
  int64_t in = 3;
  for (const VggLayer& l : kVgg) {
    if (l.width < 0) continue;
    auto c = features->register_module(std::to_string(l.index), conv(in, widths[size_t(l.width)], 3, 1, 1));
    c->weight.set_requires_grad(false);  // frozen: no gradient, no optimizer state
    c->bias.set_requires_grad(false);
    convs.emplace_back(l.index, c);
    in = widths[size_t(l.width)];
  }
}

std::vector<Tensor> Vgg19Features::forward(const Tensor& x) const {
  auto s = scope();
  std::vector<Tensor> out;
  Tensor h = x;
  size_t next = 0;
  for (const VggLayer& l : kVgg) {
    if (l.width < 0) {
      ops::Pool2dParams p;
      p.kernel_h = p.kernel_w = 2;
      p.stride_h = p.stride_w = 2;
      h = ops::max_pool2d(h, p);
      continue;
    }
    h = ops::relu(convs[next++].second->forward(h));
    for (int64_t end : kSliceEnds)
      if (l.index == end) out.push_back(h);
  }
  return out;
}

Pix2PixHDNet::Pix2PixHDNet(const Pix2PixHDConfig& c) {
  netG = register_module("netG", std::make_shared<LocalEnhancer>(c));
  netD = register_module("netD", std::make_shared<MultiscaleDiscriminator>(c));
  vgg = register_module("vgg", std::make_shared<Vgg19Features>(c.vgg_widths));
}

// ---------------------------------------------------------------------------------------------------
Pix2PixHD::Pix2PixHD(const ModelConfig& c) : config_(Pix2PixHDConfig::from(c)) { build(); }
Pix2PixHD::Pix2PixHD(const Pix2PixHDConfig& c) : config_(c) { build(); }

void Pix2PixHD::build() {
  const auto& c = config_;
  const int64_t scale = int64_t(1) << (c.n_downsample_global + 1);  // G's deepest map: reflection pads need 2 rows
  ENGINE_CHECK(c.height % scale == 0 && c.width % scale == 0 && c.height / scale >= 2 && c.width / scale >= 2,
               "pix2pixhd: the image ", c.width, " x ", c.height, " must be a multiple of ", scale,
               " with at least 2 rows and columns after G's ", c.n_downsample_global + 1, " halvings");
  // --data: opened and checked now (on meta too), before anything is allocated.
  if (!c.data.empty()) reader_ = std::make_shared<data::CityscapesSet>(c.data, c.label_nc);
  engine::manual_seed(c.seed);
  net_ = std::make_shared<Pix2PixHDNet>(c);
  net_->tag_memory();
  ops::AdamOptions o;
  o.lr = c.lr;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  optimizer_ = std::make_unique<ops::Adam>(net_->netG->named_parameters("netG"), o);
  optimizer_d_ = std::make_unique<ops::Adam>(net_->netD->named_parameters("netD"), o);
}

std::string Pix2PixHD::summary() const {
  const auto& c = config_;
  return engine::str("pix2pixhd: LocalEnhancer G (global ngf ", c.ngf * 2, ", ", c.n_downsample_global,
                     " downsamplings, ", c.n_blocks_global, " + ", c.n_blocks_local, " ResNet blocks; ",
                     net_->netG->num_parameters(), " parameters), ", c.num_d, " PatchGAN D (ndf ", c.ndf, "; ",
                     net_->netD->num_parameters(), " parameters), frozen VGG19 (", net_->vgg->num_parameters(), "); ",
                     c.label_nc, " classes + edges, ", c.width, "x", c.height, ", batch ", c.batch,
                     c.recompute_blocks ? ", ResNet blocks recomputed in backward" : "",
                     " | data: ", reader_ ? reader_->describe() : std::string("synthetic label maps and images"));
}

std::vector<std::string> Pix2PixHD::load_weights(const std::map<std::string, Tensor>& tensors) {
  // The whole model (engine checkpoints: netG.*, netD.*, vgg.*), strictly.
  for (const auto& [name, t] : tensors)
    if (name.rfind("netG.", 0) == 0 || name.rfind("netD.", 0) == 0 || name.rfind("vgg.", 0) == 0)
      return load_torch_weights(*net_, tensors);
  // One network's own file, strictly: pix2pixHD's latest_net_G / latest_net_D state dicts (converted to
  // safetensors: names without the netG. / netD. prefix), or torchvision's vgg19, whose features after relu5_1 and
  // classifier this VGG19 does not have (left out of the load).
  auto prefixed = [](const std::string& prefix, std::vector<std::string> names) {
    for (std::string& n : names) n = prefix + n;
    return names;
  };
  if (tensors.count("model1_1.1.weight")) return prefixed("netG.", load_torch_weights(*net_->netG, tensors));
  if (tensors.count("scale0_layer0.0.weight")) return prefixed("netD.", load_torch_weights(*net_->netD, tensors));
  if (tensors.count("features.0.weight")) {
    std::map<std::string, Tensor> own;
    const auto vgg = net_->vgg->named_parameters();
    for (const auto& [name, p] : vgg)
      if (tensors.count(name)) own[name] = tensors.at(name);
    return prefixed("vgg.", load_torch_weights(*net_->vgg, own));
  }
  throw engine::Error(
      "pix2pixhd: the weights file is none of this model's: expected an engine checkpoint (netG.*, "
      "netD.*, vgg.*), pix2pixHD's G or D state dict (model1_1.1.weight / scale0_layer0.0.weight), "
      "or torchvision's vgg19 (features.0.weight)");
}

Batch Pix2PixHD::make_batch(int64_t step) {
  const auto& c = config_;
  auto dev = engine::default_device();
  const int64_t N = c.batch, H = c.height, W = c.width, pixels = N * H * W;
  if (reader_) {  // decoded on the host; meta: zeros of the same shapes
    data::CityscapesBatch b =
        dev->type() == engine::DeviceType::meta
            ? data::CityscapesBatch{std::vector<float>(size_t(pixels)), std::vector<float>(size_t(pixels)),
                                    std::vector<float>(size_t(pixels * 3))}
            : reader_->batch(N, H, W, c.seed, step);
    return {{"labels", ops::from_vector(b.labels, {N, H, W, 1}, DType::i64, dev)},
            {"instances", ops::from_vector(b.instances, {N, H, W, 1}, DType::i64, dev)},
            {"images", ops::from_vector(b.images, {N, H, W, 3}, compute_dtype(), dev)}};
  }
  // The scene: 3 to 8 rectangles per image, of a class in 1 .. label_nc - 1 and up to half the image each way;
  // slot r is instance r + 1. Each class has a colour in [-0.8, 0.8) (seeded), so colour + noise 0.2 stays a
  // valid [-1, 1] image; class 0 (row 0) is the background.
  constexpr int64_t kSlots = 8;
  std::mt19937_64 rng(c.seed * 1000003 + uint64_t(step));
  std::vector<int64_t> scenes(size_t(N * kSlots * 5), -1);  // [N, 8, 5]; class -1: empty slot
  for (int64_t n = 0; n < N; n++) {
    const int64_t rectangles = 3 + int64_t(rng() % 6);
    for (int64_t r = 0; r < rectangles; r++) {
      int64_t* row = scenes.data() + (n * kSlots + r) * 5;
      const int64_t cls = 1 + int64_t(rng() % uint64_t(c.label_nc - 1));
      const int64_t h = 1 + int64_t(rng() % uint64_t(H / 2)), w = 1 + int64_t(rng() % uint64_t(W / 2));
      row[0] = cls, row[1] = int64_t(rng() % uint64_t(H - h + 1)), row[2] = int64_t(rng() % uint64_t(W - w + 1));
      row[3] = h, row[4] = w;
    }
  }
  std::vector<float> palette(size_t(c.label_nc * 3));
  std::mt19937_64 colours(c.seed);
  std::uniform_real_distribution<float> u(-0.8f, 0.8f);
  for (float& v : palette) v = u(colours);
  ops::PaintOptions o;
  o.height = H, o.width = W, o.dtype = compute_dtype(), o.noise = 0.2;
  o.seed = c.seed, o.step = step;
  o.labels = true, o.instances = true;
  ops::PaintedImages p = ops::paint_rectangles(ops::from_vector(scenes, {N, kSlots, 5}, DType::i64, dev),
                                               ops::from_vector(palette, {c.label_nc, 3}, DType::f32, dev), o);
  return {{"labels", ops::reshape(p.labels, {N, H, W, 1})},
          {"instances", ops::reshape(p.instances, {N, H, W, 1})},
          {"images", p.images}};
}

Tensor Pix2PixHD::encode_input(const Batch& batch) const {
  engine::MemoryScope s("encode_input");
  const Tensor& labels = batch.at("labels");  // [N, H, W, 1] class ids
  const Tensor& inst = batch.at("instances");
  // [classes] in the labels' dtype (i64 from make_batch; a fixed batch may hold f32 ids)
  Tensor classes = ops::to(ops::arange(config_.label_nc, DType::i64, labels.device_ptr()), labels.dtype());
  Tensor one_hot = ops::to(ops::compare(ops::CompareOp::eq, labels, classes), compute_dtype());          // [N,H,W,C]
  // get_edges: a pixel is an edge where its instance id differs from its left/right or upper/lower neighbour's.
  const int64_t H = inst.size(1), W = inst.size(2);
  Tensor dw = ops::to(ops::compare(ops::CompareOp::ne, ops::slice(inst, 2, 1, W), ops::slice(inst, 2, 0, W - 1)),
                      compute_dtype());  // [N, H, W-1, 1]
  Tensor dh = ops::to(ops::compare(ops::CompareOp::ne, ops::slice(inst, 1, 1, H), ops::slice(inst, 1, 0, H - 1)),
                      compute_dtype());  // [N, H-1, W, 1]
  auto shifted = [](const Tensor& t, int64_t left, int64_t right, int64_t top, int64_t bottom) {
    ops::Pad2dParams p;
    p.left = left, p.right = right, p.top = top, p.bottom = bottom;
    return ops::pad2d(t, p);
  };
  Tensor edge = ops::maximum(ops::maximum(shifted(dw, 1, 0, 0, 0), shifted(dw, 0, 1, 0, 0)),
                             ops::maximum(shifted(dh, 0, 0, 1, 0), shifted(dh, 0, 0, 0, 1)));
  return ops::concat({one_hot, edge}, 3);
}

Pix2PixHD::Losses Pix2PixHD::losses(const Batch& batch) {
  const auto& c = config_;
  Tensor input = encode_input(batch);  // [N, H, W, 36]
  const Tensor& real = batch.at("images");
  Tensor fake = net_->netG->forward(input);
  auto lsgan = [](const std::vector<std::vector<Tensor>>& preds, double target) {
    Tensor total;
    for (const auto& scale : preds) {
      const Tensor& p = scale.back();
      Tensor l = ops::mse_loss(p, ops::full(p.shape(), target, p.dtype(), p.device_ptr()));
      total = total.defined() ? ops::add(total, l) : l;
    }
    return total;
  };
  Losses r;
  std::vector<std::vector<Tensor>> pred_real;
  {
    engine::MemoryScope s("loss_D");
    r.d_fake = lsgan(net_->netD->forward(ops::concat({input, fake.detach()}, 3)), 0.0);
    pred_real = net_->netD->forward(ops::concat({input, real}, 3));
    r.d_real = lsgan(pred_real, 1.0);
    r.loss_d = ops::mul(ops::add(r.d_fake, r.d_real), 0.5);
  }
  engine::MemoryScope s("loss_G");
  std::vector<std::vector<Tensor>> pred_fake = net_->netD->forward(ops::concat({input, fake}, 3));
  r.g_gan = lsgan(pred_fake, 1.0);
  const double feat_weight = 4.0 / double(c.n_layers_d + 1), d_weight = 1.0 / double(c.num_d);
  for (size_t i = 0; i < pred_fake.size(); i++)
    for (size_t j = 0; j + 1 < pred_fake[i].size(); j++) {
      Tensor l =
          ops::mul(ops::l1_loss(pred_fake[i][j], pred_real[i][j].detach()), d_weight * feat_weight * c.lambda_feat);
      r.g_feat = r.g_feat.defined() ? ops::add(r.g_feat, l) : l;
    }
  const double vgg_weights[] = {1.0 / 32, 1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0};
  std::vector<Tensor> vgg_fake = net_->vgg->forward(fake), vgg_real;
  {
    graph::NoGrad ng;  // the real image's features are constants (pix2pixHD detaches them)
    vgg_real = net_->vgg->forward(real);
  }
  for (size_t k = 0; k < vgg_fake.size(); k++) {
    Tensor l = ops::mul(ops::l1_loss(vgg_fake[k], vgg_real[k]), vgg_weights[k] * c.lambda_feat);
    r.g_vgg = r.g_vgg.defined() ? ops::add(r.g_vgg, l) : l;
  }
  r.loss_g = ops::add(ops::add(r.g_gan, r.g_feat), r.g_vgg);
  return r;
}

Tensor Pix2PixHD::loss(const Batch& batch) { return losses(batch).loss_g; }

StepResult Pix2PixHD::train_step(int64_t step) {
  module().train();
  StepResult result;
  Losses l;
  {
    engine::PhaseScope phase(engine::Phase::forward);
    Batch batch = input_batch(step);
    l = losses(batch);
    result.items = items(batch);
  }
  // train.py: G's update from loss_G (its backward also reaches D's weights through D(fake)), then D's (its
  // zero_grad drops those). fp16: both backward passes from the loss times the one loss scale (apex amp's default).
  bool finite = update_network(*optimizer_, *net_->netG, l.loss_g, "G", result);
  finite = update_network(*optimizer_d_, *net_->netD, l.loss_d, "D", result) && finite;
  if (precision_ == Precision::fp16) loss_scaler_.update(finite);
  const std::pair<const char*, const Tensor*> named[] = {
      {"G_GAN", &l.g_gan},   {"G_GAN_Feat", &l.g_feat}, {"G_VGG", &l.g_vgg},  {"D_real", &l.d_real},
      {"D_fake", &l.d_fake}, {"loss_G", &l.loss_g},     {"loss_D", &l.loss_d}};
  for (const auto& [name, t] : named) result.losses[name] = t->item();
  result.loss = result.losses["loss_G"];
  return result;
}

}  // namespace models::vision
