// vision/stylegan.h: StyleGAN v1 (Karras et al. 2019, arXiv 1812.04948) as NVlabs/stylegan trains it on FFHQ at
// 1024 x 1024 with the fixed structure (no progressive growing), module names after its TensorFlow variable scopes.
//
//   G_mapping     z [N, 512] -> pixel norm -> 8 dense 512 (equalized lr, lr multiplier 0.01, leaky ReLU 0.2) -> w.
//   G_synthesis   a learned constant [4, 4, 512], then per resolution 4 ... 1024 two layers (18 in all): the first
//                 upsamples (nearest x2 + 3x3 conv below 128, the fused transposed conv with the 4x4 kernel summed
//                 from the 3x3 one from 128 up) and blurs ([1, 2, 1]^2 / 16, depthwise), the second is a 3x3 conv;
//                 every layer ends with noise (ops::add_noise: one [N, H, W, 1] normal draw times a learned strength
//                 per channel, drawn again in backward),
//                 bias, leaky ReLU 0.2, instance norm (eps 1e-8) and the style modulation x (1 + s0) + s1 from a
//                 dense of w; ToRGB (1x1 conv) at 1024. Channels min(8192 / 2^stage, 512): 512 up to 32x32, then
//                 256, 128, 64, 32, 16.
//   D_basic       FromRGB 1x1 at 1024, then per resolution 1024 ... 8: 3x3 conv, blur, 3x3 conv + downscale (the
//                 fused stride-2 4x4 conv from 128 up, else conv then 2x2 average), each + bias + leaky ReLU;
//                 at 4x4 the minibatch standard deviation (group 4, 1 feature; a batch 4 does not divide, which
//                 StyleGAN refuses, takes its largest divisor below 4), a 3x3 conv, dense 512, dense 1.
//   equalized lr  every weight drawn N(0, 1 / lrmul) and scaled at run time by gain / sqrt(fan_in) * lrmul (gain
//                 sqrt 2, 1 for the style denses and ToRGB); biases zero, times lrmul.
//   losses        G: softplus(-D(G(z))) (non-saturating logistic); D: softplus(D(G(z))) + softplus(-D(x)) + the R1
//                 penalty (gamma / 2) |dD(x)/dx|^2 (gamma 10), means over the batch. R1 is a backward pass with
//                 create_graph through D, whose own backward (the second) then runs through the first: the
//                 gradient graph is owned by "D_step.r1", and the rules it recorded run in the ledger's phase
//                 backward2 (the second-order backward) beside D's first-order rules (backward).
//   step          training_loop.py's: the D step (G's images made without a graph, style mixing as in training),
//                 the moving average Gs of G's weights updated, then the G step (its backward reaches D's weights
//                 too: dropped at once). Adam lr 0.003, betas (0, 0.99), eps 1e-8 for both; style mixing with
//                 probability 0.9 (a second z, the crossover layer uniform in [1, 18)); dlatent_avg tracked
//                 (beta 0.995). Gs: beta 0.5^(N / 10000) (G_smoothing_kimg 10), f32 copies in the optimizer
//                 category. --r1-every K: the penalty on every K-th D step only, weighted K (lazy regularization,
//                 as StyleGAN2 does); K = 1 is v1.
//   data          seeded synthetic images painted on the device (rectangles of colours: synthetic_segmentation), or
//                 --data DIR, an image folder such as FFHQ's (models/data/image_set.h: resized, mirrored, [-1, 1]).
// Sizes: 1024 (the study's, default, batch 4) and tiny (32 x 32, narrow, for tests).
#pragma once
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/vision/layers.h"

namespace models::data {
class ImageSet;
}

namespace models::vision {

struct StyleGANConfig {
  int64_t resolution = 1024, latent = 512, dlatent = 512, mapping_layers = 8, mapping_fmaps = 512;
  double mapping_lrmul = 0.01;
  int64_t fmap_base = 8192, fmap_max = 512;
  int64_t batch = 4, mbstd_group = 4;
  double lr = 0.003, beta1 = 0.0, beta2 = 0.99, eps = 1e-8;
  double style_mixing = 0.9, r1_gamma = 10, dlatent_avg_beta = 0.995;
  int64_t r1_every = 1;
  uint64_t seed = 1;
  std::string data;  // --data: an image folder (models/data/image_set.h: FFHQ-style); empty: synthetic images
  int64_t log2_resolution() const;
  int64_t num_layers() const { return 2 * log2_resolution() - 2; }
  int64_t nf(int64_t stage) const;  // feature maps at a stage: min(fmap_base / 2^stage, fmap_max)
  double gs_beta() const;           // 0.5^(batch / 10000)
  static StyleGANConfig from(const ModelConfig& c);
};

// A dense layer with the equalized learning rate: y = x (w coef)^T + b lrmul.
class EqualizedLinear : public graph::Module {
 public:
  EqualizedLinear(int64_t in, int64_t out, double gain, double lrmul = 1, bool bias = true);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;  // [out, in], [out]
  double coef, lrmul;
};

// A convolution's weight with the equalized learning rate (KRSC [out, k, k, in]), and its bias; the layers apply
// them as StyleGAN's conv2d, upscale2d_conv2d and conv2d_downscale2d do.
class EqualizedConv : public graph::Module {
 public:
  EqualizedConv(int64_t in, int64_t out, int64_t kernel, double gain, bool bias = true);
  Tensor scaled_weight() const;                         // weight * coef
  Tensor conv(const Tensor& x) const;                   // 'SAME' conv, no bias
  Tensor conv_up(const Tensor& x, bool fused) const;    // 2x upsampling + conv
  Tensor conv_down(const Tensor& x, bool fused) const;  // conv + 2x downscaling
  Tensor add_bias(const Tensor& x) const;
  Tensor weight, bias;
  int64_t kernel;
  double coef;
};

// The [1, 2, 1] low-pass filter of a feature map of `channels` (a depthwise 3x3 conv with a constant kernel).
class Blur : public graph::Module {
 public:
  explicit Blur(int64_t channels);
  Tensor forward(const Tensor& x) const;
  Tensor filter;  // [C, 3, 3, 1] buffer
};

// One synthesis layer: its conv (none for the constant), then noise, bias, leaky ReLU, instance norm, style.
class SynthesisLayer : public graph::Module {
 public:
  enum class Kind { constant, conv, up };
  SynthesisLayer(Kind kind, int64_t in, int64_t out, int64_t dlatent, bool fused);
  Tensor forward(const Tensor& x, const Tensor& w) const;  // w [N, dlatent]
  Kind kind;
  bool fused;
  std::shared_ptr<EqualizedConv> conv;
  std::shared_ptr<Blur> blur;
  std::shared_ptr<EqualizedLinear> style;  // StyleMod: dlatent -> 2C
  Tensor const_input, noise_strength, bias;
};

class StyleGANGenerator : public graph::Module {
 public:
  explicit StyleGANGenerator(const StyleGANConfig& c);
  Tensor mapping(const Tensor& z) const;  // [N, latent] -> [N, dlatent]
  // Images [N, R, R, 3] from one w per layer (ws[i] [N, dlatent]).
  Tensor synthesis(const std::vector<Tensor>& ws) const;
  std::vector<std::shared_ptr<EqualizedLinear>> mapping_layers;
  std::vector<std::shared_ptr<SynthesisLayer>> layers;
  std::shared_ptr<EqualizedConv> to_rgb;
  Tensor dlatent_avg;  // [dlatent] buffer
};

class StyleGANDiscriminator : public graph::Module {
 public:
  explicit StyleGANDiscriminator(const StyleGANConfig& c);
  Tensor forward(const Tensor& images) const;  // [N, R, R, 3] -> scores [N, 1]
  struct Block {
    std::shared_ptr<EqualizedConv> conv0, conv1;
    std::shared_ptr<Blur> blur;
    bool fused = false;
  };
  std::shared_ptr<EqualizedConv> from_rgb, conv4;
  std::vector<Block> blocks;  // resolution R down to 8
  std::shared_ptr<EqualizedLinear> dense0, dense1;
  int64_t mbstd_group;
};

class StyleGANNet : public graph::Module {
 public:
  explicit StyleGANNet(const StyleGANConfig& c);
  std::shared_ptr<StyleGANGenerator> G;
  std::shared_ptr<StyleGANDiscriminator> D;
};

class StyleGAN : public Model {
 public:
  explicit StyleGAN(const ModelConfig& c);
  explicit StyleGAN(const StyleGANConfig& c);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "img"; }
  int64_t batch_size() const override { return config_.batch; }
  int memory_report_depth() const override { return 2; }
  std::vector<ops::Optimizer*> optimizers() override { return {optimizer_.get(), optimizer_d_.get()}; }
  bool supports_accumulation() const override { return false; }
  bool supports_fixed_batch() const override { return false; }
  // The first R1 step after the optimizer state exists (step r1_every + 1) is in the probe.
  std::vector<int64_t> probe_schedule() const override;
  StepResult train_step(int64_t step) override;
  StyleGANNet& net() { return *net_; }
  const StyleGANConfig& config() const { return config_; }
  const std::vector<std::pair<std::string, Tensor>>& gs() const { return gs_; }
  Batch make_batch(int64_t step) override;  // {"images" [N, R, R, 3]}
  // G's images for latents z [N, latent], with style mixing when `mix` (training); updates dlatent_avg.
  Tensor generate(const Tensor& z, bool mix, std::mt19937_64& rng);
  Tensor loss(const Batch& batch) override;  // the G loss on fresh latents (eval steps)
  // D's loss on real images and G's (graph-free) fake ones: mean softplus(D(fake)) + softplus(-D(real)), with R1
  // ((gamma / 2) |dD(real)/dreal|^2, times r1_every) when `r1`; the penalty per sample [N, 1] into *r1_penalty.
  Tensor discriminator_loss(const Tensor& real, const Tensor& fake, bool r1, Tensor* r1_penalty = nullptr);
  Tensor generator_loss(const Tensor& fake);  // mean softplus(-D(fake))

 protected:
  int64_t items(const Batch& batch) const override { return batch.at("images").size(0); }

 private:
  void build();
  bool r1_step(int64_t step) const { return (step - 1) % config_.r1_every == 0; }
  StyleGANConfig config_;
  std::shared_ptr<StyleGANNet> net_;
  std::unique_ptr<ops::Optimizer> optimizer_d_;     // optimizer_ is G's
  std::vector<std::pair<std::string, Tensor>> gs_;  // Gs: G's moving average, f32, `optimizer` category
  std::shared_ptr<const data::ImageSet> reader_;    // --data; null: synthetic
};

}  // namespace models::vision
