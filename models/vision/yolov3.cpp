// vision/yolov3.cpp: the YOLOv3 heads, the network, its synthetic data and darknet's loss.
#include "models/vision/yolov3.h"

#include <cmath>
#include <random>

#include "engine/error.h"
#include "graph/autograd.h"
#include "models/data/detection.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/reduce.h"
#include "ops/resample.h"
#include "ops/shape.h"
#include "ops/synthetic.h"
#include "ops/view.h"

namespace models::vision {

YoloV3Config YoloV3Config::from(const ModelConfig& c) {
  YoloV3Config y;
  const std::string size = c.size.empty() ? "coco" : c.size;
  if (size == "tiny") {
    y.backbone.blocks = {1, 1, 1, 1, 1};
    y.backbone.width = 4;
    y.classes = 3;
    y.image_size = 64;
    y.batch = 4;
    y.lr = 1e-2;    // a few steps must show learning
    y.burn_in = 0;  // ... so no burn-in
    for (auto& a : y.anchors) a = {a[0] * 64.0 / 608.0, a[1] * 64.0 / 608.0};  // the same shapes relative to the image
  } else {
    ENGINE_CHECK(size == "coco", "yolov3: unknown --size '", size, "': expected coco or tiny");
  }
  ENGINE_CHECK(c.recompute == "none" || c.recompute == "layer", "yolov3: --recompute ", c.recompute,
               " does not apply (no attention): none, or layer (each Darknet residual block recomputed in backward)");
  y.backbone.recompute_blocks = c.recompute == "layer";
  y.data = c.data;  // a COCO-style set: its category count must equal classes (checked when it is opened)
  if (c.batch) y.batch = c.batch;
  y.seed = c.seed;
  return y;
}

// ---------------------------------------------------------------------------------------------------
YoloHead::YoloHead(int64_t in, int64_t mid, int64_t out) {
  for (int64_t k = 0; k < 6; k++) {
    const bool pointwise = k % 2 == 0 && k < 5;  // 1x1 m, 3x3 2m, 1x1 m, 3x3 2m, 1x1 m, 3x3 2m
    const int64_t cin = k == 0 ? in : (k % 2 == 1 ? mid : 2 * mid);
    convs.push_back(register_module("convs." + std::to_string(k),
                                    std::make_shared<ConvBnLeaky>(cin, pointwise ? mid : 2 * mid, pointwise ? 1 : 3)));
  }
  Conv2dOptions o;
  o.in = 2 * mid, o.out = out, o.kernel = 1, o.bias = true;
  output = register_module("output", std::make_shared<Conv2d>(o));
}

YoloHead::Output YoloHead::forward(const Tensor& x) const {
  auto s = scope();
  Tensor y = x;
  for (size_t k = 0; k < 5; k++) y = convs[k]->forward(y);
  return {y, output->forward(convs[5]->forward(y))};
}

YoloV3Net::YoloV3Net(const YoloV3Config& c) : config(c) {
  backbone = register_module("backbone", std::make_shared<Darknet53>(c.backbone));
  const auto features = c.backbone.out_channels();  // strides 8, 16, 32
  int64_t in = features[2], mid = features[2] / 2;
  for (size_t k = 0; k < 3; k++) {
    heads[k] = register_module("heads." + std::to_string(k), std::make_shared<YoloHead>(in, mid, c.head_channels()));
    if (k == 2) break;
    laterals[k] = register_module("laterals." + std::to_string(k), std::make_shared<ConvBnLeaky>(mid, mid / 2, 1));
    in = mid / 2 + features[1 - k];
    mid /= 2;
  }
}

std::array<Tensor, 3> YoloV3Net::forward(const Tensor& images) const {
  std::array<Tensor, 3> features = backbone->forward(images);  // strides 8, 16, 32
  std::array<Tensor, 3> preds;
  Tensor x = features[2];
  for (size_t k = 0; k < 3; k++) {
    YoloHead::Output h = heads[k]->forward(x);
    preds[k] = h.pred;
    if (k == 2) break;
    Tensor up = laterals[k]->forward(h.branch);                     // [N, h, w, mid/2]
    engine::MemoryScope s("upsample." + std::to_string(k));         // darknet's [upsample] and [route]
    up = ops::upsample_nearest2d(up, 2 * up.size(1), 2 * up.size(2));  // [N, 2h, 2w, mid/2]
    x = ops::concat({up, features[1 - k]}, 3);                      // [N, 2h, 2w, mid/2 + finer]
    features[1 - k] = Tensor();
  }
  return preds;
}

// ---------------------------------------------------------------------------------------------------
namespace {
constexpr int64_t kMaxRectangles = 4;  // per image: 1 to 4 (at most max_boxes)
}  // namespace

DetectionScenes synthetic_detection_scenes(int64_t batch, int64_t size, int64_t classes, int64_t max_boxes,
                                           uint64_t seed, int64_t step) {
  std::mt19937_64 rng(seed * 1000003ull + uint64_t(step) * 7919ull + 29);
  DetectionScenes d;
  d.rectangles.assign(size_t(batch * kMaxRectangles * 5), -1);  // [N, 4, 5]; class -1: empty slot
  d.boxes.assign(size_t(batch * max_boxes * 4), 0.f);           // [N, max_boxes, 4]
  d.labels.assign(size_t(batch * max_boxes), -1);               // [N, max_boxes]
  for (int64_t n = 0; n < batch; n++) {
    const int64_t count = std::min<int64_t>(max_boxes, 1 + int64_t(rng() % 4));
    for (int64_t r = 0; r < count; r++) {
      const int64_t cls = int64_t(rng() % uint64_t(classes));
      const int64_t lo = std::max<int64_t>(2, size / 8), span = size / 2 - lo + 1;
      const int64_t h = lo + int64_t(rng() % uint64_t(span)), w = lo + int64_t(rng() % uint64_t(span));
      const int64_t top = int64_t(rng() % uint64_t(size - h + 1)), left = int64_t(rng() % uint64_t(size - w + 1));
      int64_t* row = d.rectangles.data() + (n * kMaxRectangles + r) * 5;
      row[0] = cls + 1, row[1] = top, row[2] = left, row[3] = h, row[4] = w;  // palette row cls + 1
      float* box = d.boxes.data() + (n * max_boxes + r) * 4;
      box[0] = float(left + w / 2.0) / float(size), box[1] = float(top + h / 2.0) / float(size);
      box[2] = float(w) / float(size), box[3] = float(h) / float(size);
      d.labels[size_t(n * max_boxes + r)] = cls;
    }
  }
  return d;
}

DetectionBatch synthetic_detection(int64_t batch, int64_t size, int64_t classes, int64_t max_boxes, uint64_t seed,
                                   int64_t step, engine::DType dtype, std::shared_ptr<engine::Device> device) {
  // Each class has a fixed colour (the same for every seed and step), so the task is learnable; row 0 is the
  // background, black (0).
  std::vector<float> palette(size_t((classes + 1) * 3), 0.f);  // [classes + 1, 3]
  {
    std::mt19937_64 colours(0xB0C5EEDull);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (size_t i = 3; i < palette.size(); i++) palette[i] = u(colours);
  }
  if (!device) device = engine::default_device();
  const DetectionScenes d = synthetic_detection_scenes(batch, size, classes, max_boxes, seed, step);
  ops::PaintOptions o;
  o.height = o.width = size, o.dtype = dtype, o.noise = 0.2;
  o.seed = seed, o.step = step;
  Tensor scenes = ops::from_vector(d.rectangles, {batch, kMaxRectangles, 5}, engine::DType::i64, device);
  Tensor colours = ops::from_vector(palette, {classes + 1, 3}, engine::DType::f32, device);
  DetectionBatch b;
  b.images = ops::paint_rectangles(scenes, colours, o).images;  // [N, S, S, 3]
  b.boxes = ops::from_vector(d.boxes, {batch, max_boxes, 4}, engine::DType::f32, device);
  b.labels = ops::from_vector(d.labels, {batch, max_boxes}, engine::DType::i64, device);
  return b;
}

// ---------------------------------------------------------------------------------------------------
YoloV3::YoloV3(const ModelConfig& c) : config_(YoloV3Config::from(c)) { build(); }
YoloV3::YoloV3(const YoloV3Config& c) : config_(c) { build(); }

void YoloV3::build() {
  ENGINE_CHECK(config_.image_size % 32 == 0, "yolov3: image size ", config_.image_size,
               " must be a multiple of 32 (the coarsest scale's stride)");
  // --data: opened and checked now (on meta too), before anything is allocated.
  if (!config_.data.empty())
    reader_ = data::DetectionSet::open_shared(config_.data, config_.classes, config_.max_boxes);
  engine::manual_seed(config_.seed);
  net_ = std::make_shared<YoloV3Net>(config_);
  net_->tag_memory();
  ops::SgdOptions o;
  o.lr = config_.lr;
  o.momentum = config_.momentum;
  o.weight_decay = config_.weight_decay;
  optimizer_ = std::make_unique<ops::Sgd>(net_->named_parameters(), o);
  schedule_ = std::make_unique<ops::DarknetSteps>(config_.lr, config_.burn_in, config_.burn_in_power, config_.lr_steps,
                                                  config_.lr_scales);
}

std::string YoloV3::summary() const {
  const auto& c = config_;
  const auto& b = c.backbone.blocks;
  return engine::str("yolov3: Darknet-53 (blocks ", b[0], "/", b[1], "/", b[2], "/", b[3], "/", b[4], ", width ",
                     c.backbone.width, ") + 3 YOLO scales (strides 32/16/8, ", c.anchors_per_scale(),
                     " anchors each), ", c.classes, " classes, ", c.image_size, "x", c.image_size, ", batch ", c.batch,
                     ", ", c.max_boxes, " box slots per image",
                     c.backbone.recompute_blocks ? ", residual blocks recomputed in backward" : "",
                     reader_ ? " | data: " + reader_->describe() : std::string());
}

ops::YoloTargetParams YoloV3::target_params(int64_t scale) const {
  ops::YoloTargetParams p;
  p.anchors = config_.anchors;
  p.mask = config_.masks[size_t(scale)];
  p.image_w = p.image_h = config_.image_size;
  p.ignore_thresh = config_.ignore_thresh;
  return p;
}

Batch YoloV3::make_batch(int64_t step) {
  const auto& c = config_;
  auto dev = engine::default_device();
  if (reader_) {
    // Decoded and letterboxed on the host; on meta nothing is decoded: zeros of the same shapes.
    data::DetectionData b =
        dev->type() == engine::DeviceType::meta
            ? data::DetectionData{std::vector<float>(size_t(c.batch * c.image_size * c.image_size * 3)),
                                  std::vector<float>(size_t(c.batch * c.max_boxes * 4)),
                                  std::vector<int64_t>(size_t(c.batch * c.max_boxes))}
            : reader_->batch(c.batch, c.image_size, c.seed, step);
    return {{"images", ops::from_vector(b.images, {c.batch, c.image_size, c.image_size, 3}, compute_dtype(), dev)},
            {"boxes", ops::from_vector(b.boxes, {c.batch, c.max_boxes, 4}, engine::DType::f32, dev)},
            {"labels", ops::from_vector(b.labels, {c.batch, c.max_boxes}, engine::DType::i64, dev)}};
  }
  // Images painted on the device from a scene table of a few rectangles per image (meta allocates, paints
  // nothing); boxes and labels are the same rectangles, uploaded.
  DetectionBatch b =
      synthetic_detection(c.batch, c.image_size, c.classes, c.max_boxes, c.seed, step, compute_dtype(), dev);
  return {{"images", b.images}, {"boxes", b.boxes}, {"labels", b.labels}};
}

Tensor YoloV3::loss(const Batch& batch) {
  std::array<Tensor, 3> preds = net_->forward(batch.at("images"));
  return detection_loss(preds, batch.at("boxes"), batch.at("labels"));
}

Tensor YoloV3::detection_loss(const std::array<Tensor, 3>& preds, const Tensor& boxes, const Tensor& labels) {
  engine::MemoryScope s("loss");
  const int64_t N = preds[0].size(0), A = config_.anchors_per_scale(), D = 5 + config_.classes;
  // The weighted sum of a pointwise loss (Reduction::none) over a group of columns.
  auto part = [](const Tensor& loss_none, const Tensor& weight) { return ops::sum(ops::mul(loss_none, weight)); };
  Tensor box, object, cls;
  auto accumulate = [](Tensor& total, const Tensor& t) { total = total.defined() ? ops::add(total, t) : t; };
  for (int64_t k = 0; k < 3; k++) {
    engine::MemoryScope scale("scale" + std::to_string(k));
    const Tensor& pred = preds[size_t(k)];
    Tensor p = ops::reshape(pred, {N, pred.size(1), pred.size(2), A, D});  // [N, h, w, A, 5 + C]
    ops::YoloTargets t = ops::yolo_targets(p, boxes, labels, target_params(k));
    // Columns: 0-1 centre offsets (BCE), 2-3 log sizes (half squared error), 4 objectness, 5.. classes (BCE);
    // each term weighted by yolo_targets' weight (0 where nothing is learned).
    auto cols = [](const Tensor& x, int64_t lo, int64_t hi) { return ops::slice(x, 4, lo, hi); };
    const auto none = ops::Reduction::none;
    Tensor xy = part(ops::bce_with_logits(cols(p, 0, 2), cols(t.target, 0, 2), Tensor(), none), cols(t.weight, 0, 2));
    Tensor wh = part(ops::mse_loss(cols(p, 2, 4), cols(t.target, 2, 4), none), cols(t.weight, 2, 4));
    accumulate(box, ops::add(xy, ops::mul(wh, 0.5)));
    accumulate(object,
               part(ops::bce_with_logits(cols(p, 4, 5), cols(t.target, 4, 5), Tensor(), none), cols(t.weight, 4, 5)));
    accumulate(cls,
               part(ops::bce_with_logits(cols(p, 5, D), cols(t.target, 5, D), Tensor(), none), cols(t.weight, 5, D)));
  }
  const double per_image = 1.0 / double(N);
  {
    graph::NoGrad no_grad;  // reporting only
    parts_ = {{"box", ops::mul(box, per_image).detach()}, {"object", ops::mul(object, per_image).detach()},
              {"class", ops::mul(cls, per_image).detach()}};
  }
  return ops::mul(ops::add(ops::add(box, object), cls), per_image);
}

StepResult YoloV3::train_step(int64_t step) {
  StepResult r = Model::train_step(step);
  report_parts(r);
  return r;
}

StepResult YoloV3::eval_step(int64_t step) {
  StepResult r = Model::eval_step(step);
  report_parts(r);
  return r;
}

void YoloV3::report_parts(StepResult& r) {
  if (take_losses(parts_, r))
    r.details.push_back(engine::str("loss per image: box ", r.losses["box"], " | object ", r.losses["object"],
                                    " | class ", r.losses["class"]));
}

}  // namespace models::vision
