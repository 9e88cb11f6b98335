// vision/resnet.h: ResNet with bottleneck blocks (torchvision's ResNet v1.5: the stride on the 3x3
// convolution), as a dilated backbone for dense prediction (DeepLabv3) or an undilated one (output stride 32) with
// frozen batch norm for detection (Mask R-CNN's FPN reads every stage's output: forward_stages).
//
//   stem     conv1 7x7 s2 (3 -> width) - bn1 - relu - max pool 3x3 s2 p1            output stride 4
//   layer1   blocks[0] bottlenecks, planes width,     stride 1                        4
//   layer2   blocks[1] bottlenecks, planes 2 width,   stride 2                        8
//   layer3   blocks[2] bottlenecks, planes 4 width,   stride 2 (or dilated, OS 8)     16
//   layer4   blocks[3] bottlenecks, planes 8 width,   stride 1, dilation 2 x multi-grid (1, 2, 4) for OS 16
//            (OS 8: layer3 dilation 2, layer4 4 x multi-grid; or torchvision's pattern, see ResNetConfig)
// Bottleneck(in, planes, stride, dilation): 1x1 in->planes, 3x3 planes->planes (stride, dilation = padding),
// 1x1 planes->4 planes, each followed by BatchNorm2d; + the input (through downsample = 1x1 conv stride s + BN
// when the shape changes); ReLU after each BN and after the sum. No classifier (the head is the model's).
// Names are torchvision's (conv1, bn1, layer3.22.conv2.weight, layer4.0.downsample.0.weight, ...), so
// `backbone.*` of torchvision's deeplabv3_resnet101 state dict loads. ResNet-101: blocks (3, 4, 23, 3).
// Convolutions have no bias; their weights start as torchvision's (kaiming normal, fan out), BN at (1, 0).
#pragma once
#include <array>
#include <memory>
#include <vector>

#include "models/vision/layers.h"

namespace models::vision {

class Bottleneck : public graph::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in, int64_t planes, int64_t stride, int64_t dilation, bool frozen_bn = false);
  Tensor forward(const Tensor& x) const;  // [N, H, W, in] -> [N, H/stride, W/stride, 4 planes]
  std::shared_ptr<Conv2d> conv1, conv2, conv3;
  std::shared_ptr<BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<Conv2d> downsample_conv;     // "downsample.0", or null (identity)
  std::shared_ptr<BatchNorm2d> downsample_bn;  // "downsample.1"
};

struct ResNetConfig {
  std::array<int64_t, 4> blocks = {3, 4, 23, 3};  // ResNet-101
  int64_t width = 64;                             // stem channels and layer1's planes
  int64_t in_channels = 3;
  int64_t output_stride = 16;  // 16 (layer4 dilated), 8 (layer3 and layer4 dilated) or 32 (none, no multi-grid)
  std::vector<int64_t> multi_grid = {1, 2, 4};    // layer4's per-block dilation multipliers (cycled)
  // torchvision's replace_stride_with_dilation instead: a dilated stage's first block keeps the previous
  // stage's dilation (its 3x3 is where the stride would have been), the others take the stage's; no multi-grid.
  bool torchvision_dilation = false;
  // Activation checkpointing (--recompute layer): each bottleneck keeps only its input; its convolutions,
  // batch norms and ReLUs run again in backward (graph::recompute), about a third more compute for the
  // backbone's activations of one block at a time.
  bool recompute_blocks = false;
  // Detection backbones (torchvision's resnet_fpn_backbone): every batch norm frozen (BatchNorm2d's frozen: constant
  // scale and shift), and the first frozen_stages stages without gradients (1: the stem; 2: the stem and layer1, as
  // torchvision's trainable_layers = 3): their parameters need no gradient, so their activations are not kept.
  bool frozen_bn = false;
  int64_t frozen_stages = 0;
  int64_t out_channels() const { return width * 8 * Bottleneck::kExpansion; }
};

class ResNet : public graph::Module {
 public:
  explicit ResNet(const ResNetConfig& c);
  // [N, H, W, in_channels] -> [N, ~H/OS, ~W/OS, out_channels()]
  Tensor forward(const Tensor& x) const;
  // Every stage's output: layer1 .. layer4 (strides 4, 8, 16, 32 at output stride 32).
  std::vector<Tensor> forward_stages(const Tensor& x) const;
  ResNetConfig config;
  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
  std::array<std::vector<std::shared_ptr<Bottleneck>>, 4> layers;

 private:
  Tensor stem(const Tensor& x) const;  // conv1, bn1, ReLU, max pool: [N, H/4, W/4, width]
};

}  // namespace models::vision
