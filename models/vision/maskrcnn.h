// vision/maskrcnn.h: Mask R-CNN with a ResNet-50-FPN backbone (He et al. 2017, arXiv 1703.06870), shaped as
// maskrcnn-benchmark's e2e_mask_rcnn_R_50_FPN_1x and named as torchvision's maskrcnn_resnet50_fpn (the same network),
// so that torchvision's state dict loads with --load. Every data-dependent count is fixed and padded, so that one
// step's memory does not depend on the image and meta predicts the GPU exactly:
//
//   backbone.body   ResNet-50 (resnet.h, output stride 32, torchvision's stride-on-3x3 bottleneck) with frozen batch
//                   norm everywhere (weight, bias and statistics constant: y = x scale + shift) and the stem and layer1
//                   frozen (no gradient, no optimizer state): torchvision's trainable_layers = 3. --backbone r101:
//                   ResNet-101 (blocks 3, 4, 23, 3).
//   backbone.fpn    FPN on layer1..layer4 (C2..C5): inner_blocks.k 1x1 to 256 (bias), the top-down sum with the
//                   coarser level upsampled x2 (nearest), layer_blocks.k 3x3 256 (bias); P6 = P5 max-pooled 1x1 s2
//                   (LastLevelMaxPool). Levels P2..P6 at strides 4..64.
//   rpn.head        a shared 3x3 conv 256 + ReLU, then 1x1 convs to A = 3 objectness logits and 4 A box codes per cell;
//                   anchors of size 32 .. 512 (one per level) x ratios 0.5, 1, 2 (ops::grid_anchors). Proposals
//                   (rpn.h): 2000 per level before NMS 0.7, 2000 per image after (1000 / 1000 at inference). Loss
//                   over 256 sampled anchors per image, half positive (rpn_targets + ops::sample_balanced + rpn_loss).
//   roi_heads       the proposals and the truths are the candidates; 512 sampled per image, a quarter foreground
//                   (roi_targets, roi_heads.h). box_head: RoIAlign 7x7 (sampling 2, aligned false) from P2..P5 by
//                   ops::fpn_levels, fc6 and fc7 1024 + ReLU; box_predictor: cls_score (C) and bbox_pred (4 C).
//                   mask_head: RoIAlign 14x14 of the first 128 slots of each image's draw (where the foreground is),
//                   4 x (3x3 conv 256 + ReLU); mask_predictor: conv5_mask (2x2 transposed conv s2 + ReLU) and
//                   mask_fcn_logits (1x1 to C): [R, 28, 28, C]. Its targets: each foreground slot's truth polygons
//                   rasterized into its 28 x 28 crop on the device (ops::polygon_masks).
//   loss            rpn objectness + rpn box + classifier + box regression + mask, summed (torchvision's and
//                   maskrcnn-benchmark's), each reported on its own.
//   training        SGD momentum 0.9, weight decay 1e-4, lr 0.02 x batch / 16 with maskrcnn-benchmark's warm-up
//                   (x 1/3 rising linearly over 500 updates) and steps (x 0.1 at 60k and 80k of 90k).
//   data            images of 800 x 1333 (COCO's min side 800, max 1333) padded to 800 x 1344 (multiple of 32), a
//                   batch of one padded size; synthetic by default: 1 to 8 ellipses of a class's colour on noise,
//                   each with its box and its 32-vertex polygon; at most 100 truths of at most 4 polygons of 64
//                   vertices (padding: invalid truths, empty parts). --data DIR: a COCO-style set with polygon
//                   segmentations (models/data/detection.h's instance_batch: flip, resize to min side 800 / max
//                   1333, zero padding; crowds skipped; categories 1 .. K in id order), decoded per step on the host.
//   inference       (--inference) proposals 1000 / 1000; the box head on every proposal; torchvision's
//                   postprocess_detections in fixed slots: softmax scores, class-specific boxes decoded and clipped,
//                   score > 0.05, NMS 0.5 per class, the best 100 per image (padding score -1); the mask head on them.
// Sizes: coco (maskrcnn-benchmark's 81 classes, batch 2), torchvision (91: torchvision's COCO category ids, so its
// pretrained state dict loads), tiny (the tests': 128 x 160, 4 classes, narrow layers, small counts).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/nn/layers.h"
#include "models/vision/resnet.h"
#include "models/vision/rpn.h"

namespace models::data {
class DetectionSet;
struct InstanceGeometry;
}  // namespace models::data

namespace models::vision {

struct MaskRcnnConfig {
  ResNetConfig backbone;  // ResNet-50, output stride 32, frozen batch norm, stem and layer1 frozen
  int64_t fpn_channels = 256;
  int64_t classes = 81;                                        // background included
  std::vector<double> anchor_sizes = {32, 64, 128, 256, 512};  // one per level P2..P6
  std::vector<double> anchor_ratios = {0.5, 1.0, 2.0};
  RpnParams rpn_train = {2000, 2000, 0.7, 1e-3}, rpn_test = {1000, 1000, 0.7, 1e-3};
  int64_t rpn_samples = 256;   // anchors sampled per image for the RPN loss ...
  double rpn_positive = 0.5;   // ... at most this fraction positive
  int64_t rois = 512;          // candidates sampled per image for the box head ...
  double roi_positive = 0.25;  // ... at most this fraction foreground
  int64_t mask_rois = 128;     // the first slots of each image's draw the mask head trains on (>= rois x positive)
  int64_t max_truths = 100;    // ground-truth slots per image
  int64_t polygon_parts = 4, polygon_vertices = 64;  // per truth
  int64_t box_pool = 7, mask_pool = 14;              // RoIAlign outputs (the mask is 2 x mask_pool)
  int64_t representation = 1024;                     // the box head's FC width
  int64_t mask_channels = 256;
  int64_t height = 800, width = 1333;  // the images' size before padding
  int64_t batch = 2;
  int64_t detections = 100;  // per image at inference
  double score_threshold = 0.05, detection_nms = 0.5;
  double lr = 0.02 * 2 / 16, momentum = 0.9, weight_decay = 1e-4;
  int64_t warmup = 500;
  double warmup_factor = 1.0 / 3;
  std::vector<int64_t> lr_steps = {60000, 80000};
  std::string data;        // --data: a COCO-style directory with polygons; empty: synthetic scenes
  bool inference = false;  // --inference: eval steps detect
  uint64_t seed = 1;
  int64_t padded_height() const { return (height + 31) / 32 * 32; }
  int64_t padded_width() const { return (width + 31) / 32 * 32; }
  int64_t anchors_per_cell() const { return int64_t(anchor_ratios.size()); }
  int64_t mask_size() const { return 2 * mask_pool; }
  // coco (default) | torchvision | tiny, then the ModelConfig fields (--batch, --data, --backbone).
  static MaskRcnnConfig from(const ModelConfig& c);
};

// torchvision's FeaturePyramidNetwork with LastLevelMaxPool: [C2, C3, C4, C5] -> [P2, P3, P4, P5, P6].
class Fpn : public graph::Module {
 public:
  Fpn(const std::vector<int64_t>& in_channels, int64_t channels);
  std::vector<Tensor> forward(std::vector<Tensor> features) const;
  std::vector<std::shared_ptr<Conv2d>> inner_blocks, layer_blocks;  // "inner_blocks.k.0", "layer_blocks.k.0"
};

// torchvision's RPNHead, shared by the levels.
class RpnHead : public graph::Module {
 public:
  RpnHead(int64_t channels, int64_t anchors);
  struct Output {
    std::vector<Tensor> objectness;  // per level [N, h w A]
    std::vector<Tensor> deltas;      // per level [N, h w A, 4]
  };
  Output forward(const std::vector<Tensor>& levels) const;
  std::shared_ptr<Conv2d> conv, cls_logits, bbox_pred;  // "conv.0.0"
};

// Which RoIAlign: the box head's (7 x 7) or the mask head's (14 x 14), with torchvision's module names.
enum class Pooler { box, mask };

// The backbone (body + fpn) and the heads, with torchvision's module names.
class MaskRcnnNet : public graph::Module {
 public:
  explicit MaskRcnnNet(const MaskRcnnConfig& c);
  MaskRcnnConfig config;
  std::shared_ptr<graph::Module> backbone;  // holds body and fpn
  std::shared_ptr<ResNet> body;
  std::shared_ptr<Fpn> fpn;
  std::shared_ptr<graph::Module> rpn, roi_heads;
  std::shared_ptr<RpnHead> rpn_head;
  std::shared_ptr<nn::Linear> fc6, fc7, cls_score, bbox_pred;  // box_head.fc6/fc7, box_predictor.*
  std::vector<std::shared_ptr<Conv2d>> mask_convs;             // mask_head.k.0
  std::shared_ptr<ConvTranspose2d> conv5_mask;                 // mask_predictor.conv5_mask
  std::shared_ptr<Conv2d> mask_fcn_logits;                     // mask_predictor.mask_fcn_logits
  // [N, H, W, 3] -> P2..P6
  std::vector<Tensor> features(const Tensor& images) const;
  // The RPN head on P2..P6, in the rpn scope.
  RpnHead::Output rpn_head_forward(const std::vector<Tensor>& levels) const;
  // RoIAlign of rois [N, S, 4] (slot padding where `pooled` is false: zeros, no gradient) from P2..P5, at the box or
  // the mask head's size.
  Tensor pool(const std::vector<Tensor>& levels, const Tensor& rois, const Tensor& pooled, Pooler which) const;
  // Every level's anchors (ops::grid_anchors at the level's stride in the padded images), in the logits' order.
  std::vector<Tensor> anchors(const std::vector<Tensor>& levels, const Tensor& images) const;
  // The box head on pooled [R, 7, 7, C] -> class logits [R, classes], box codes [R, 4 classes].
  std::pair<Tensor, Tensor> box_head(const Tensor& pooled) const;
  // The mask head on pooled [R, 14, 14, C] -> mask logits [R, 28, 28, classes].
  Tensor mask_head(const Tensor& pooled) const;
};

class MaskRcnn : public Model {
 public:
  explicit MaskRcnn(const ModelConfig& c);
  explicit MaskRcnn(const MaskRcnnConfig& c);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "img"; }
  int64_t batch_size() const override { return config_.batch; }
  int memory_report_depth() const override { return 2; }
  // torchvision's state dict (OIHW convolutions, fc6's columns in C, H, W order) or an engine checkpoint.
  std::vector<std::string> load_weights(const std::map<std::string, Tensor>& tensors) override;
  // The default steps, plus the five losses in StepResult::losses and a details line.
  StepResult train_step(int64_t step) override;
  // --inference: detection (fixed detections per image); a training model's eval step reports the losses.
  StepResult eval_step(int64_t step) override;
  // {"images" [N, Hp, Wp, 3], "image_hw" f32 [N, 2], "boxes" f32 [N, G, 4] (x1, y1, x2, y2 pixels), "labels" i64
  //  [N, G] (1 .. classes - 1), "valid" bool [N, G], "polygons" f32 [N, G, P, V, 2], "counts" i64 [N, G, P]}
  Batch make_batch(int64_t step) override;
  Tensor loss(const Batch& batch) override;
  struct Detections {
    Tensor boxes;   // f32 [N, D, 4]
    Tensor scores;  // f32 [N, D]: -1 in padding
    Tensor labels;  // i64 [N, D]: 0 in padding
    Tensor masks;   // f32 [N, D, 28, 28]: each detection's mask probabilities in its box
  };
  Detections detect(const Batch& batch);
  MaskRcnnNet& net() { return *net_; }
  const MaskRcnnConfig& config() const { return config_; }

 protected:
  int64_t items(const Batch& batch) const override { return batch.at("images").size(0); }

 private:
  void build();
  void report_parts(StepResult& r);
  data::InstanceGeometry geometry() const;  // --data's resize, padding and fixed counts
  MaskRcnnConfig config_;
  std::shared_ptr<MaskRcnnNet> net_;
  std::shared_ptr<const data::DetectionSet> reader_;  // --data; null: synthetic
  std::map<std::string, Tensor> parts_;  // the last loss's parts (detached scalars)
};

// Seeded synthetic scenes: 1 to 8 ellipses per image (class, box, 32-vertex polygon), painted on the device.
Batch synthetic_maskrcnn_batch(const MaskRcnnConfig& c, int64_t step, engine::DType dtype,
                               std::shared_ptr<engine::Device> device);

}  // namespace models::vision
