// vision/deeplabv3.h: DeepLabv3 (Chen et al. 2017, arXiv 1706.05587) on a ResNet-101 backbone for PASCAL VOC
// semantic segmentation, shaped as torchvision's deeplabv3_resnet101 (without its auxiliary classifier) so
// that its state dict loads by name, with the paper's output stride 16 and multi-grid (1, 2, 4).
//
//   backbone     vision::ResNet (resnet.h): blocks (3, 4, 23, 3), OS 16, layer4 dilations 2 x (1, 2, 4)
//   classifier   0  ASPP: convs.0 1x1 | convs.1-3 3x3 atrous (rates 6, 12, 18) | convs.4 image pooling
//                   (global average -> 1x1 -> BN -> ReLU -> bilinear back to the feature size), each 256
//                   channels + BN + ReLU; concatenated (1280) -> project 1x1 256 + BN + ReLU + dropout 0.5
//                1  3x3 conv 256 -> 256, 2 BN, 3 ReLU, 4 1x1 conv 256 -> classes (+ bias)
//   output       bilinear upsampling (align_corners false) to the input size: logits [N, H, W, classes]
//   loss         cross-entropy over pixels, ignoring label 255 (VOC's boundaries), mean over the rest
//   training     SGD momentum 0.9, weight decay 5e-4, lr 0.007 with the poly schedule (power 0.9), batch norm
//                in training mode (jfzhang95/pytorch-deeplab-xception's VOC recipe). fp32.
//   data         seeded synthetic images (NHWC, 3 channels): rectangles of a class's colour (+ noise) on the
//                background class, boundaries labelled 255; --size voc (513 x 513, 21 classes, batch 8) or
//                tiny (the tests': 64 x 64, 5 classes, a narrow 4-block ResNet); --size torchvision is
//                torchvision's variant (output stride 8, its dilation pattern, no multi-grid, rates 12/24/36)
//                for parity runs with its weights; its dropout is 0 (random masks cannot match).
//                --data DIR: a VOC-style set instead (models/data/segmentation.h: JPEGImages, SegmentationClass,
//                jfzhang95's flip + random scale-crop to S x S, ImageNet-normalized pixels); opened and checked
//                when the model is built, decoded per step on the host (nothing is decoded on meta).
// Parameters (voc): 58,630,997 = torchvision's deeplabv3_resnet101 (60,996,202) less its aux classifier.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/vision/resnet.h"
#include "ops/synthetic.h"

namespace models::data {
class SegmentationSet;
}

namespace models::vision {

struct DeepLabV3Config {
  ResNetConfig backbone;
  int64_t classes = 21;
  int64_t aspp_channels = 256;
  std::vector<int64_t> aspp_rates = {6, 12, 18};
  double dropout = 0.5;  // after the ASPP projection (torchvision, jfzhang95); 0 for a deterministic parity run
  int64_t image_size = 513, batch = 8;
  int64_t ignore_index = 255;
  double lr = 0.007, momentum = 0.9, weight_decay = 5e-4;
  int64_t max_steps = 30000;  // the poly schedule's horizon
  uint64_t seed = 1;
  std::string data;  // --data: a VOC-style directory; empty: synthetic images
  // voc (default) | torchvision | tiny, then the ModelConfig fields (--batch, --data).
  static DeepLabV3Config from(const ModelConfig& c);
};

// Atrous spatial pyramid pooling: torchvision's ASPP, names convs.0 ... convs.4, project.
class Aspp : public graph::Module {
 public:
  Aspp(int64_t in, int64_t channels, const std::vector<int64_t>& rates, double dropout);
  Tensor forward(const Tensor& x) const;  // [N, h, w, in] -> [N, h, w, channels]
  std::vector<std::shared_ptr<Conv2d>> convs;       // convs.0 (1x1), convs.1.. (atrous), convs.K.1 (pooling)
  std::vector<std::shared_ptr<BatchNorm2d>> bns;
  std::shared_ptr<Conv2d> project;
  std::shared_ptr<BatchNorm2d> project_bn;
  double dropout;
};

class DeepLabV3Net : public graph::Module {
 public:
  explicit DeepLabV3Net(const DeepLabV3Config& c);
  Tensor forward(const Tensor& images) const;  // [N, H, W, 3] -> logits [N, H, W, classes]
  DeepLabV3Config config;
  std::shared_ptr<ResNet> backbone;
  std::shared_ptr<Aspp> aspp;                  // classifier.0
  std::shared_ptr<Conv2d> head_conv, classifier;  // classifier.1, classifier.4
  std::shared_ptr<BatchNorm2d> head_bn;           // classifier.2
};

// Seeded synthetic segmentation data, made on `device` (default: the default device): images [N, S, S, 3]
// in dtype (values about [-1, 1]) and labels [N * S * S] i64 in [0, classes) or ignore_index; the same
// (seed, step) gives the same batch on every device. The host draws each image's 1 to 3 rectangles
// (synthetic_segmentation_scenes: i64 [N, 3, 5] rows of ops::paint_rectangles, class -1 in empty slots) and
// a fixed palette [classes, 3] (row 0 the background class); ops::paint_rectangles paints the pixels there.
std::vector<int64_t> synthetic_segmentation_scenes(int64_t batch, int64_t size, int64_t classes, uint64_t seed,
                                                   int64_t step);
ops::PaintedImages synthetic_segmentation(int64_t batch, int64_t size, int64_t classes, int64_t ignore_index,
                                          uint64_t seed, int64_t step, engine::DType dtype = engine::DType::f32,
                                          std::shared_ptr<engine::Device> device = nullptr);

class DeepLabV3 : public Model {
 public:
  explicit DeepLabV3(const ModelConfig& c);
  explicit DeepLabV3(const DeepLabV3Config& c);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "img"; }
  int64_t batch_size() const override { return config_.batch; }
  // The ASPP's image-pooling branch batch-normalizes [N, 1, 1, 256]: N = 1 has no batch statistics (PyTorch
  // refuses it too, "Expected more than 1 value per channel when training").
  int64_t min_batch() const override { return 2; }
  // torchvision state dicts (OIHW convolutions, num_batches_tracked) and engine checkpoints alike.
  std::vector<std::string> load_weights(const std::map<std::string, Tensor>& tensors) override;
  DeepLabV3Net& net() { return *net_; }
  const DeepLabV3Config& config() const { return config_; }
  Batch make_batch(int64_t step) override;  // {"images" [N, S, S, 3], "labels" [N*S*S] i64}
  Tensor loss(const Batch& batch) override;

 protected:
  int64_t items(const Batch& batch) const override { return batch.at("images").size(0); }

 private:
  void build();
  DeepLabV3Config config_;
  std::shared_ptr<DeepLabV3Net> net_;
  std::shared_ptr<const data::SegmentationSet> reader_;  // --data; null: synthetic
};

}  // namespace models::vision
