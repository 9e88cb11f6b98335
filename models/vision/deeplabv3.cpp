// vision/deeplabv3.cpp: the ASPP head, the network, its synthetic data and the training recipe.
#include "models/vision/deeplabv3.h"

#include <random>

#include "engine/error.h"
#include "graph/autograd.h"
#include "models/data/segmentation.h"
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

DeepLabV3Config DeepLabV3Config::from(const ModelConfig& c) {
  DeepLabV3Config d;
  const std::string size = c.size.empty() ? "voc" : c.size;
  if (size == "tiny") {
    d.backbone.blocks = {1, 1, 1, 1};
    d.backbone.width = 8;
    d.classes = 5;
    d.aspp_channels = 16;
    d.aspp_rates = {1, 2, 3};  // the features are 4 x 4
    d.dropout = 0.1;
    d.image_size = 64;
    d.batch = 4;
    d.lr = 0.05;
  } else if (size == "torchvision") {
    // torchvision's deeplabv3_resnet101 exactly (for parity runs): output stride 8 with its dilation pattern,
    // no multi-grid, ASPP rates 12/24/36. Same parameters as voc.
    d.backbone.output_stride = 8;
    d.backbone.torchvision_dilation = true;
    d.backbone.multi_grid = {1};
    d.aspp_rates = {12, 24, 36};
    d.dropout = 0.0;  // parity with a train-mode torchvision model whose dropout p is set to 0
  } else {
    ENGINE_CHECK(size == "voc", "deeplabv3: unknown --size '", size, "': expected voc, torchvision or tiny");
  }
  ENGINE_CHECK(c.recompute == "none" || c.recompute == "layer", "deeplabv3: --recompute ", c.recompute,
               " does not apply (no attention): none, or layer (each ResNet bottleneck recomputed in backward)");
  d.backbone.recompute_blocks = c.recompute == "layer";
  d.data = c.data;  // a VOC-style set: the classes stay the size's (VOC label maps do not say how many)
  if (c.batch) d.batch = c.batch;
  d.seed = c.seed;
  return d;
}

// ---------------------------------------------------------------------------------------------------
namespace {
std::shared_ptr<Conv2d> head_conv(int64_t in, int64_t out, int64_t kernel, int64_t dilation, bool bias = false) {
  Conv2dOptions o;
  o.in = in, o.out = out, o.kernel = kernel, o.dilation = dilation;
  o.padding = dilation * (kernel - 1) / 2;
  o.bias = bias;
  return std::make_shared<Conv2d>(o);  // PyTorch's default initialization, as torchvision's head
}
}  // namespace

Aspp::Aspp(int64_t in, int64_t channels, const std::vector<int64_t>& rates, double dropout_) : dropout(dropout_) {
  const int64_t branches = int64_t(rates.size()) + 2;
  // convs.0: 1x1; convs.1..R: 3x3 atrous at each rate (Sequential(conv, bn, relu)).
  for (int64_t b = 0; b <= int64_t(rates.size()); b++) {
    const std::string name = "convs." + std::to_string(b);
    convs.push_back(register_module(
        name + ".0", b == 0 ? head_conv(in, channels, 1, 1) : head_conv(in, channels, 3, rates[size_t(b - 1)])));
    bns.push_back(register_module(name + ".1", std::make_shared<BatchNorm2d>(channels)));
  }
  // convs.R+1: image pooling, Sequential(AdaptiveAvgPool2d, conv, bn, relu): its conv is ".1".
  const std::string pooling = "convs." + std::to_string(rates.size() + 1);
  convs.push_back(register_module(pooling + ".1", head_conv(in, channels, 1, 1)));
  bns.push_back(register_module(pooling + ".2", std::make_shared<BatchNorm2d>(channels)));
  project = register_module("project.0", head_conv(branches * channels, channels, 1, 1));
  project_bn = register_module("project.1", std::make_shared<BatchNorm2d>(channels));
}

Tensor Aspp::forward(const Tensor& x) const {
  auto s = scope();
  const int64_t h = x.size(1), w = x.size(2);
  const ops::NormActivation relu = ops::NormActivation::relu();
  std::vector<Tensor> branches;  // each [N, h, w, channels]
  for (size_t b = 0; b + 1 < convs.size(); b++) branches.push_back(bns[b]->forward(convs[b]->forward(x), relu));
  {
    engine::MemoryScope pooling("convs." + std::to_string(convs.size() - 1));
    Tensor pooled = ops::global_avg_pool2d(x);                                        // [N, 1, 1, in]
    pooled = bns.back()->forward(convs.back()->forward(pooled), relu);               // [N, 1, 1, channels]
    branches.push_back(ops::upsample_bilinear2d(pooled, h, w, /*align_corners=*/false));
  }
  Tensor y = ops::concat(branches, 3);  // [N, h, w, branches * channels]
  branches.clear();
  y = project_bn->forward(project->forward(y), relu);
  return ops::dropout(y, dropout, training());
}

DeepLabV3Net::DeepLabV3Net(const DeepLabV3Config& c) : config(c) {
  backbone = register_module("backbone", std::make_shared<ResNet>(c.backbone));
  const int64_t ch = c.aspp_channels;
  aspp =
      register_module("classifier.0", std::make_shared<Aspp>(c.backbone.out_channels(), ch, c.aspp_rates, c.dropout));
  head_conv = register_module("classifier.1", vision::head_conv(ch, ch, 3, 1));
  head_bn = register_module("classifier.2", std::make_shared<BatchNorm2d>(ch));
  classifier = register_module("classifier.4", vision::head_conv(ch, c.classes, 1, 1, /*bias=*/true));
}

Tensor DeepLabV3Net::forward(const Tensor& images) const {
  const int64_t H = images.size(1), W = images.size(2);
  Tensor features = backbone->forward(images);  // [N, H/16, W/16, 2048]
  Tensor y = aspp->forward(features);          // [N, H/16, W/16, 256]
  features = Tensor();
  y = head_bn->forward(head_conv->forward(y), ops::NormActivation::relu());
  y = classifier->forward(y);                  // [N, H/16, W/16, classes]
  engine::MemoryScope s("upsample");
  return ops::upsample_bilinear2d(y, H, W, /*align_corners=*/false);  // [N, H, W, classes]
}

// ---------------------------------------------------------------------------------------------------
namespace {
constexpr int64_t kMaxRectangles = 3;  // per image: 1 to 3
}  // namespace

std::vector<int64_t> synthetic_segmentation_scenes(int64_t batch, int64_t size, int64_t classes, uint64_t seed,
                                                   int64_t step) {
  std::mt19937_64 rng(seed * 1000003ull + uint64_t(step) * 7919ull + 17);
  std::vector<int64_t> scenes(size_t(batch * kMaxRectangles * 5), -1);  // [N, 3, 5]; class -1: empty slot
  for (int64_t n = 0; n < batch; n++) {
    // 1 to 3 rectangles of a random foreground class; their one-pixel border is ignored (VOC's 255 outlines).
    const int64_t rects = 1 + int64_t(rng() % 3);
    for (int64_t r = 0; r < rects && classes > 1; r++) {
      const int64_t cls = 1 + int64_t(rng() % uint64_t(classes - 1));
      const int64_t h = size / 4 + int64_t(rng() % uint64_t(size / 4 + 1)),
                    w = size / 4 + int64_t(rng() % uint64_t(size / 4 + 1));
      const int64_t top = int64_t(rng() % uint64_t(size - h + 1)), left = int64_t(rng() % uint64_t(size - w + 1));
      int64_t* row = scenes.data() + (n * kMaxRectangles + r) * 5;
      row[0] = cls, row[1] = top, row[2] = left, row[3] = h, row[4] = w;
    }
  }
  return scenes;
}

ops::PaintedImages synthetic_segmentation(int64_t batch, int64_t size, int64_t classes, int64_t ignore_index,
                                          uint64_t seed, int64_t step, engine::DType dtype,
                                          std::shared_ptr<engine::Device> device) {
  // Each class has a fixed colour (the same for every seed and step), so the task is learnable; class 0
  // (row 0) is the background, which is also what a rectangle's ignored border looks like.
  std::vector<float> palette(size_t(classes * 3));  // [classes, 3]
  {
    std::mt19937_64 colours(0xC0105EEDull);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (float& v : palette) v = u(colours);
  }
  if (!device) device = engine::default_device();
  ops::PaintOptions o;
  o.height = o.width = size, o.dtype = dtype, o.noise = 0.2;
  o.seed = seed, o.step = step;
  o.labels = true, o.borders = true, o.border_label = ignore_index;
  Tensor scenes = ops::from_vector(synthetic_segmentation_scenes(batch, size, classes, seed, step),
                                   {batch, kMaxRectangles, 5}, engine::DType::i64, device);  // [N, 3, 5]
  Tensor colours = ops::from_vector(palette, {classes, 3}, engine::DType::f32, device);   // [classes, 3]
  return ops::paint_rectangles(scenes, colours, o);
}

// ---------------------------------------------------------------------------------------------------
DeepLabV3::DeepLabV3(const ModelConfig& c) : config_(DeepLabV3Config::from(c)) { build(); }
DeepLabV3::DeepLabV3(const DeepLabV3Config& c) : config_(c) { build(); }

void DeepLabV3::build() {
  // --data: opened and checked now (on meta too), before anything is allocated.
  if (!config_.data.empty())
    reader_ = std::make_shared<data::SegmentationSet>(config_.data, config_.classes, config_.ignore_index);
  engine::manual_seed(config_.seed);
  net_ = std::make_shared<DeepLabV3Net>(config_);
  net_->tag_memory();
  ops::SgdOptions o;
  o.lr = config_.lr;
  o.momentum = config_.momentum;
  o.weight_decay = config_.weight_decay;
  optimizer_ = std::make_unique<ops::Sgd>(net_->named_parameters(), o);
  schedule_ = std::make_unique<ops::PolyLr>(config_.lr, config_.max_steps, 0.9);
}

std::string DeepLabV3::summary() const {
  const auto& c = config_;
  const auto& b = c.backbone;
  std::string rates, grid;
  for (int64_t r : c.aspp_rates) rates += (rates.empty() ? "" : "/") + std::to_string(r);
  for (int64_t g : b.multi_grid) grid += (grid.empty() ? "" : "/") + std::to_string(g);
  return engine::str("deeplabv3: ResNet (blocks ", b.blocks[0], "/", b.blocks[1], "/", b.blocks[2], "/", b.blocks[3],
                     ", width ", b.width, ") output stride ", b.output_stride, ", multi-grid ", grid, ", ASPP ",
                     c.aspp_channels, " (rates ", rates, " + image pooling), ", c.classes, " classes, ",
                     c.image_size, "x", c.image_size, ", batch ", c.batch,
                     b.recompute_blocks ? ", bottlenecks recomputed in backward" : "",
                     reader_ ? " | data: " + reader_->describe() : std::string());
}

std::vector<std::string> DeepLabV3::load_weights(const std::map<std::string, Tensor>& tensors) {
  return load_torch_weights(*net_, tensors);
}

Batch DeepLabV3::make_batch(int64_t step) {
  const auto& c = config_;
  auto dev = engine::default_device();
  if (reader_) {
    // Decoded and transformed on the host; on meta nothing is decoded: zeros of the same shapes.
    const int64_t pixels = c.batch * c.image_size * c.image_size;
    data::SegmentationData b = dev->type() == engine::DeviceType::meta
                                   ? data::SegmentationData{std::vector<float>(size_t(pixels * 3)),
                                                            std::vector<int64_t>(size_t(pixels))}
                                   : reader_->batch(c.batch, c.image_size, c.seed, step);
    return {{"images", ops::from_vector(b.images, {c.batch, c.image_size, c.image_size, 3}, compute_dtype(), dev)},
            {"labels", ops::from_vector(b.labels, {pixels}, engine::DType::i64, dev)}};
  }
  // Painted on the device from a scene table of a few rectangles per image (meta allocates, paints nothing).
  ops::PaintedImages b =
      synthetic_segmentation(c.batch, c.image_size, c.classes, c.ignore_index, c.seed, step, compute_dtype(), dev);
  return {{"images", b.images}, {"labels", b.labels}};
}

Tensor DeepLabV3::loss(const Batch& batch) {
  Tensor logits = net_->forward(batch.at("images"));  // [N, H, W, classes]
  engine::MemoryScope s("loss");
  return ops::cross_entropy(ops::reshape(logits, {-1, config_.classes}), batch.at("labels"), config_.ignore_index);
}

}  // namespace models::vision
