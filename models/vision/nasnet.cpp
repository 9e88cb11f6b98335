// vision/nasnet.cpp: NASNet-A Large's layers, its one cell (normal and reduction from a table), the network,
// its synthetic data and the training recipe.
#include "models/vision/nasnet.h"

#include <algorithm>
#include <random>
#include <set>

#include "engine/error.h"
#include "graph/autograd.h"
#include "models/data/classification.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/pool.h"
#include "ops/resample.h"
#include "ops/shape.h"
#include "ops/synthetic.h"
#include "ops/view.h"

namespace models::vision {

NasNetConfig NasNetConfig::from(const ModelConfig& c) {
  NasNetConfig n;
  const std::string size = c.size.empty() ? "imagenet" : c.size;
  if (size == "tiny") {
    // 96 x 96: conv0 47, stems 24 and 12, reductions 6 and 3; the aux head pools 6 x 6 to 1 x 1.
    n.stem_size = 8;
    n.channels = 8;
    n.cells_per_stack = 2;
    n.classes = 5;
    n.image_size = 96;
    n.batch = 8;
    n.aux_proj = 8, n.aux_hidden = 16;
    n.drop_path_keep = 0.9;
    n.drop_path_steps = 4;  // drop path at full strength from the 5th update on (the tests run a few)
    n.dropout = 0.1;
    n.lr_per_image = 0.005 / 8;
  } else if (size == "timm") {
    // timm.create_model('nasnetalarge', num_classes=1001) exactly: no aux head, no drop path, no dropout.
    n.aux_head = false;
    n.drop_path_keep = 1;
    n.dropout = 0;
  } else {
    ENGINE_CHECK(size == "imagenet", "nasnet_large: unknown --size '", size, "': expected imagenet, timm or tiny");
  }
  ENGINE_CHECK(c.recompute == "none" || c.recompute == "cell", "nasnet_large: --recompute ", c.recompute,
               " does not apply: none, or cell (each cell keeps only its two inputs and runs again in backward)");
  n.recompute_cells = c.recompute == "cell";
  n.data = c.data;
  if (c.batch) n.batch = c.batch;
  n.seed = c.seed;
  return n;
}

std::vector<int64_t> nasnet_feature_sizes(int64_t image_size) {
  std::vector<int64_t> s = {(image_size - 3) / 2 + 1};
  for (int k = 0; k < 4; k++) s.push_back((s.back() + 1) / 2);
  return s;
}

// ---------------------------------------------------------------------------------------------------
// Layers

namespace {
std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t groups = 1) {
  Conv2dOptions o;
  o.in = in, o.out = out, o.kernel = kernel, o.stride = stride, o.groups = groups;
  o.bias = false;
  return std::make_shared<Conv2d>(o);  // PyTorch's default initialization, as timm's model
}
std::shared_ptr<BatchNorm2d> bn(int64_t channels) { return std::make_shared<BatchNorm2d>(channels, 1e-3, 0.1); }

// TensorFlow's 'SAME' split of a k x k window at `stride` over x's H x W (extra row and column at the bottom/right).
ops::Pool2dParams same_padding(const Tensor& x, int64_t k, int64_t stride) {
  return ops::same_pool_padding(ops::pool2d_params(k, stride), x.size(1), x.size(2));
}
}  // namespace

ActConvBn::ActConvBn(int64_t in, int64_t out) {
  conv = register_module("conv", vision::conv(in, out, 1));
  bn = register_module("bn", vision::bn(out));
}

Tensor ActConvBn::forward(const Tensor& x) const { return forward_relu(ops::relu(x)); }

Tensor ActConvBn::forward_relu(const Tensor& relu_x) const {
  auto s = scope();
  return bn->forward(conv->forward(relu_x));
}

SeparableConv2d::SeparableConv2d(int64_t in, int64_t out, int64_t kernel_, int64_t stride_)
    : kernel(kernel_), stride(stride_) {
  depthwise_conv2d = register_module("depthwise_conv2d", vision::conv(in, in, kernel, stride, in));
  pointwise_conv2d = register_module("pointwise_conv2d", vision::conv(in, out, 1));
}

Tensor SeparableConv2d::forward(const Tensor& x) const {
  auto s = scope();
  const ops::Pool2dParams pad = same_padding(x, kernel, stride);
  ops::Conv2dParams p = depthwise_conv2d->params;
  Tensor y;
  if (pad.pad_top == pad.pad_bottom && pad.pad_left == pad.pad_right) {
    p.pad_h = pad.pad_top, p.pad_w = pad.pad_left;
    y = depthwise_conv2d->forward(x, p);
  } else {
    ops::Pad2dParams explicit_pad;
    explicit_pad.left = pad.pad_left, explicit_pad.right = pad.pad_right;
    explicit_pad.top = pad.pad_top, explicit_pad.bottom = pad.pad_bottom;
    p.pad_h = p.pad_w = 0;
    y = depthwise_conv2d->forward(ops::pad2d(x, explicit_pad), p);
  }
  return pointwise_conv2d->forward(y);
}

BranchSeparables::BranchSeparables(int64_t in, int64_t out, int64_t kernel, int64_t stride, bool stem_cell) {
  const int64_t middle = stem_cell ? out : in;
  separable_1 = register_module("separable_1", std::make_shared<SeparableConv2d>(in, middle, kernel, stride));
  bn_sep_1 = register_module("bn_sep_1", bn(middle));
  separable_2 = register_module("separable_2", std::make_shared<SeparableConv2d>(middle, out, kernel, 1));
  bn_sep_2 = register_module("bn_sep_2", bn(out));
}

Tensor BranchSeparables::forward(const Tensor& x) const { return forward_relu(ops::relu(x)); }

Tensor BranchSeparables::forward_relu(const Tensor& relu_x) const {
  auto s = scope();
  Tensor y = bn_sep_1->forward(separable_1->forward(relu_x));
  return bn_sep_2->forward(separable_2->forward(ops::relu(y)));
}

// ---------------------------------------------------------------------------------------------------
// The cell

NasNetCell::NasNetCell(Kind kind_, Left left_, int64_t in_left, int64_t in_right, int64_t f)
    : kind(kind_), left(left_), filters(f) {
  ENGINE_CHECK(f > 0 && (left != Left::factorized || f % 2 == 0), "NasNetCell: ", f,
               " filters: expected a positive number (even with a factorized reduction)");
  conv_1x1 = register_module("conv_1x1", std::make_shared<ActConvBn>(in_right, f));
  if (left == Left::conv) {
    conv_prev_1x1 = register_module("conv_prev_1x1", std::make_shared<ActConvBn>(in_left, f));
  } else if (left == Left::factorized) {
    path_1 = register_module("path_1.conv", conv(in_left, f / 2, 1, 2));  // AvgPool2d(1, 2) + 1x1 = 1x1 stride 2
    path_2 = register_module("path_2.conv", conv(in_left, f / 2, 1, 2));
    final_path_bn = register_module("final_path_bn", bn(f));
  }
  const int64_t l_channels = left == Left::raw ? in_left : f;  // what L holds
  // The operands, in timm's order (its names: comb_iter_<k>_left / _right).
  auto sep = [&](Input in, int64_t k, int64_t stride) {
    const bool widen = in == kL && left == Left::raw;  // cell_stem_0's L is conv0's output
    return Operand{Op::separable, in, k, stride,
                   std::make_shared<BranchSeparables>(widen ? l_channels : f, f, k, stride, widen)};
  };
  auto pool = [](Op op, Input in, int64_t stride) { return Operand{op, in, 3, stride, nullptr}; };
  const Operand identity_l{Op::identity, kL, 1, 1, nullptr}, identity_r{Op::identity, kR, 1, 1, nullptr};
  if (kind == Kind::normal) {
    combinations = {{sep(kR, 5, 1), sep(kL, 3, 1)},
                    {sep(kL, 5, 1), sep(kL, 3, 1)},
                    {pool(Op::avg_pool, kR, 1), identity_l},
                    {pool(Op::avg_pool, kL, 1), pool(Op::avg_pool, kL, 1)},
                    {sep(kR, 3, 1), identity_r}};
  } else {
    combinations = {{sep(kR, 5, 2), sep(kL, 7, 2)},
                    {pool(Op::max_pool, kR, 2), sep(kL, 7, 2)},
                    {pool(Op::avg_pool, kR, 2), sep(kL, 5, 2)},
                    {Operand{Op::identity, kComb1, 1, 1, nullptr}, pool(Op::avg_pool, kComb0, 1)},
                    {sep(kComb0, 3, 1), pool(Op::max_pool, kR, 2)}};
  }
  for (size_t k = 0; k < combinations.size(); k++)
    for (const char* side : {"left", "right"}) {
      const Operand& o = side[0] == 'l' ? combinations[k].left : combinations[k].right;
      if (o.separable) register_module("comb_iter_" + std::to_string(k) + "_" + side, o.separable);
    }
}

Tensor NasNetCell::left_input(const Tensor& x_prev, const Tensor& relu_prev) const {
  if (left == Left::raw) return x_prev;
  if (left == Left::conv) return conv_prev_1x1->forward_relu(relu_prev);
  // The factorized reduction: path 2 reads the pixels one down and right (ZeroPad2d((-1, 1, -1, 1)) crops the
  // first row and column and zero-pads one after the last).
  ops::Pad2dParams shift;
  shift.left = shift.top = -1;
  shift.right = shift.bottom = 1;
  Tensor y = ops::concat({path_1->forward(relu_prev), path_2->forward(ops::pad2d(relu_prev, shift))}, 3);
  return final_path_bn->forward(y);
}

Tensor NasNetCell::apply(const Operand& o, const Tensor& in, const Tensor& relu_in, double keep) const {
  Tensor y;
  switch (o.op) {
    case Op::identity:
      return in;  // no drop path on identities
    case Op::separable:
      y = o.separable->forward_relu(relu_in);
      break;
    case Op::avg_pool:
      // Stride 1: padding 1 not counted (timm's AvgPool2d(3, 1, 1, count_include_pad=False)); stride 2: TF
      // 'SAME' zeros that count (timm's AvgPool2dSame pads explicitly, then averages).
      y = ops::avg_pool2d(
          in, o.stride == 1 ? ops::pool2d_params(3, 1, 1, 1, false, false) : same_padding(in, o.kernel, o.stride));
      break;
    case Op::max_pool:
      y = ops::max_pool2d(in, same_padding(in, o.kernel, o.stride));
      break;
  }
  return ops::drop_path(y, keep, training());
}

Tensor NasNetCell::forward(const Tensor& x, const Tensor& x_prev, double keep) const {
  auto s = scope();
  // Every ReLU of a tensor is computed once and shared by the operations that start with one (timm applies one
  // per operation: the same values, and the same gradients bit for bit, since a ReLU's backward only masks). Each
  // input then has one consumer in the cell, so its gradient sums in the same order whether or not the cell is
  // recomputed (cell_stem_0 reads conv0's output as both x and x_prev).
  const Tensor relu_x = ops::relu(x);
  const Tensor relu_prev = left == Left::raw ? relu_x : ops::relu(x_prev);
  Tensor h[4], relu_h[4];
  h[kR] = conv_1x1->forward_relu(relu_x);
  h[kL] = left_input(x_prev, relu_prev);
  if (left == Left::raw) relu_h[kL] = relu_x;
  auto relu_of = [&](Input in) -> const Tensor& {
    if (!relu_h[in].defined()) relu_h[in] = ops::relu(h[in]);
    return relu_h[in];
  };
  auto operand = [&](const Operand& o) {
    return apply(o, h[o.input], o.op == Op::separable ? relu_of(o.input) : Tensor(), keep);
  };
  std::vector<Tensor> comb;
  for (const Combination& c : combinations) {
    Tensor a = operand(c.left);
    comb.push_back(ops::add(a, operand(c.right)));
    if (comb.size() <= 2) h[kComb0 + comb.size() - 1] = comb.back();
  }
  if (kind == Kind::normal) return ops::concat({h[kL], comb[0], comb[1], comb[2], comb[3], comb[4]}, 3);
  return ops::concat({comb[1], comb[2], comb[3], comb[4]}, 3);
}

// ---------------------------------------------------------------------------------------------------
// Aux head and network

NasNetAuxHead::NasNetAuxHead(int64_t in, int64_t map_size, int64_t proj_channels, int64_t hidden, int64_t classes) {
  ENGINE_CHECK(map_size >= 1, "NASNet aux head: its input map must be at least 5 x 5 (a 5 x 5 valid pooling)");
  proj = register_module("proj", vision::conv(in, proj_channels, 1));
  proj_bn = register_module("proj_bn", bn(proj_channels));
  conv = register_module("conv", vision::conv(proj_channels, hidden, map_size));
  conv_bn = register_module("conv_bn", bn(hidden));
  fc = register_module("fc", std::make_shared<nn::Linear>(hidden, classes));
}

Tensor NasNetAuxHead::forward(const Tensor& x) const {
  auto s = scope();
  Tensor y = ops::avg_pool2d(ops::relu(x), ops::pool2d_params(5, 3));  // VALID
  y = proj_bn->forward(proj->forward(y), ops::NormActivation::relu());
  y = conv_bn->forward(conv->forward(y), ops::NormActivation::relu());  // [N, 1, 1, hidden]
  return fc->forward(ops::reshape(y, {y.size(0), -1}));
}

NasNetNet::NasNetNet(const NasNetConfig& c) : config(c) {
  ENGINE_CHECK(c.cells_per_stack >= 2, "nasnet: ", c.cells_per_stack,
               " cells per stack: at least 2 (a reduction "
               "cell reads the two cells before it)");
  ENGINE_CHECK(c.channels % 4 == 0 && c.channels > 0, "nasnet: ", c.channels,
               " channels: a positive multiple of 4 (the stem cells have a quarter and a half)");
  const std::vector<int64_t> sizes = nasnet_feature_sizes(c.image_size);
  ENGINE_CHECK(c.image_size >= 3 && sizes[4] >= 1, "nasnet: image size ", c.image_size, " is too small");
  conv0 = register_module("conv0.conv", [&] {
    Conv2dOptions o;
    o.in = 3, o.out = c.stem_size, o.kernel = 3, o.stride = 2, o.bias = false;
    return std::make_shared<Conv2d>(o);
  }());
  conv0_bn = register_module("conv0.bn", bn(c.stem_size));

  // The feature maps, as slim's build_nasnet_base lists them: [conv0, cells...], with their channels.
  std::vector<int64_t> channels = {c.stem_size};
  auto add = [&](const std::string& name, NasNetCell::Kind kind, NasNetCell::Left left, size_t x, size_t prev,
                 int64_t f) {
    auto cell = register_module(name, std::make_shared<NasNetCell>(kind, left, channels[prev], channels[x], f));
    cells.push_back(cell);
    cell_names.push_back(name);
    x_of.push_back(x), prev_of.push_back(prev);
    channels.push_back(cell->out_channels());
  };
  using K = NasNetCell::Kind;
  using L = NasNetCell::Left;
  add("cell_stem_0", K::reduction, L::raw, 0, 0, c.channels / 4);
  add("cell_stem_1", K::reduction, L::factorized, 1, 0, c.channels / 2);
  // slim's loop (skip_reduction_layer_input): a cell reads the last map and the one before it; the reduction
  // cell before a stack reads the same two, and the stack's first cell (a FirstCell) the reduction's output and
  // the map the reduction read as its x_prev.
  const int64_t N = c.cells_per_stack;
  int64_t f = c.channels, reductions = 0;
  for (int64_t i = 0; i < 3 * N; i++) {
    const size_t last = channels.size() - 1, prev = last - 1;
    const bool first = i % N == 0;
    if (first && i > 0) {
      f *= 2;
      add("reduction_cell_" + std::to_string(reductions++), K::reduction, L::conv, last, prev, f);
    }
    if (i == 2 * N) aux_after = cells.size() - 2;  // the last normal cell before the second reduction
    add("cell_" + std::to_string(i), K::normal, first ? L::factorized : L::conv, channels.size() - 1, prev, f);
  }
  if (c.aux_head) {
    const int64_t map = (sizes[3] - 5) / 3 + 1;  // the 5 x 5 stride-3 valid pooling of the second stack's maps
    ENGINE_CHECK(sizes[3] >= 5, "nasnet: image size ", c.image_size, " gives ", sizes[3], " x ", sizes[3],
                 " maps at the aux head: at least 5 x 5 needed (an image of at least 75 pixels)");
    aux_head = register_module(
        "aux_head", std::make_shared<NasNetAuxHead>(channels[aux_after + 1], map, c.aux_proj, c.aux_hidden, c.classes));
  }
  last_linear = register_module("last_linear", std::make_shared<nn::Linear>(channels.back(), c.classes));
}

double NasNetNet::drop_path_keep(int64_t step, int64_t cell) const {
  const auto& c = config;
  if (c.drop_path_keep >= 1) return 1;
  // slim's drop_connect_version v3: scaled by the cell's depth, then ramped in over the first updates.
  const double depth = double(cell + 1) / double(c.num_cells());
  const double keep = 1 - depth * (1 - c.drop_path_keep);
  const double ramp = std::min(1.0, double(step) / double(c.drop_path_steps));
  return 1 - ramp * (1 - keep);
}

NasNetNet::Output NasNetNet::forward(const Tensor& images, int64_t step) const {
  std::vector<Tensor> maps;  // [conv0, cells...]
  maps.push_back(conv0_bn->forward(conv0->forward(images)));
  Output out;
  for (size_t i = 0; i < cells.size(); i++) {
    const double keep = training() ? drop_path_keep(step, int64_t(i)) : 1.0;
    const Tensor &x = maps[x_of[i]], &prev = maps[prev_of[i]];
    const auto& cell = cells[i];
    if (config.recompute_cells && graph::grad_enabled()) {
      const bool one_input = x_of[i] == prev_of[i];  // cell_stem_0
      maps.push_back(graph::recompute(
          [cell, keep, one_input](const std::vector<Tensor>& in) {
            return cell->forward(in[0], one_input ? in[0] : in[1], keep);
          },
          one_input ? std::vector<Tensor>{x} : std::vector<Tensor>{x, prev}));
    } else {
      maps.push_back(cell->forward(x, prev, keep));
    }
    if (aux_head && training() && i == aux_after) out.aux_logits = aux_head->forward(maps.back());
    // Maps no later cell reads are dropped now (slim's list keeps two).
    const size_t oldest_read = std::min(x_of[i], prev_of[i]);
    for (size_t m = 0; m + 2 < maps.size() && m < oldest_read; m++) maps[m] = Tensor();
  }
  engine::MemoryScope s("head");
  Tensor y = ops::global_avg_pool2d(ops::relu(maps.back()));  // [N, 1, 1, C]
  maps.clear();
  y = ops::dropout(ops::reshape(y, {y.size(0), -1}), config.dropout, training());
  out.logits = last_linear->forward(y);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Data

ClassificationBatch synthetic_classification(int64_t batch, int64_t size, int64_t classes, uint64_t seed, int64_t step,
                                             engine::DType dtype, std::shared_ptr<engine::Device> device) {
  // Palette row 0 is the background, row k + 1 class k's colour (fixed for every seed and step: learnable).
  std::vector<float> palette(size_t((classes + 1) * 3));
  {
    std::mt19937_64 colours(0xC1A55EEDull);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (float& v : palette) v = u(colours);
  }
  std::mt19937_64 rng(seed * 1000003ull + uint64_t(step) * 7919ull + 29);
  std::vector<int64_t> scenes(size_t(batch * 5)), labels(static_cast<size_t>(batch));  // [N, 1, 5] and [N]
  for (int64_t n = 0; n < batch; n++) {
    const int64_t cls = int64_t(rng() % uint64_t(classes));
    const int64_t h = size / 3 + int64_t(rng() % uint64_t(size / 3 + 1)),
                  w = size / 3 + int64_t(rng() % uint64_t(size / 3 + 1));
    // Anywhere that covers the centre pixel (the object of an ImageNet photo is near its middle).
    auto corner = [&](int64_t extent) {
      const int64_t lo = std::max<int64_t>(0, size / 2 - extent + 1), hi = std::min(size / 2, size - extent);
      return lo + int64_t(rng() % uint64_t(hi - lo + 1));
    };
    const int64_t top = corner(h), left = corner(w);
    int64_t* row = scenes.data() + n * 5;
    row[0] = cls + 1, row[1] = top, row[2] = left, row[3] = h, row[4] = w;
    labels[size_t(n)] = cls;
  }
  if (!device) device = engine::default_device();
  ops::PaintOptions o;
  o.height = o.width = size, o.dtype = dtype, o.noise = 0.2;
  o.seed = seed, o.step = step;
  ops::PaintedImages painted =
      ops::paint_rectangles(ops::from_vector(scenes, {batch, 1, 5}, engine::DType::i64, device),
                            ops::from_vector(palette, {classes + 1, 3}, engine::DType::f32, device), o);
  return {painted.images, ops::from_vector(labels, {batch}, engine::DType::i64, device)};
}

// ---------------------------------------------------------------------------------------------------
// The model

NasNet::NasNet(const ModelConfig& c) : config_(NasNetConfig::from(c)) { build(); }
NasNet::NasNet(const NasNetConfig& c) : config_(c) { build(); }

void NasNet::build() {
  const auto& c = config_;
  if (!c.data.empty()) reader_ = data::ClassificationSet::open_shared(c.data, c.classes);
  engine::manual_seed(c.seed);
  net_ = std::make_shared<NasNetNet>(c);
  net_->tag_memory();
  ops::RmsPropOptions o;
  o.lr = c.lr_per_image * double(c.batch);
  o.alpha = c.rmsprop_decay, o.momentum = c.rmsprop_momentum, o.eps = c.rmsprop_eps;
  o.weight_decay = c.weight_decay;
  o.tf_style = true;
  optimizer_ = std::make_unique<ops::RmsProp>(net_->named_parameters(), o);
  // slim's L2 regularizer covers the convolution and fully connected weights, not batch norm's scales and shifts
  // nor the biases: the parameters of one dimension.
  std::set<std::string> vectors;
  for (const auto& [name, p] : net_->named_parameters())
    if (p.dim() == 1) vectors.insert(name);
  optimizer_->exclude_from_weight_decay([vectors](const std::string& name) { return vectors.count(name) > 0; });
  const double steps_per_decay = c.lr_decay_epochs * double(c.epoch_images) / double(c.batch);
  schedule_ = std::make_unique<ops::ExponentialDecay>(o.lr, c.lr_decay, steps_per_decay, /*staircase=*/true);
  clip_norm_ = c.clip_norm;
}

std::string NasNet::summary() const {
  const auto& c = config_;
  return engine::str("nasnet_large: NASNet-A (", 3 * c.cells_per_stack, " normal cells @ ", c.channels, ", stem ",
                     c.stem_size, "), ", c.classes, " classes, ", c.image_size, "x", c.image_size, ", batch ", c.batch,
                     c.aux_head ? ", aux head (0.4)" : ", no aux head",
                     c.drop_path_keep < 1 ? engine::str(", drop path keep ", c.drop_path_keep) : std::string(),
                     c.recompute_cells ? ", cells recomputed in backward" : "",
                     reader_ ? " | data: " + reader_->describe() : std::string());
}

std::vector<std::string> NasNet::load_weights(const std::map<std::string, Tensor>& tensors) {
  return load_torch_weights(*net_, tensors, {"aux_head."});
}

Batch NasNet::make_batch(int64_t step) {
  const auto& c = config_;
  auto dev = engine::default_device();
  if (reader_) {
    // Decoded and transformed on the host; on meta nothing is decoded: zeros of the same shapes.
    data::ClassificationData b =
        dev->type() == engine::DeviceType::meta
            ? data::ClassificationData{std::vector<float>(size_t(c.batch * c.image_size * c.image_size * 3)),
                                       std::vector<int64_t>(size_t(c.batch))}
            : reader_->batch(c.batch, c.image_size, c.seed, step);
    return {{"images", ops::from_vector(b.images, {c.batch, c.image_size, c.image_size, 3}, compute_dtype(), dev)},
            {"labels", ops::from_vector(b.labels, {c.batch}, engine::DType::i64, dev)}};
  }
  ClassificationBatch b =
      synthetic_classification(c.batch, c.image_size, c.classes, c.seed, step, compute_dtype(), dev);
  return {{"images", b.images}, {"labels", b.labels}};
}

Tensor NasNet::loss(const Batch& batch) {
  const auto& c = config_;
  NasNetNet::Output out = net_->forward(batch.at("images"), optimizer_->step_count());
  engine::MemoryScope s("loss");
  const Tensor& labels = batch.at("labels");
  Tensor main = ops::cross_entropy(out.logits, labels, -100, c.label_smoothing);
  if (!out.aux_logits.defined()) {
    last_main_ = main.detach();
    return main;
  }
  Tensor aux = ops::cross_entropy(out.aux_logits, labels, -100, c.label_smoothing);
  last_main_ = main.detach(), last_aux_ = aux.detach();
  return ops::add(main, ops::mul(aux, c.aux_weight));
}

StepResult NasNet::train_step(int64_t step) {
  StepResult r = Model::train_step(step);
  if (last_aux_.defined()) {
    const bool meta = last_main_.is_meta();
    r.losses["main"] = meta ? 0.0 : last_main_.item();
    r.losses["aux"] = meta ? 0.0 : last_aux_.item();
    if (!meta)
      r.details.push_back(
          engine::str("loss: main ", r.losses["main"], " | aux ", r.losses["aux"], " (x ", config_.aux_weight, ")"));
  }
  last_main_ = last_aux_ = Tensor();
  return r;
}

}  // namespace models::vision
