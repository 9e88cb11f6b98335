// vision/resnet.cpp: the bottleneck block and the dilated ResNet backbone.
#include "models/vision/resnet.h"

#include <string>

#include "engine/error.h"
#include "ops/elementwise.h"
#include "ops/pool.h"

namespace models::vision {

namespace {
std::shared_ptr<Conv2d> make_conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t dilation) {
  Conv2dOptions o;
  o.in = in, o.out = out, o.kernel = kernel, o.stride = stride;
  o.dilation = dilation, o.padding = dilation * (kernel - 1) / 2;  // "same" for odd kernels
  o.bias = false;
  o.init = kaiming_normal_fan_out(out, kernel);
  return std::make_shared<Conv2d>(o);
}
}  // namespace

Bottleneck::Bottleneck(int64_t in, int64_t planes, int64_t stride, int64_t dilation, bool frozen_bn) {
  auto bn = [frozen_bn](int64_t c) { return std::make_shared<BatchNorm2d>(c, 1e-5, 0.1, frozen_bn); };
  conv1 = register_module("conv1", make_conv(in, planes, 1, 1, 1));
  bn1 = register_module("bn1", bn(planes));
  conv2 = register_module("conv2", make_conv(planes, planes, 3, stride, dilation));
  bn2 = register_module("bn2", bn(planes));
  conv3 = register_module("conv3", make_conv(planes, planes * kExpansion, 1, 1, 1));
  bn3 = register_module("bn3", bn(planes * kExpansion));
  if (stride != 1 || in != planes * kExpansion) {
    downsample_conv = register_module("downsample.0", make_conv(in, planes * kExpansion, 1, stride, 1));
    downsample_bn = register_module("downsample.1", bn(planes * kExpansion));
  }
}

Tensor Bottleneck::forward(const Tensor& x) const {
  auto s = scope();
  const ops::NormActivation relu = ops::NormActivation::relu();
  Tensor h = bn1->forward(conv1->forward(x), relu);  // [N, H, W, planes]
  h = bn2->forward(conv2->forward(h), relu);          // [N, H/s, W/s, planes]
  h = conv3->forward(h);                              // [N, H/s, W/s, 4 planes]
  Tensor identity = downsample_conv ? downsample_bn->forward(downsample_conv->forward(x)) : x;
  return bn3->forward(h, relu, identity);  // relu(bn3(h) + identity), one pass
}

ResNet::ResNet(const ResNetConfig& c) : config(c) {
  ENGINE_CHECK(c.output_stride == 8 || c.output_stride == 16 || c.output_stride == 32,
               "ResNet: output stride must be 8, 16 or 32, got ", c.output_stride);
  ENGINE_CHECK(c.frozen_stages >= 0 && c.frozen_stages <= 5, "ResNet: frozen_stages must be in [0, 5], got ",
               c.frozen_stages);
  ENGINE_CHECK(!c.multi_grid.empty(), "ResNet: multi_grid must not be empty");
  Conv2dOptions stem;
  stem.in = c.in_channels, stem.out = c.width, stem.kernel = 7, stem.stride = 2, stem.padding = 3;
  stem.bias = false;
  stem.init = kaiming_normal_fan_out(c.width, 7);
  conv1 = register_module("conv1", std::make_shared<Conv2d>(stem));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(c.width, 1e-5, 0.1, c.frozen_bn));
  // Stage strides and dilations: a dilated stage keeps its input's resolution and widens its 3x3 taps.
  const bool dilate3 = c.output_stride == 8, dilate4 = c.output_stride <= 16;
  const std::array<int64_t, 4> stride = {1, 2, dilate3 ? 1 : 2, dilate4 ? 1 : 2};
  const std::array<int64_t, 4> dilation = {1, 1, dilate3 ? 2 : 1, dilate3 ? 4 : (dilate4 ? 2 : 1)};
  int64_t in = c.width;
  for (int stage = 0; stage < 4; stage++) {
    const int64_t planes = c.width << stage;
    for (int64_t b = 0; b < c.blocks[size_t(stage)]; b++) {
      // Multi-grid (DeepLabv3 section 3.2) on the last stage: block b's rate is dilation x grid[b].
      int64_t d =
          stage == 3 && dilate4 ? dilation[3] * c.multi_grid[size_t(b) % c.multi_grid.size()] : dilation[size_t(stage)];
      if (c.torchvision_dilation) d = b == 0 && stage > 0 ? dilation[size_t(stage - 1)] : dilation[size_t(stage)];
      auto block = std::make_shared<Bottleneck>(in, planes, b == 0 ? stride[size_t(stage)] : 1, d, c.frozen_bn);
      layers[size_t(stage)].push_back(
          register_module("layer" + std::to_string(stage + 1) + "." + std::to_string(b), block));
      in = planes * Bottleneck::kExpansion;
    }
  }
  // Frozen stages: no gradient, so no optimizer state, and nothing of theirs is saved for backward.
  std::vector<graph::Module*> frozen;
  if (c.frozen_stages >= 1) frozen = {conv1.get(), bn1.get()};
  for (int64_t stage = 0; stage + 1 < c.frozen_stages; stage++)
    for (const auto& block : layers[size_t(stage)]) frozen.push_back(block.get());
  for (graph::Module* m : frozen)
    for (auto& [name, p] : m->named_parameters()) p.set_requires_grad(false);
}

Tensor ResNet::stem(const Tensor& x) const {
  Tensor h = bn1->forward(conv1->forward(x), ops::NormActivation::relu());  // [N, H/2, W/2, width]
  ops::Pool2dParams pool;
  pool.kernel_h = pool.kernel_w = 3;
  pool.stride_h = pool.stride_w = 2;
  pool.pad_top = pool.pad_bottom = pool.pad_left = pool.pad_right = 1;
  return ops::max_pool2d(h, pool);  // [N, H/4, W/4, width]
}

Tensor ResNet::forward(const Tensor& x) const {
  auto s = scope();
  Tensor h = stem(x);
  for (const auto& stage : layers)
    for (const auto& block : stage) h = forward_block(block, h, config.recompute_blocks);
  return h;
}

std::vector<Tensor> ResNet::forward_stages(const Tensor& x) const {
  auto s = scope();
  Tensor h = stem(x);
  std::vector<Tensor> out;
  for (const auto& stage : layers) {
    for (const auto& block : stage) h = forward_block(block, h, config.recompute_blocks);
    out.push_back(h);
  }
  return out;
}

}  // namespace models::vision
