// vision/darknet.h: Darknet-53, YOLOv3's backbone (pjreddie/darknet cfg/yolov3.cfg, layers 0-74), over NHWC.
//
//   ConvBnLeaky  KxK convolution (no bias, padding K/2) - BatchNorm2d - leaky ReLU 0.1: darknet's
//                [convolutional] with batch_normalize=1, activation=leaky
//   Residual     1x1 c -> c/2, 3x3 c/2 -> c, + the input (darknet's [shortcut] from=-3, linear)
//   stem         ConvBnLeaky 3x3 3 -> width (32)
//   stage s      ConvBnLeaky 3x3 stride 2, channels x2, then blocks[s] residuals: blocks (1, 2, 8, 8, 4),
//                channels 64, 128, 256, 512, 1024, output strides 2, 4, 8, 16, 32
// forward returns the last three stages' outputs (strides 8, 16, 32: darknet's layers 36, 61, 74), the
// inputs of YOLOv3's three scales. Names: stem, stages.<s>.down, stages.<s>.blocks.<b>.conv1 / conv2,
// each with .conv and .bn. Convolutions start as PyTorch's default (kaiming uniform), BN at (1, 0).
// Parameters (width 32): 40,584,928 (convolutions + BN affine; the running statistics are buffers).
#pragma once
#include <array>
#include <memory>
#include <vector>

#include "models/vision/layers.h"

namespace models::vision {

class ConvBnLeaky : public graph::Module {
 public:
  static constexpr double kSlope = 0.1;
  ConvBnLeaky(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1);
  Tensor forward(const Tensor& x) const;  // [N, H, W, in] -> [N, H/stride, W/stride, out]
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
};

class DarknetResidual : public graph::Module {
 public:
  explicit DarknetResidual(int64_t channels);
  Tensor forward(const Tensor& x) const;  // [N, H, W, c] -> [N, H, W, c]
  std::shared_ptr<ConvBnLeaky> conv1, conv2;
};

struct DarknetConfig {
  std::array<int64_t, 5> blocks = {1, 2, 8, 8, 4};  // Darknet-53
  int64_t width = 32;                               // the stem's channels; stage s has width * 2^(s+1)
  int64_t in_channels = 3;
  // Activation checkpointing (--recompute layer): each residual block keeps only its input; its two
  // ConvBnLeaky run again in backward (graph::recompute).
  bool recompute_blocks = false;
  // Channels of the three outputs (strides 8, 16, 32).
  std::array<int64_t, 3> out_channels() const { return {width * 8, width * 16, width * 32}; }
};

class Darknet53 : public graph::Module {
 public:
  explicit Darknet53(const DarknetConfig& c);
  // [N, H, W, in] -> the stride 8, 16 and 32 features [N, H/8, W/8, 8 w], [N, H/16, W/16, 16 w], [N, H/32, W/32, 32 w]
  std::array<Tensor, 3> forward(const Tensor& x) const;
  DarknetConfig config;
  std::shared_ptr<ConvBnLeaky> stem;
  std::array<std::shared_ptr<ConvBnLeaky>, 5> down;
  std::array<std::vector<std::shared_ptr<DarknetResidual>>, 5> blocks;
};

}  // namespace models::vision
