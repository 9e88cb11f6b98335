// vision/layers.cpp: Conv2d, BatchNorm2d and the PyTorch weight loader.
#include "models/vision/layers.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"
#include "graph/autograd.h"
#include "ops/batch_norm.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/view.h"

namespace models::vision {

using engine::DType;

Conv2d::Conv2d(const Conv2dOptions& o) : options(o) {
  ENGINE_CHECK(o.in > 0 && o.out > 0 && o.kernel > 0 && o.groups > 0 && o.in % o.groups == 0 && o.out % o.groups == 0,
               "Conv2d: in ", o.in, " and out ", o.out, " must be positive multiples of groups ", o.groups, ", kernel ",
               o.kernel, " positive");
  params.stride_h = params.stride_w = o.stride;
  params.pad_h = params.pad_w = o.padding;
  params.dilation_h = params.dilation_w = o.dilation;
  params.groups = o.groups;
  const int64_t fan_in = o.in / o.groups * o.kernel * o.kernel;
  weight = register_parameter("weight", nn::init_tensor({o.out, o.kernel, o.kernel, o.in / o.groups}, o.init, fan_in));
  if (o.bias) {
    nn::Init bias_init = o.init.kind == nn::Init::Kind::pytorch_default ? o.init : nn::Init{nn::Init::Kind::zeros};
    bias = register_parameter("bias", nn::init_tensor({o.out}, bias_init, fan_in));
  }
}

Tensor Conv2d::forward(const Tensor& x) const {
  auto s = scope();
  return ops::conv2d(x, weight, bias, params);
}

ConvTranspose2d::ConvTranspose2d(const ConvTranspose2dOptions& o) : options(o) {
  ENGINE_CHECK(
      o.in > 0 && o.out > 0 && o.kernel > 0 && o.stride > 0 && o.output_padding >= 0 && o.output_padding < o.stride,
      "ConvTranspose2d: in ", o.in, ", out ", o.out, ", kernel ", o.kernel, " and stride ", o.stride,
      " must be positive and output_padding ", o.output_padding, " below the stride");
  params.stride_h = params.stride_w = o.stride;
  params.pad_h = params.pad_w = o.padding;
  const int64_t fan_in = o.out * o.kernel * o.kernel;  // PyTorch's fan_in of a [in, out, k, k] weight
  weight = register_parameter("weight", nn::init_tensor({o.in, o.kernel, o.kernel, o.out}, o.init, fan_in));
  if (o.bias) {
    nn::Init bias_init = o.init.kind == nn::Init::Kind::pytorch_default ? o.init : nn::Init{nn::Init::Kind::zeros};
    bias = register_parameter("bias", nn::init_tensor({o.out}, bias_init, fan_in));
  }
}

Tensor ConvTranspose2d::forward(const Tensor& x) const {
  auto s = scope();
  return ops::conv_transpose2d(x, weight, bias, params, options.output_padding, options.output_padding);
}

Tensor Conv2d::forward(const Tensor& x, const ops::Conv2dParams& p) const {
  ENGINE_CHECK(p.groups == params.groups, "Conv2d: called with groups ", p.groups, " but the layer has ",
               params.groups);
  auto s = scope();
  return ops::conv2d(x, weight, bias, p);
}

nn::Init kaiming_normal_fan_out(int64_t out, int64_t kernel) {
  return nn::Init::normal(std::sqrt(2.0 / double(out * kernel * kernel)));
}

BatchNorm2d::BatchNorm2d(int64_t channels, double eps_, double momentum_, bool frozen_)
    : eps(eps_), momentum(momentum_), frozen(frozen_) {
  weight =
      frozen ? register_buffer("weight", ops::ones({channels})) : register_parameter("weight", ops::ones({channels}));
  bias = frozen ? register_buffer("bias", ops::zeros({channels})) : register_parameter("bias", ops::zeros({channels}));
  running_mean = register_buffer("running_mean", ops::zeros({channels}));
  running_var = register_buffer("running_var", ops::ones({channels}));
}

Tensor BatchNorm2d::forward(const Tensor& x, ops::NormActivation act, const Tensor& residual) const {
  auto s = scope();
  if (frozen) {
    Tensor scale, shift;
    {
      graph::NoGrad constants;
      scale = ops::mul(ops::to(weight, DType::f32), ops::rsqrt(ops::add(running_var, eps)));
      shift = ops::sub(ops::to(bias, DType::f32), ops::mul(running_mean, scale));
    }
    Tensor y = ops::add(ops::mul(x, ops::to(scale, x.dtype())), ops::to(shift, x.dtype()));
    if (residual.defined()) y = ops::add(y, residual);
    if (!act.on()) return y;
    return act.slope == 0.0 ? ops::relu(y) : ops::leaky_relu(y, act.slope);
  }
  // Inside a block that graph::recompute runs again in backward, the batch statistics are recomputed (the same
  // values) but the running statistics were updated by the first run: not twice.
  const bool again = training() && graph::recomputing();
  return ops::batch_norm(x, weight, bias, again ? Tensor() : running_mean, again ? Tensor() : running_var, training(),
                         momentum, eps, act, residual);
}

// ---------------------------------------------------------------------------------------------------
std::vector<std::string> load_torch_weights(graph::Module& root, const std::map<std::string, Tensor>& tensors,
                                            const std::vector<std::string>& optional_prefixes) {
  std::map<std::string, engine::Shape> conv_shapes;  // 4-D parameters: [out, KH, KW, in/g]
  for (const auto& [name, p] : root.named_parameters())
    if (p.dim() == 4) conv_shapes[name] = p.shape();
  // Which layout the file is in, from the tensors whose shape says it unambiguously.
  std::vector<std::string> torch_layout, engine_layout;
  auto oihw = [](const engine::Shape& krsc) { return engine::Shape{krsc[0], krsc[3], krsc[1], krsc[2]}; };
  for (const auto& [name, t] : tensors) {
    auto it = conv_shapes.find(name);
    if (it == conv_shapes.end() || it->second == oihw(it->second)) continue;
    if (t.shape() == oihw(it->second))
      torch_layout.push_back(name);
    else if (t.shape() == it->second)
      engine_layout.push_back(name);
  }
  ENGINE_CHECK(torch_layout.empty() || engine_layout.empty(), "load_torch_weights: convolution weights in both ",
               "PyTorch's OIHW layout (e.g. '", torch_layout.empty() ? "" : torch_layout.front(),
               "') and the engine's KRSC layout (e.g. '", engine_layout.empty() ? "" : engine_layout.front(),
               "') in one file");
  const bool from_torch = !torch_layout.empty();
  std::map<std::string, Tensor> converted;
  std::vector<std::string> ignored;
  graph::NoGrad no_grad;
  for (const auto& [name, t] : tensors) {
    const std::string suffix = ".num_batches_tracked";
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      ignored.push_back(name);
      continue;
    }
    auto it = conv_shapes.find(name);
    const bool permute = from_torch && it != conv_shapes.end() && t.shape() == oihw(it->second);
    converted[name] = permute ? ops::contiguous(ops::permute(t, {0, 2, 3, 1})) : t;  // OIHW -> OHWI (KRSC)
  }
  std::vector<std::string> kept;  // optional tensors the file lacks: loaded from themselves
  auto optional = [&](const std::string& name) {
    for (const auto& p : optional_prefixes)
      if (name.compare(0, p.size(), p) == 0) return true;
    return false;
  };
  for (const auto& list : {root.named_parameters(), root.named_buffers()})
    for (const auto& [name, t] : list)
      if (optional(name) && !converted.count(name)) converted[name] = t, kept.push_back(name);
  std::vector<std::string> loaded = root.load(converted, true, ignored);
  loaded.erase(
      std::remove_if(loaded.begin(), loaded.end(),
                     [&](const std::string& n) { return std::find(kept.begin(), kept.end(), n) != kept.end(); }),
      loaded.end());
  return loaded;
}

}  // namespace models::vision
