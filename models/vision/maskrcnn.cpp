// vision/maskrcnn.cpp: Mask R-CNN's FPN, RPN head, box and mask heads, its synthetic data, losses and detection
// (maskrcnn.h), from ops and the rpn.h / roi_heads.h stages.
#include "models/vision/maskrcnn.h"

#include <cmath>
#include <random>

#include "engine/error.h"
#include "graph/autograd.h"
#include "models/data/detection.h"
#include "models/vision/roi_heads.h"
#include "ops/detection.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/pool.h"
#include "ops/resample.h"
#include "ops/roi_align.h"
#include "ops/shape.h"
#include "ops/softmax.h"
#include "ops/synthetic.h"
#include "ops/view.h"

namespace models::vision {

using engine::DType;

MaskRcnnConfig MaskRcnnConfig::from(const ModelConfig& c) {
  MaskRcnnConfig m;
  m.backbone.blocks = {3, 4, 6, 3};
  m.backbone.output_stride = 32;
  m.backbone.frozen_bn = true;
  m.backbone.frozen_stages = 2;
  const std::string size = c.size.empty() ? "coco" : c.size;
  if (size == "torchvision") {
    m.classes = 91;  // torchvision's COCO category ids 1 .. 90 (with gaps) and the background
  } else if (size == "tiny") {
    m.backbone.blocks = {1, 1, 1, 1};
    m.backbone.width = 8;
    m.fpn_channels = 16;
    m.classes = 4;
    m.anchor_sizes = {8, 16, 32, 64, 128};
    m.rpn_train = {150, 100, 0.7, 1e-3};
    m.rpn_test = {100, 50, 0.7, 1e-3};
    m.rpn_samples = 64;
    m.rois = 32;
    m.mask_rois = 8;
    m.max_truths = 8;
    m.polygon_parts = 2;
    m.polygon_vertices = 16;
    m.mask_pool = 7;
    m.representation = 64;
    m.mask_channels = 16;
    m.height = 128, m.width = 150;  // padded to 128 x 160
    m.detections = 10;
    m.warmup = 0;  // a few steps must show learning
  } else {
    ENGINE_CHECK(size == "coco", "maskrcnn: unknown --size '", size, "': expected coco, torchvision or tiny");
  }
  const std::string backbone = c.backbone.empty() ? "r50" : c.backbone;
  ENGINE_CHECK(backbone == "r50" || backbone == "r101", "maskrcnn: unknown --backbone '", backbone,
               "': expected r50 (ResNet-50) or r101 (ResNet-101)");
  if (backbone == "r101")
    m.backbone.blocks = size == "tiny" ? std::array<int64_t, 4>{1, 1, 2, 1} : std::array<int64_t, 4>{3, 4, 23, 3};
  ENGINE_CHECK(c.recompute == "none" || c.recompute == "layer", "maskrcnn: --recompute ", c.recompute,
               " does not apply (no attention): none, or layer (each ResNet bottleneck recomputed in backward)");
  m.backbone.recompute_blocks = c.recompute == "layer";
  m.data = c.data;  // a COCO-style set: its categories must be the classes but the background (checked when opened)
  ENGINE_CHECK(c.data.empty() || size != "torchvision", "maskrcnn: --size torchvision labels by COCO category id; ",
               "--data maps the set's categories to 1 .. K in id order: use --size coco (80 categories) or tiny (3)");
  if (c.batch) m.batch = c.batch;
  m.lr = (size == "tiny" ? 0.02 : 0.02 * double(m.batch) / 16);  // maskrcnn-benchmark's 0.02 for 16 images
  m.inference = c.inference;
  m.seed = c.seed;
  return m;
}

// ---------------------------------------------------------------------------------------------------
namespace {

std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t kernel, nn::Init init) {
  Conv2dOptions o;
  o.in = in, o.out = out, o.kernel = kernel, o.padding = kernel / 2;
  o.bias = true;
  o.init = init;
  return std::make_shared<Conv2d>(o);
}

}  // namespace

Fpn::Fpn(const std::vector<int64_t>& in_channels, int64_t channels) {
  for (size_t k = 0; k < in_channels.size(); k++) {
    const std::string i = std::to_string(k);
    // torchvision's FPN: kaiming_uniform_(a = 1) (gain 1), bias 0.
    inner_blocks.push_back(
        register_module("inner_blocks." + i + ".0", conv(in_channels[k], channels, 1, nn::Init::kaiming_uniform(1))));
    layer_blocks.push_back(
        register_module("layer_blocks." + i + ".0", conv(channels, channels, 3, nn::Init::kaiming_uniform(1))));
  }
}

std::vector<Tensor> Fpn::forward(std::vector<Tensor> x) const {
  auto s = scope();
  const size_t L = x.size();
  std::vector<Tensor> out(L);
  Tensor last = inner_blocks[L - 1]->forward(x[L - 1]);
  out[L - 1] = layer_blocks[L - 1]->forward(last);
  for (size_t k = L - 1; k-- > 0;) {
    Tensor lateral = inner_blocks[k]->forward(x[k]);
    x[k] = Tensor();
    Tensor top_down = ops::upsample_nearest2d(last, lateral.size(1), lateral.size(2));
    last = ops::add(lateral, top_down);
    out[k] = layer_blocks[k]->forward(last);
  }
  ops::Pool2dParams p6;  // LastLevelMaxPool: max_pool2d(P5, 1, 2, 0)
  p6.kernel_h = p6.kernel_w = 1;
  p6.stride_h = p6.stride_w = 2;
  out.push_back(ops::max_pool2d(out[L - 1], p6));
  return out;
}

RpnHead::RpnHead(int64_t channels, int64_t anchors) {
  const nn::Init init = nn::Init::normal(0.01);  // torchvision's RPNHead: normal(0, 0.01), bias 0
  conv = register_module("conv.0.0", vision::conv(channels, channels, 3, init));
  cls_logits = register_module("cls_logits", vision::conv(channels, anchors, 1, init));
  bbox_pred = register_module("bbox_pred", vision::conv(channels, 4 * anchors, 1, init));
}

RpnHead::Output RpnHead::forward(const std::vector<Tensor>& levels) const {
  auto s = scope();
  Output o;
  for (const Tensor& x : levels) {
    Tensor t = ops::relu(conv->forward(x));
    const int64_t N = x.size(0), K = x.size(1) * x.size(2) * cls_logits->options.out;
    // NHWC puts a cell's anchors consecutively, as torchvision's permute_and_flatten orders them.
    o.objectness.push_back(ops::reshape(cls_logits->forward(t), {N, K}));
    o.deltas.push_back(ops::reshape(bbox_pred->forward(t), {N, K, 4}));
  }
  return o;
}

MaskRcnnNet::MaskRcnnNet(const MaskRcnnConfig& c) : config(c) {
  backbone = register_module("backbone", std::make_shared<graph::Module>());
  body = backbone->register_module("body", std::make_shared<ResNet>(c.backbone));
  std::vector<int64_t> widths;
  for (int64_t stage = 0; stage < 4; stage++) widths.push_back(c.backbone.width * 4 << stage);
  fpn = backbone->register_module("fpn", std::make_shared<Fpn>(widths, c.fpn_channels));
  rpn = register_module("rpn", std::make_shared<graph::Module>());
  rpn_head = rpn->register_module("head", std::make_shared<RpnHead>(c.fpn_channels, c.anchors_per_cell()));
  roi_heads = register_module("roi_heads", std::make_shared<graph::Module>());
  auto box_head = roi_heads->register_module("box_head", std::make_shared<graph::Module>());
  const int64_t pooled = c.fpn_channels * c.box_pool * c.box_pool;
  fc6 = box_head->register_module("fc6", std::make_shared<nn::Linear>(pooled, c.representation));
  fc7 = box_head->register_module("fc7", std::make_shared<nn::Linear>(c.representation, c.representation));
  auto predictor = roi_heads->register_module("box_predictor", std::make_shared<graph::Module>());
  cls_score = predictor->register_module("cls_score", std::make_shared<nn::Linear>(c.representation, c.classes));
  bbox_pred = predictor->register_module("bbox_pred", std::make_shared<nn::Linear>(c.representation, 4 * c.classes));
  auto mask = roi_heads->register_module("mask_head", std::make_shared<graph::Module>());
  for (int64_t k = 0; k < 4; k++)
    mask_convs.push_back(
        mask->register_module(std::to_string(k) + ".0", conv(k == 0 ? c.fpn_channels : c.mask_channels, c.mask_channels,
                                                             3, kaiming_normal_fan_out(c.mask_channels, 3))));
  auto mask_predictor = roi_heads->register_module("mask_predictor", std::make_shared<graph::Module>());
  ConvTranspose2dOptions up;
  up.in = up.out = c.mask_channels, up.kernel = 2, up.stride = 2;
  up.init = kaiming_normal_fan_out(c.mask_channels, 2);
  conv5_mask = mask_predictor->register_module("conv5_mask", std::make_shared<ConvTranspose2d>(up));
  mask_fcn_logits = mask_predictor->register_module(
      "mask_fcn_logits", conv(c.mask_channels, c.classes, 1, kaiming_normal_fan_out(c.classes, 1)));
}

std::vector<Tensor> MaskRcnnNet::anchors(const std::vector<Tensor>& levels, const Tensor& images) const {
  std::vector<Tensor> out;
  for (size_t l = 0; l < levels.size(); l++)  // a level's stride: the padded image over its size
    out.push_back(ops::grid_anchors(levels[l].size(1), levels[l].size(2), images.size(1) / levels[l].size(1),
                                    images.size(2) / levels[l].size(2), {config.anchor_sizes[l]}, config.anchor_ratios,
                                    images.device_ptr()));
  return out;
}

RpnHead::Output MaskRcnnNet::rpn_head_forward(const std::vector<Tensor>& levels) const {
  auto s = rpn->scope();
  return rpn_head->forward(levels);
}

std::vector<Tensor> MaskRcnnNet::features(const Tensor& images) const {
  auto s = backbone->scope();
  return fpn->forward(body->forward_stages(images));
}

Tensor MaskRcnnNet::pool(const std::vector<Tensor>& levels, const Tensor& rois, const Tensor& pooled,
                         Pooler which) const {
  auto heads = roi_heads->scope();
  const bool box = which == Pooler::box;
  engine::MemoryScope s(box ? "box_roi_pool" : "mask_roi_pool");  // torchvision's names
  const int64_t size = box ? config.box_pool : config.mask_pool;
  const int64_t N = rois.size(0), S = rois.size(1);  // the boxes are data: the gradient reaches only the levels
  Tensor image = ops::broadcast_to(ops::reshape(ops::arange(N, DType::f32, rois.device_ptr()), {N, 1, 1}), {N, S, 1});
  Tensor boxes = ops::contiguous(rois);
  Tensor with_image = ops::reshape(ops::concat({ops::contiguous(image), boxes}, 2), {N * S, 5});
  // The pyramid level of each slot; -1 (padding: no output, no gradient) where nothing is pooled.
  Tensor level = ops::to(ops::fpn_levels(boxes), DType::f32);
  level = ops::add(ops::mul(ops::add(level, 1.0), ops::to(pooled, DType::f32)), -1.0);
  ops::RoiAlignParams p;
  p.out_h = p.out_w = size;
  p.sampling_ratio = 2;
  p.scales = {1.0 / 4, 1.0 / 8, 1.0 / 16, 1.0 / 32};
  return ops::roi_align({levels[0], levels[1], levels[2], levels[3]}, with_image,
                        ops::reshape(ops::to(level, DType::i64), {N * S}), p);
}

std::pair<Tensor, Tensor> MaskRcnnNet::box_head(const Tensor& pooled) const {
  auto s = roi_heads->scope();
  Tensor x;
  {
    engine::MemoryScope head("box_head");
    x = ops::reshape(pooled, {pooled.size(0), pooled.numel() / pooled.size(0)});  // [R, 7 7 C] in (h, w, c) order
    x = fc7->forward(fc6->forward(x, ops::Activation::relu), ops::Activation::relu);  // relu in the GEMMs
  }
  engine::MemoryScope predictor("box_predictor");
  return {cls_score->forward(x), bbox_pred->forward(x)};
}

Tensor MaskRcnnNet::mask_head(const Tensor& pooled) const {
  auto s = roi_heads->scope();
  Tensor x = pooled;
  {
    engine::MemoryScope head("mask_head");
    for (const auto& c : mask_convs) x = ops::relu(c->forward(x));
  }
  engine::MemoryScope predictor("mask_predictor");
  return mask_fcn_logits->forward(ops::relu(conv5_mask->forward(x)));
}

// ---------------------------------------------------------------------------------------------------
// Synthetic scenes

namespace {
constexpr int64_t kMaxObjects = 8;        // per synthetic image: 1 to 8
constexpr int64_t kEllipseVertices = 32;  // a synthetic object's polygon
}  // namespace

Batch synthetic_maskrcnn_batch(const MaskRcnnConfig& c, int64_t step, DType dtype,
                               std::shared_ptr<engine::Device> device) {
  const int64_t N = c.batch, G = c.max_truths, P = c.polygon_parts, V = c.polygon_vertices;
  const int64_t H = c.height, W = c.width, R = std::min(kMaxObjects, G);
  const int64_t vertices = std::min(kEllipseVertices, V);
  std::mt19937_64 rng(c.seed * 1000003ull + uint64_t(step) * 7919ull + 31);
  std::vector<int64_t> scenes(size_t(N * R * 5), -1);
  std::vector<float> boxes(size_t(N * G * 4), 0.f), polygons(size_t(N * G * P * V * 2), 0.f), hw;
  std::vector<int64_t> labels(size_t(N * G), 0), counts(size_t(N * G * P), 0);
  std::vector<float> valid(size_t(N * G), 0.f);
  const int64_t lo = std::max<int64_t>(8, std::min(H, W) / 25), hi = std::min(H, W) / 2;
  for (int64_t n = 0; n < N; n++) {
    hw.insert(hw.end(), {float(H), float(W)});
    const int64_t count = 1 + int64_t(rng() % uint64_t(R));
    for (int64_t r = 0; r < count; r++) {
      const int64_t cls = 1 + int64_t(rng() % uint64_t(c.classes - 1));
      const int64_t h = lo + int64_t(rng() % uint64_t(hi - lo + 1)), w = lo + int64_t(rng() % uint64_t(hi - lo + 1));
      const int64_t top = int64_t(rng() % uint64_t(H - h + 1)), left = int64_t(rng() % uint64_t(W - w + 1));
      int64_t* row = scenes.data() + (n * R + r) * 5;
      row[0] = cls, row[1] = top, row[2] = left, row[3] = h, row[4] = w;  // palette row = class
      const size_t g = size_t(n * G + r);
      float* b = boxes.data() + g * 4;
      b[0] = float(left), b[1] = float(top), b[2] = float(left + w), b[3] = float(top + h);
      labels[g] = cls;
      valid[g] = 1.f;
      // The painted ellipse's polygon, as an annotator would trace it (part 0).
      counts[g * size_t(P)] = vertices;
      for (int64_t k = 0; k < vertices; k++) {
        const double a = 2 * M_PI * double(k) / double(vertices);
        float* v = polygons.data() + (g * size_t(P) * size_t(V) + size_t(k)) * 2;
        v[0] = float(left + w / 2.0 + w / 2.0 * std::cos(a));
        v[1] = float(top + h / 2.0 + h / 2.0 * std::sin(a));
      }
    }
  }
  // Each class a fixed colour (the same for every seed and step), row 0 the background (black).
  std::vector<float> palette(size_t(c.classes * 3), 0.f);
  {
    std::mt19937_64 colours(0xC0C0A11ull);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (size_t i = 3; i < palette.size(); i++) palette[i] = u(colours);
  }
  ops::PaintOptions o;
  o.height = H, o.width = W, o.dtype = dtype, o.noise = 0.2;
  o.seed = c.seed, o.step = step;
  o.ellipses = true;
  Tensor images = ops::paint_rectangles(ops::from_vector(scenes, {N, R, 5}, DType::i64, device),
                                        ops::from_vector(palette, {c.classes, 3}, DType::f32, device), o)
                      .images;
  if (c.padded_height() != H || c.padded_width() != W) {
    ops::Pad2dParams pad;  // zeros below and to the right, as torchvision's batch_images
    pad.bottom = c.padded_height() - H, pad.right = c.padded_width() - W;
    images = ops::pad2d(images, pad);
  }
  return {{"images", images},
          {"image_hw", ops::from_vector(hw, {N, 2}, DType::f32, device)},
          {"boxes", ops::from_vector(boxes, {N, G, 4}, DType::f32, device)},
          {"labels", ops::from_vector(labels, {N, G}, DType::i64, device)},
          {"valid", ops::to(ops::from_vector(valid, {N, G}, DType::f32, device), DType::boolean)},
          {"polygons", ops::from_vector(polygons, {N, G, P, V, 2}, DType::f32, device)},
          {"counts", ops::from_vector(counts, {N, G, P}, DType::i64, device)}};
}

// ---------------------------------------------------------------------------------------------------
MaskRcnn::MaskRcnn(const ModelConfig& c) : config_(MaskRcnnConfig::from(c)) { build(); }
MaskRcnn::MaskRcnn(const MaskRcnnConfig& c) : config_(c) { build(); }

void MaskRcnn::build() {
  const auto& c = config_;
  ENGINE_CHECK(c.classes >= 2, "maskrcnn: classes must be >= 2 (the background and one), got ", c.classes);
  ENGINE_CHECK(c.mask_rois <= c.rois && double(c.mask_rois) >= std::floor(double(c.rois) * c.roi_positive),
               "maskrcnn: ", "mask_rois ", c.mask_rois, " must hold every foreground slot of the draw (at least ",
               c.rois, " x ", c.roi_positive, ") and at most the ", c.rois, " sampled");
  ENGINE_CHECK(c.height >= 32 && c.width >= 32, "maskrcnn: images of at least 32 x 32 expected, got ", c.height, " x ",
               c.width);
  // --data: opened and checked now (on meta too), before anything is allocated.
  if (!c.data.empty()) reader_ = data::DetectionSet::open_shared(c.data, c.classes - 1, c.max_truths);
  engine::manual_seed(c.seed);
  net_ = std::make_shared<MaskRcnnNet>(c);
  net_->tag_memory();
  ops::SgdOptions o;
  o.lr = c.lr;
  o.momentum = c.momentum;
  o.weight_decay = c.weight_decay;
  optimizer_ = std::make_unique<ops::Sgd>(net_->named_parameters(), o);
  schedule_ = std::make_unique<ops::WarmupMultiStep>(c.lr, c.warmup, c.warmup_factor, c.lr_steps);
}

std::string MaskRcnn::summary() const {
  const auto& c = config_;
  const auto& b = c.backbone.blocks;
  return engine::str(
      "maskrcnn: ResNet (blocks ", b[0], "/", b[1], "/", b[2], "/", b[3], ", width ", c.backbone.width,
      ", frozen BN, stem + layer1 frozen) + FPN P2-P6 ", c.fpn_channels, "ch, RPN ", c.anchors_per_cell(),
      " anchors per cell, ", c.classes, " classes, ", c.height, "x", c.width, " padded to ", c.padded_height(), "x",
      c.padded_width(), ", batch ", c.batch, " | fixed counts per image: ", c.max_truths, " truths (", c.polygon_parts,
      " x ", c.polygon_vertices, "-vertex polygons), ", c.rpn_train.pre_nms_top_n, " per level before NMS, ",
      c.rpn_train.post_nms_top_n, " proposals, ", c.rpn_samples, " RPN samples, ", c.rois, " RoIs, ", c.mask_rois,
      " mask RoIs", c.backbone.recompute_blocks ? ", bottlenecks recomputed in backward" : "",
      reader_ ? " | data: " + reader_->describe() : std::string(),
      reader_ && !reader_->instance_notes(geometry()).empty() ? "; " + reader_->instance_notes(geometry())
                                                              : std::string());
}

data::InstanceGeometry MaskRcnn::geometry() const {
  data::InstanceGeometry g;
  g.min_size = std::min(config_.height, config_.width), g.max_size = std::max(config_.height, config_.width);
  g.padded_h = config_.padded_height(), g.padded_w = config_.padded_width();
  g.truths = config_.max_truths, g.parts = config_.polygon_parts, g.vertices = config_.polygon_vertices;
  return g;
}

std::vector<std::string> MaskRcnn::load_weights(const std::map<std::string, Tensor>& tensors) {
  // torchvision flattens a pooled RoI [C, 7, 7] channel-major; the engine's [7, 7, C] is channel-minor: fc6's
  // columns are permuted for a file in PyTorch's layout (its stem convolution OIHW).
  std::map<std::string, Tensor> own = tensors;
  auto conv1 = own.find("backbone.body.conv1.weight");
  auto fc6 = own.find("roi_heads.box_head.fc6.weight");
  const int64_t C = config_.fpn_channels, S = config_.box_pool;
  if (conv1 != own.end() && conv1->second.dim() == 4 && conv1->second.size(1) == config_.backbone.in_channels &&
      conv1->second.size(1) != conv1->second.size(3) && fc6 != own.end() && fc6->second.dim() == 2 &&
      fc6->second.size(1) == C * S * S) {
    graph::NoGrad no_grad;
    const int64_t out = fc6->second.size(0);
    fc6->second = ops::reshape(ops::contiguous(ops::permute(ops::reshape(fc6->second, {out, C, S, S}), {0, 2, 3, 1})),
                               {out, C * S * S});
  }
  return load_torch_weights(*net_, own);
}

Batch MaskRcnn::make_batch(int64_t step) {
  auto dev = engine::default_device();
  if (!reader_) return synthetic_maskrcnn_batch(config_, step, compute_dtype(), dev);
  // Decoded, resized and padded on the host; on meta nothing is decoded: zeros of the same shapes.
  const data::InstanceGeometry g = geometry();
  const int64_t N = config_.batch, G = g.truths, P = g.parts, V = g.vertices;
  data::InstanceData b;
  if (dev->type() == engine::DeviceType::meta) {
    b.images.resize(size_t(N * g.padded_h * g.padded_w * 3)), b.image_hw.resize(size_t(N * 2));
    b.boxes.resize(size_t(N * G * 4)), b.labels.resize(size_t(N * G)), b.valid.resize(size_t(N * G));
    b.polygons.resize(size_t(N * G * P * V * 2)), b.counts.resize(size_t(N * G * P));
  } else {
    b = reader_->instance_batch(N, g, config_.seed, step);
  }
  return {{"images", ops::from_vector(b.images, {N, g.padded_h, g.padded_w, 3}, compute_dtype(), dev)},
          {"image_hw", ops::from_vector(b.image_hw, {N, 2}, DType::f32, dev)},
          {"boxes", ops::from_vector(b.boxes, {N, G, 4}, DType::f32, dev)},
          {"labels", ops::from_vector(b.labels, {N, G}, DType::i64, dev)},
          {"valid", ops::to(ops::from_vector(b.valid, {N, G}, DType::f32, dev), DType::boolean)},
          {"polygons", ops::from_vector(b.polygons, {N, G, P, V, 2}, DType::f32, dev)},
          {"counts", ops::from_vector(b.counts, {N, G, P}, DType::i64, dev)}};
}

Tensor MaskRcnn::loss(const Batch& batch) {
  const auto& c = config_;
  const Tensor& images = batch.at("images");
  const int64_t N = images.size(0);
  std::vector<Tensor> levels = net_->features(images);  // P2..P6
  // RPN: its head on every level, the anchors of each, the proposals (detached) and its loss.
  RpnHead::Output head = net_->rpn_head_forward(levels);
  const std::vector<Tensor> anchors = net_->anchors(levels, images);
  const Tensor &truths = batch.at("boxes"), &truth_valid = batch.at("valid"), &truth_labels = batch.at("labels");
  Proposals proposals;
  RpnLoss rpn;
  {
    engine::MemoryScope s("rpn");
    proposals = rpn_proposals(head.objectness, head.deltas, anchors, batch.at("image_hw"),
                              net_->training() ? c.rpn_train : c.rpn_test);
    RpnTargets targets = rpn_targets(ops::concat(anchors, 0), truths, truth_valid);
    ops::Sampled sampled = ops::sample_balanced(targets.labels, c.rpn_samples, c.rpn_positive);
    rpn = rpn_loss(ops::concat(head.objectness, 1), ops::concat(head.deltas, 1), targets.targets, sampled);
  }
  head = RpnHead::Output();
  levels.pop_back();  // P6 feeds the RPN only
  // Box head: the sampled candidates' boxes pooled, classified and regressed.
  RoiTargets sampled;
  {
    engine::MemoryScope s("roi_heads");
    RoiTargets all = roi_targets(proposals.boxes, proposals.valid, truths, truth_labels, truth_valid);
    sampled = take_samples(all, ops::sample_balanced(sampler_labels(all.labels), c.rois, c.roi_positive));
  }
  Tensor drawn = ops::compare(ops::CompareOp::ge, sampled.labels, 0.0);  // not a padding slot
  auto [class_logits, box_regression] = net_->box_head(net_->pool(levels, sampled.boxes, drawn, Pooler::box));
  FastRcnnLoss box = fastrcnn_loss(class_logits, box_regression, sampled.labels, sampled.targets);
  // Mask head: the first mask_rois slots of each image's draw, which hold its foreground.
  const int64_t F = c.mask_rois, M = c.mask_size();
  Tensor mask_boxes = ops::contiguous(ops::slice(sampled.boxes, 1, 0, F));
  Tensor mask_labels = ops::contiguous(ops::slice(sampled.labels, 1, 0, F));
  Tensor foreground = ops::compare(ops::CompareOp::gt, mask_labels, 0.0);
  Tensor mask_targets;
  {
    engine::MemoryScope s("roi_heads");
    graph::NoGrad no_grad;
    Tensor truth = ops::where(foreground, ops::slice(sampled.matched, 1, 0, F),
                              ops::full({N, F}, -1.0, DType::i64, images.device_ptr()));
    mask_targets = ops::polygon_masks(batch.at("polygons"), batch.at("counts"), mask_boxes, ops::contiguous(truth), M);
  }
  Tensor mask_logits = net_->mask_head(net_->pool(levels, mask_boxes, foreground, Pooler::mask));
  Tensor mask = mask_loss(mask_logits, mask_labels, ops::reshape(mask_targets, {N * F, M, M}));
  engine::MemoryScope s("loss");
  {
    graph::NoGrad no_grad;  // reporting only
    parts_ = {{"rpn_objectness", rpn.objectness.detach()},
              {"rpn_box", rpn.box.detach()},
              {"classifier", box.classifier.detach()},
              {"box", box.box.detach()},
              {"mask", mask.detach()}};
  }
  auto f32 = [](const Tensor& t) { return ops::to(t, DType::f32); };
  return ops::add(ops::add(ops::add(f32(rpn.objectness), f32(rpn.box)), ops::add(f32(box.classifier), f32(box.box))),
                  f32(mask));
}

MaskRcnn::Detections MaskRcnn::detect(const Batch& batch) {
  const auto& c = config_;
  graph::NoGrad no_grad;
  const Tensor& images = batch.at("images");
  const int64_t N = images.size(0), C = c.classes, D = c.detections;
  std::vector<Tensor> levels = net_->features(images);
  RpnHead::Output head = net_->rpn_head_forward(levels);
  const std::vector<Tensor> anchors = net_->anchors(levels, images);
  Proposals proposals = rpn_proposals(head.objectness, head.deltas, anchors, batch.at("image_hw"), c.rpn_test);
  head = RpnHead::Output();
  levels.pop_back();
  const int64_t P = proposals.boxes.size(1);
  engine::MemoryScope s("postprocess");
  auto [class_logits, box_regression] =
      net_->box_head(net_->pool(levels, proposals.boxes, proposals.valid, Pooler::box));
  // torchvision's postprocess_detections in fixed slots: every (proposal, foreground class) a candidate with its
  // class's decoded box and softmax score; those below the score threshold, small or from padding proposals invalid;
  // the best kTopkMaxK enter one NMS with the boxes of different classes moved apart (batched_nms's offsets); the
  // first D kept are the detections.
  Tensor scores = ops::reshape(ops::softmax(ops::to(class_logits, DType::f32), 1), {N, P, C});
  scores = ops::contiguous(ops::slice(scores, 2, 1, C));  // [N, P, C - 1]
  Tensor codes = ops::slice(ops::reshape(ops::to(box_regression, DType::f32), {N, P, C, 4}), 2, 1, C);
  Tensor reference = ops::broadcast_to(ops::reshape(proposals.boxes, {N, P, 1, 4}), {N, P, C - 1, 4});
  ops::BoxCoderParams coder;
  coder.wx = coder.wy = 10, coder.ww = coder.wh = 5;
  const int64_t K = P * (C - 1);
  Tensor boxes = ops::box_decode(ops::reshape(ops::contiguous(codes), {N, K, 4}),
                                 ops::reshape(ops::contiguous(reference), {N, K, 4}), coder, batch.at("image_hw"));
  Tensor w = ops::sub(ops::slice(boxes, 2, 2, 3), ops::slice(boxes, 2, 0, 1));
  Tensor h = ops::sub(ops::slice(boxes, 2, 3, 4), ops::slice(boxes, 2, 1, 2));
  Tensor large = ops::mul(ops::to(ops::compare(ops::CompareOp::ge, w, 1e-2), DType::f32),
                          ops::to(ops::compare(ops::CompareOp::ge, h, 1e-2), DType::f32));  // remove_small_boxes
  Tensor from_proposal =
      ops::broadcast_to(ops::reshape(ops::to(proposals.valid, DType::f32), {N, P, 1}), {N, P, C - 1});
  Tensor flat_scores = ops::reshape(scores, {N, K});
  Tensor ok = ops::mul(ops::mul(ops::to(ops::compare(ops::CompareOp::gt, flat_scores, c.score_threshold), DType::f32),
                                ops::reshape(large, {N, K})),
                       ops::reshape(ops::contiguous(from_proposal), {N, K}));
  // Invalid candidates score -2: below every valid one, so the top-k takes the valid ones first.
  Tensor ranked = ops::add(ops::mul(ops::add(flat_scores, 2.0), ok), -2.0);
  ops::TopK top = ops::topk(ranked, std::min(K, ops::kTopkMaxK));
  Tensor top_boxes = ops::gather_rows(boxes, top.indices);
  Tensor label_of = ops::contiguous(ops::broadcast_to(
      ops::reshape(ops::add(ops::arange(C - 1, DType::f32, images.device_ptr()), 1.0), {1, 1, C - 1}), {N, P, C - 1}));
  Tensor top_labels = ops::gather(ops::reshape(label_of, {N, K}), 1, top.indices);  // f32 class ids
  const double offset = double(std::max(images.size(1), images.size(2))) + 1;
  Tensor shifted = ops::add(top_boxes, ops::mul(ops::reshape(top_labels, {N, top.indices.size(1), 1}), offset));
  Tensor keep = ops::nms(ops::contiguous(shifted), ops::compare(ops::CompareOp::ge, top.values, 0.0), c.detection_nms,
                         D);  // [N, D], -1 padding
  Tensor kept = ops::compare(ops::CompareOp::ge, ops::to(keep, DType::f32), 0.0);
  Tensor index = ops::index_or_zero(keep);
  Detections d;
  Tensor kept_f = ops::to(kept, DType::f32);
  d.boxes = ops::mul(ops::gather_rows(top_boxes, index), ops::reshape(kept_f, {N, D, 1}));
  d.scores = ops::add(ops::mul(ops::add(ops::gather(top.values, 1, index), 1.0), kept_f), -1.0);
  Tensor labels_f = ops::mul(ops::gather(top_labels, 1, index), kept_f);
  d.labels = ops::to(labels_f, DType::i64);
  // The mask head on the detections: each one's own class's probabilities.
  const int64_t M = c.mask_size();
  Tensor logits = net_->mask_head(net_->pool(levels, ops::contiguous(d.boxes), kept, Pooler::mask));  // [N D, M, M, C]
  Tensor cls = ops::contiguous(
      ops::broadcast_to(ops::reshape(ops::index_or_zero(labels_f), {N * D, 1, 1, 1}), {N * D, M, M, 1}));
  d.masks = ops::reshape(ops::sigmoid(ops::to(ops::gather(logits, 3, cls), DType::f32)), {N, D, M, M});
  return d;
}

StepResult MaskRcnn::train_step(int64_t step) {
  StepResult r = Model::train_step(step);
  report_parts(r);
  return r;
}

StepResult MaskRcnn::eval_step(int64_t step) {
  if (!config_.inference) {
    StepResult r = Model::eval_step(step);
    report_parts(r);
    return r;
  }
  net_->eval();
  graph::NoGrad no_grad;
  engine::PhaseScope phase(engine::Phase::forward);
  Batch batch = input_batch(step);
  Detections d = detect(batch);
  StepResult r;
  r.has_loss = false;
  r.items = batch.at("images").size(0);
  if (!d.scores.is_meta()) {
    int64_t found = 0;
    for (double v : d.scores.to_double()) found += v >= 0;
    r.details.push_back(engine::str("detections: ", found, " of ", d.scores.numel(), " slots (score > ",
                                    config_.score_threshold, ", NMS ", config_.detection_nms, ")"));
  }
  return r;
}

void MaskRcnn::report_parts(StepResult& r) {
  const bool empty = parts_.empty();
  if (take_losses(parts_, r) && !empty)
    r.details.push_back(engine::str("losses: rpn objectness ", r.losses["rpn_objectness"], " | rpn box ",
                                    r.losses["rpn_box"], " | classifier ", r.losses["classifier"], " | box ",
                                    r.losses["box"], " | mask ", r.losses["mask"]));
}

}  // namespace models::vision
