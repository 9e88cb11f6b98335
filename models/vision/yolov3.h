// vision/yolov3.h: YOLOv3 (Redmon & Farhadi 2018, arXiv 1804.02767) for MSCOCO detection at 608 x 608, shaped
// as pjreddie/darknet cfg/yolov3.cfg, with darknet's loss (src/yolo_layer.c).
//
//   backbone   Darknet-53 (darknet.h): features at strides 8, 16, 32 (256, 512, 1024 channels)
//   head k     (k = 0, 1, 2 at strides 32, 16, 8; m = 512, 256, 128): ConvBnLeaky 1x1 m, 3x3 2m, 1x1 m, 3x3 2m,
//              1x1 m (the branch), 3x3 2m, then a 1x1 convolution with bias, no BN, linear, to A (5 + C)
//              channels: 3 x 85 = 255 for COCO. Output NHWC [N, S/32, S/32, 255], [N, S/16, ..], [N, S/8, ..]:
//              19, 38, 76 at 608.
//   lateral k  (k = 0, 1) ConvBnLeaky 1x1 m -> m/2 on head k's branch, nearest upsampling x2, concatenated
//              (channels last) with the backbone's next-finer feature: head 1 sees 256 + 512 = 768 channels,
//              head 2 128 + 256 = 384 (darknet's [route] -1, 61 and -1, 36)
//   anchors    darknet's 9 (pixels at 608): 10,13 16,30 33,23 | 30,61 62,45 59,119 | 116,90 156,198 373,326;
//              head 0 predicts anchors 6-8, head 1 3-5, head 2 0-2 (cfg `mask`)
//   loss       darknet's yolo_layer.c, per scale, over an image's fixed 100 ground-truth slots (ops/yolo.h
//              assigns the targets on the device): with s = 2 - w h of the truth (image fractions),
//                x, y     s * BCE-with-logits(tx, the centre's offset in its cell): darknet's delta
//                         s (t - sigmoid(tx)) is that loss's gradient with respect to the logit
//                w, h     s * 0.5 (tw - log(w / anchor_w))^2 (delta s (t - tw))
//                object   BCE-with-logits: 1 on assigned anchors, 0 elsewhere, ignored (weight 0) where the
//                         predicted box overlaps a truth with IoU > ignore_thresh (0.5 here as in
//                         eriklindernoren/PyTorch-YOLOv3; yolov3.cfg says 0.7: a config field)
//                classes  BCE-with-logits on each class at assigned anchors (independent logistic classifiers)
//              summed over every element and scale and divided by the batch size (darknet sums the deltas
//              over the batch and divides the learning rate by it).
//   training   SGD momentum 0.9, weight decay 5e-4, lr 1e-3 with darknet's burn-in (x (b/1000)^4 over the
//              first 1000 updates) and steps (x 0.1 at 400k and 450k) as yolov3.cfg (ops::DarknetSteps; tiny:
//              no burn-in). Batch norm in training mode.
//   data       seeded synthetic images (NHWC, 3 channels) with 1 to 4 rectangles of a class's colour (+ noise)
//              whose boxes are the ground truth; --size coco (608 x 608, 80 classes, batch 8) or tiny (the
//              tests': 64 x 64, 3 classes, Darknet width 4 with one residual per stage). --data DIR: a
//              COCO-style set instead (models/data/detection.h: instances JSON whose category count must equal
//              the classes, letterboxed to S x S with a random flip, ImageNet-normalized pixels); opened and
//              checked when the model is built, decoded per step on the host (nothing is decoded on meta).
// Parameters (coco): 61,949,149 (Darknet-53 40,584,928 + heads) = ultralytics/yolov3's and Keras-YOLOv3's count.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/vision/darknet.h"
#include "ops/yolo.h"

namespace models::data {
class DetectionSet;
}

namespace models::vision {

struct YoloV3Config {
  DarknetConfig backbone;
  int64_t classes = 80;
  std::vector<std::array<double, 2>> anchors = {{10, 13},  {16, 30},  {33, 23},  {30, 61},  {62, 45},
                                                {59, 119}, {116, 90}, {156, 198}, {373, 326}};
  std::array<std::vector<int64_t>, 3> masks = {{{6, 7, 8}, {3, 4, 5}, {0, 1, 2}}};  // head 0 (stride 32) first
  int64_t image_size = 608, batch = 8;
  int64_t max_boxes = 100;  // ground-truth slots per image (padded with label -1)
  double ignore_thresh = 0.5;
  double lr = 1e-3, momentum = 0.9, weight_decay = 5e-4;
  // yolov3.cfg's schedule (ops::DarknetSteps): lr x (b / burn_in)^4 for darknet's first 1000 updates, then x 0.1
  // at updates 400000 and 450000.
  int64_t burn_in = 1000;
  double burn_in_power = 4;
  std::vector<int64_t> lr_steps = {400000, 450000};
  std::vector<double> lr_scales = {0.1, 0.1};
  uint64_t seed = 1;
  std::string data;  // --data: a COCO-style directory; empty: synthetic images
  int64_t anchors_per_scale() const { return int64_t(masks[0].size()); }
  int64_t head_channels() const { return anchors_per_scale() * (5 + classes); }
  // coco (default) | tiny, then the ModelConfig fields (--batch, --data).
  static YoloV3Config from(const ModelConfig& c);
};

// One detection head: five alternating 1x1/3x3 ConvBnLeaky (the branch), a 3x3, and the 1x1 output conv.
class YoloHead : public graph::Module {
 public:
  YoloHead(int64_t in, int64_t mid, int64_t out);
  struct Output {
    Tensor branch;  // [N, h, w, mid] what the next scale's lateral reads
    Tensor pred;    // [N, h, w, out] raw predictions
  };
  Output forward(const Tensor& x) const;
  std::vector<std::shared_ptr<ConvBnLeaky>> convs;  // convs.0 ... convs.5
  std::shared_ptr<Conv2d> output;                  // with bias, no BN
};

class YoloV3Net : public graph::Module {
 public:
  explicit YoloV3Net(const YoloV3Config& c);
  // [N, S, S, 3] -> raw predictions [N, S/32, S/32, A(5+C)], [N, S/16, ...], [N, S/8, ...]
  std::array<Tensor, 3> forward(const Tensor& images) const;
  YoloV3Config config;
  std::shared_ptr<Darknet53> backbone;
  std::array<std::shared_ptr<YoloHead>, 3> heads;
  std::array<std::shared_ptr<ConvBnLeaky>, 2> laterals;
};

// Seeded synthetic detection data; the same (seed, step) gives the same batch on every device. The host
// draws each image's 1 to 4 rectangles: DetectionScenes holds them as ops::paint_rectangles rows
// (i64 [N, 4, 5], class + 1 as the palette row since row 0 is the background, class -1 in empty slots)
// and as the ground truth they are: boxes [N, max_boxes, 4] (cx, cy, w, h as image fractions; 0 in padded
// slots), labels [N, max_boxes] (class, or -1 in padded slots).
struct DetectionScenes {
  std::vector<int64_t> rectangles;
  std::vector<float> boxes;
  std::vector<int64_t> labels;
};
DetectionScenes synthetic_detection_scenes(int64_t batch, int64_t size, int64_t classes, int64_t max_boxes,
                                           uint64_t seed, int64_t step);
// The batch made on `device` (default: the default device): images [N, S, S, 3] in dtype (values about
// [-1, 1]: a class's fixed colour + noise on a black background, painted there by ops::paint_rectangles),
// boxes [N, max_boxes, 4] f32 and labels [N, max_boxes] i64 uploaded from the scenes.
struct DetectionBatch {
  Tensor images, boxes, labels;
};
DetectionBatch synthetic_detection(int64_t batch, int64_t size, int64_t classes, int64_t max_boxes, uint64_t seed,
                                   int64_t step, engine::DType dtype = engine::DType::f32,
                                   std::shared_ptr<engine::Device> device = nullptr);

class YoloV3 : public Model {
 public:
  explicit YoloV3(const ModelConfig& c);
  explicit YoloV3(const YoloV3Config& c);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "img"; }
  int64_t batch_size() const override { return config_.batch; }
  // The default steps, plus the loss by part (box, object, class) in StepResult::losses and details.
  StepResult train_step(int64_t step) override;
  StepResult eval_step(int64_t step) override;
  YoloV3Net& net() { return *net_; }
  const YoloV3Config& config() const { return config_; }
  ops::YoloTargetParams target_params(int64_t scale) const;  // scale 0 (stride 32), 1, 2
  Batch make_batch(int64_t step) override;  // {"images" [N, S, S, 3], "boxes" [N, 100, 4] f32, "labels" [N, 100] i64}
  Tensor loss(const Batch& batch) override;
  // The YOLO loss of the three raw predictions (net().forward's) against boxes [N, M, 4] and labels [N, M].
  Tensor detection_loss(const std::array<Tensor, 3>& preds, const Tensor& boxes, const Tensor& labels);

 protected:
  int64_t items(const Batch& batch) const override { return batch.at("images").size(0); }

 private:
  void build();
  void report_parts(StepResult& r);  // moves parts_ into r (values; nothing on meta) and releases them
  YoloV3Config config_;
  std::shared_ptr<YoloV3Net> net_;
  std::shared_ptr<const data::DetectionSet> reader_;  // --data; null: synthetic
  std::map<std::string, Tensor> parts_;  // the last loss's parts (detached scalars), for StepResult::losses
};

}  // namespace models::vision
