// vision/layers.h: the layers of the image models: Conv2d and BatchNorm2d over NHWC activations, and the
// loading of PyTorch (torchvision) weights into them.
//
// Parameters carry PyTorch's names (weight, bias, running_mean, running_var), so a torchvision state dict
// loads by name. Conv2d stores its weight KRSC, [out, KH, KW, in/groups] (the engine's convolution layout,
// ops/conv_params.h), where PyTorch stores OIHW [out, in/groups, KH, KW]: load_torch_weights permutes.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/autograd.h"
#include "graph/module.h"
#include "models/nn/layers.h"
#include "ops/batch_norm.h"
#include "ops/conv_params.h"

namespace models::vision {

using engine::Tensor;

struct Conv2dOptions {
  int64_t in = 0, out = 0;
  int64_t kernel = 1, stride = 1, padding = 0, dilation = 1, groups = 1;
  bool bias = true;
  nn::Init init = {};  // pytorch_default: uniform(+-1/sqrt(fan_in)) for weight and bias, fan_in = in/g * k * k
};

class Conv2d : public graph::Module {
 public:
  explicit Conv2d(const Conv2dOptions& o);
  Tensor forward(const Tensor& x) const;  // [N, H, W, in] -> [N, Ho, Wo, out]
  // With geometry chosen per call (TensorFlow's 'SAME' padding depends on the input's size): p's groups must be
  // the layer's.
  Tensor forward(const Tensor& x, const ops::Conv2dParams& p) const;
  Conv2dOptions options;
  ops::Conv2dParams params;
  Tensor weight;  // [out, KH, KW, in/groups]
  Tensor bias;    // [out] or undefined
};

// PyTorch's ConvTranspose2d (ops::conv_transpose2d): weight [in, KH, KW, out] (PyTorch's [in, out, KH, KW]
// permuted as load_torch_weights permutes every 4-D weight), output (H - 1) stride - 2 padding + kernel +
// output_padding; groups 1.
struct ConvTranspose2dOptions {
  int64_t in = 0, out = 0, kernel = 1, stride = 1, padding = 0, output_padding = 0;
  bool bias = true;
  nn::Init init = {};  // pytorch_default: uniform(+-1/sqrt(fan_in)), fan_in = out * k * k as PyTorch computes it
};
class ConvTranspose2d : public graph::Module {
 public:
  explicit ConvTranspose2d(const ConvTranspose2dOptions& o);
  Tensor forward(const Tensor& x) const;  // [N, H, W, in] -> [N, Ho, Wo, out]
  ConvTranspose2dOptions options;
  ops::Conv2dParams params;
  Tensor weight;  // [in, KH, KW, out]
  Tensor bias;    // [out] or undefined
};

// torchvision's ResNet initialization of a convolution: kaiming_normal_(mode="fan_out", nonlinearity="relu"),
// i.e. normal(0, sqrt(2 / (out * KH * KW))).
nn::Init kaiming_normal_fan_out(int64_t out, int64_t kernel);

// BatchNorm2d over the channels (the last dimension): batch statistics and a running-statistics update
// (momentum 0.1) in training mode, the running statistics in evaluation mode.
// frozen: torchvision's FrozenBatchNorm2d (detection backbones): weight, bias and the statistics are all buffers
// (constants, never trained), and in every mode y = x scale + shift with scale = weight / sqrt(running_var + eps),
// shift = bias - running_mean scale ([C], computed per call): a multiply that saves only scale for backward, and an
// add, as PyTorch's; nothing of x's size is kept.
// act: an activation after the normalization (ReLU, leaky ReLU), in batch_norm's kernels (ops::NormActivation);
// the frozen layer applies it as its own op.
class BatchNorm2d : public graph::Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1, bool frozen = false);
  // act(bn(x) + residual) (residual [N, H, W, C] or undefined): [N, H, W, C] -> [N, H, W, C]; one pass over x when
  // training (ops::batch_norm's fused activation and residual), separate ops when frozen.
  Tensor forward(const Tensor& x, ops::NormActivation act = {}, const Tensor& residual = Tensor()) const;
  double eps, momentum;
  bool frozen;
  Tensor weight, bias;               // [C] parameters (ones, zeros); buffers when frozen
  Tensor running_mean, running_var;  // [C] f32 buffers (zeros, ones)
};

// block->forward(x), or under graph::recompute when `recompute` (and gradients are on): the block then keeps only
// x, and runs again in backward (--recompute layer for the backbones' residual blocks).
template <typename Block>
Tensor forward_block(const std::shared_ptr<Block>& block, const Tensor& x, bool recompute) {
  if (!recompute || !graph::grad_enabled()) return block->forward(x);
  return graph::recompute([block](const std::vector<Tensor>& in) { return block->forward(in[0]); }, {x});
}

// Loads `tensors` into root strictly (Module::load) after two translations from a PyTorch state dict:
// 4-D tensors whose name is a 4-D parameter's and whose shape is that parameter's in OIHW order are permuted
// to KRSC; "*.num_batches_tracked" entries are ignored. A file is either all PyTorch layout or all engine
// layout (a mix is an Error); shapes that read the same both ways (in/g == KH == KW) follow the rest of the
// file. Parameters and buffers whose name starts with one of `optional_prefixes` may be missing from the file
// (they keep their values: a part of the engine's model the PyTorch one lacks, e.g. NASNet's aux head). Returns
// the names loaded.
std::vector<std::string> load_torch_weights(graph::Module& root, const std::map<std::string, Tensor>& tensors,
                                            const std::vector<std::string>& optional_prefixes = {});

}  // namespace models::vision
