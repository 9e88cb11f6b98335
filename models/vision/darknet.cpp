// vision/darknet.cpp: Darknet-53's layers.
#include "models/vision/darknet.h"

#include <string>

#include "ops/elementwise.h"

namespace models::vision {

ConvBnLeaky::ConvBnLeaky(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  Conv2dOptions o;
  o.in = in, o.out = out, o.kernel = kernel, o.stride = stride, o.padding = kernel / 2;
  o.bias = false;  // batch_normalize=1: darknet's convolution has no bias, BN's beta is the shift
  conv = register_module("conv", std::make_shared<Conv2d>(o));
  bn = register_module("bn", std::make_shared<BatchNorm2d>(out));
}

Tensor ConvBnLeaky::forward(const Tensor& x) const {
  auto s = scope();
  return bn->forward(conv->forward(x), ops::NormActivation::leaky_relu(kSlope));
}

DarknetResidual::DarknetResidual(int64_t channels) {
  conv1 = register_module("conv1", std::make_shared<ConvBnLeaky>(channels, channels / 2, 1));
  conv2 = register_module("conv2", std::make_shared<ConvBnLeaky>(channels / 2, channels, 3));
}

Tensor DarknetResidual::forward(const Tensor& x) const {
  auto s = scope();
  return ops::add(x, conv2->forward(conv1->forward(x)));
}

Darknet53::Darknet53(const DarknetConfig& c) : config(c) {
  stem = register_module("stem", std::make_shared<ConvBnLeaky>(c.in_channels, c.width, 3));
  int64_t channels = c.width;
  for (size_t s = 0; s < 5; s++) {
    const std::string stage = "stages." + std::to_string(s);
    down[s] = register_module(stage + ".down", std::make_shared<ConvBnLeaky>(channels, channels * 2, 3, 2));
    channels *= 2;
    for (int64_t b = 0; b < c.blocks[s]; b++)
      blocks[s].push_back(
          register_module(stage + ".blocks." + std::to_string(b), std::make_shared<DarknetResidual>(channels)));
  }
}

std::array<Tensor, 3> Darknet53::forward(const Tensor& x) const {
  auto s = scope();
  std::array<Tensor, 3> outputs;  // strides 8, 16, 32
  Tensor y = stem->forward(x);
  for (size_t st = 0; st < 5; st++) {
    y = down[st]->forward(y);
    for (const auto& b : blocks[st]) y = forward_block(b, y, config.recompute_blocks);
    if (st >= 2) outputs[st - 2] = y;
  }
  return outputs;
}

}  // namespace models::vision
