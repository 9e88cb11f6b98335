// vision/pix2pixhd.h: pix2pixHD (Wang et al. 2018, arXiv 1711.11585) as NVIDIA/pix2pixHD trains it on Cityscapes at
// 2048 x 1024 (scripts/train_1024p_24G.sh: --netG local --ngf 32 --num_D 3), parameter names as its state dicts.
//
//   netG   LocalEnhancer. netG.model: the global generator (ngf 2 x 32 = 64) on the input average-pooled to half
//          size: reflect-pad 3 + 7x7 conv (model.1), 4 stride-2 3x3 convs doubling the channels to 1024
//          (model.4, .7, .10, .13), 9 ResNet blocks of 1024 (model.16 ... .24: reflect-pad 1, 3x3 conv,
//          instance norm, ReLU, reflect-pad 1, 3x3 conv, instance norm; conv_block.1 and conv_block.5), 4 stride-2
//          transposed convs halving them back to 64 (model.25, .28, .31, .34); every conv but the last of a
//          block followed by instance norm (no affine) and ReLU. netG.model1_1 at full size: reflect-pad 3 + 7x7
//          conv to 32, 3x3 stride-2 conv to 64; its output plus the global generator's. netG.model1_2: 3 ResNet
//          blocks of 64, a transposed conv to 32, reflect-pad 3 + 7x7 conv to 3 channels, tanh.
//   netD   3 PatchGAN discriminators (netD.scale{0,1,2}_layer{0..4}.0): 4x4 convs, padding 2, to 64, 128, 256
//          (stride 2) and 512 (stride 1), then 1 channel; LeakyReLU 0.2, instance norm after all but the first and
//          the last. Scale 2 sees the full-size input (label channels + image), scale 1 and 0 it average-pooled
//          (3x3, stride 2, padding 1, count_include_pad false) once and twice. Each returns its 5 layer outputs.
//   vgg    torchvision's vgg19 features up to relu5_1 (vgg.features.N, N its index in vgg19().features), frozen:
//          no gradients, no optimizer state. Its 5 slices' outputs (relu1_1 ... relu5_1) feed the perceptual loss.
//
// Input: one-hot labels (35 classes) and the instance-edge map (1 where a pixel's instance id differs from a
// 4-neighbour's), both computed on the device: 36 channels. D sees them with the image: 39.
// Losses (pix2pixHD_model.py): LSGAN (MSE to 1 or 0 of each scale's last output);
//   loss_D = (D_fake + D_real) / 2 with the fake image detached,
//   loss_G = G_GAN + 10 sum_i sum_{j<4} (1/3) L1(D_i,j(fake), D_i,j(real) detached)
//                  + 10 sum_k w_k L1(vgg_k(fake), vgg_k(real)),   w = 1/32, 1/16, 1/8, 1/4, 1.
// A step is train.py's: one forward computes every loss (G, D on the detached fake, D on the real image, D on the
// fake for G), then G's Adam steps on loss_G's gradients, then D's gradients (those loss_G left in D are dropped
// by its zero_grad) are taken from loss_D and D's Adam steps. Both Adam lr 2e-4, betas (0.5, 0.999); fp32 (bf16:
// each Adam keeps its network's f32 masters; VGG19 is only lowered), conv weights normal(0, 0.02)
// (networks.weights_init), biases zero (PyTorch's default would be uniform: parity runs load the weights).
// Sizes: 1024p (the study's, default: 2048 x 1024, batch 1) and tiny (tests: 128 x 64, 5 classes, narrow nets).
// Data: synthetic label maps (3 to 8 rectangles of classes, each its own instance) and images (the class's colour
// plus noise), painted on the device by ops::paint_rectangles from a scene table the host draws from (seed, step)
// (painting 2048 x 1024 pixels on the host took a quarter of a bf16 step on the H200); or --data DIR, a
// Cityscapes-style folder (models/data/cityscapes.h: pix2pixHD's resize, flip and [-1, 1] images), decoded on the
// host per step.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/vision/layers.h"

namespace models::data {
class CityscapesSet;
}

namespace models::vision {

struct Pix2PixHDConfig {
  int64_t label_nc = 35, output_nc = 3;
  int64_t ngf = 32, n_downsample_global = 4, n_blocks_global = 9, n_blocks_local = 3;
  int64_t ndf = 64, n_layers_d = 3, num_d = 3;
  std::vector<int64_t> vgg_widths = {64, 128, 256, 512, 512};  // torchvision's vgg19 (tiny: narrower)
  int64_t height = 1024, width = 2048, batch = 1;
  double lr = 2e-4, beta1 = 0.5, beta2 = 0.999, lambda_feat = 10;
  bool recompute_blocks = false;  // --recompute layer: the ResNet blocks keep only their inputs
  uint64_t seed = 1;
  std::string data;  // --data: a Cityscapes-style folder (models/data/cityscapes.h); empty: synthetic data
  int64_t input_channels() const { return label_nc + 1; }  // one-hot labels + the edge map
  static Pix2PixHDConfig from(const ModelConfig& c);
};

class ResnetBlock : public graph::Module {
 public:
  explicit ResnetBlock(int64_t dim);
  Tensor forward(const Tensor& x) const;  // x + (pad, conv, IN, ReLU, pad, conv, IN)(x)
  std::shared_ptr<Conv2d> conv1, conv5;   // conv_block.1, conv_block.5
};

// netG.
class LocalEnhancer : public graph::Module {
 public:
  explicit LocalEnhancer(const Pix2PixHDConfig& c);
  Tensor forward(const Tensor& input) const;  // [N, H, W, 36] -> [N, H, W, 3] in (-1, 1)
  struct Global : graph::Module {             // netG.model
    std::shared_ptr<Conv2d> stem;
    std::vector<std::shared_ptr<Conv2d>> down;
    std::vector<std::shared_ptr<ResnetBlock>> blocks;
    std::vector<std::shared_ptr<ConvTranspose2d>> up;
  };
  struct LocalDown : graph::Module {  // netG.model1_1
    std::shared_ptr<Conv2d> stem, down;
  };
  struct LocalUp : graph::Module {  // netG.model1_2
    std::vector<std::shared_ptr<ResnetBlock>> blocks;
    std::shared_ptr<ConvTranspose2d> up;
    std::shared_ptr<Conv2d> last;
  };
  std::shared_ptr<Global> global;
  std::shared_ptr<LocalDown> local_down;
  std::shared_ptr<LocalUp> local_up;
  bool recompute_blocks = false;
};

// netD: every scale's 5 layer outputs, full size first (scale num_d - 1) as pix2pixHD orders them.
class MultiscaleDiscriminator : public graph::Module {
 public:
  explicit MultiscaleDiscriminator(const Pix2PixHDConfig& c);
  std::vector<std::vector<Tensor>> forward(const Tensor& input) const;
  std::vector<std::vector<std::shared_ptr<Conv2d>>> scales;  // scales[i][j]: scale{i}_layer{j}.0
};

// vgg: the 5 slice outputs.
class Vgg19Features : public graph::Module {
 public:
  explicit Vgg19Features(const std::vector<int64_t>& widths);
  std::vector<Tensor> forward(const Tensor& x) const;
  std::vector<std::pair<int64_t, std::shared_ptr<Conv2d>>> convs;  // (index in vgg19().features, conv)
};

class Pix2PixHDNet : public graph::Module {
 public:
  explicit Pix2PixHDNet(const Pix2PixHDConfig& c);
  std::shared_ptr<LocalEnhancer> netG;
  std::shared_ptr<MultiscaleDiscriminator> netD;
  std::shared_ptr<Vgg19Features> vgg;
};

class Pix2PixHD : public Model {
 public:
  explicit Pix2PixHD(const ModelConfig& c);
  explicit Pix2PixHD(const Pix2PixHDConfig& c);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "img"; }
  int64_t batch_size() const override { return config_.batch; }
  // netG.model (the global generator), netG.model1_1 / model1_2 (the local enhancer), loss_D.D0-D2 (each D scale on
  // the detached fake and the real image), loss_G.D0-D2 and loss_G.vgg (on the fake, for G's losses), update_G/D.
  int memory_report_depth() const override { return 2; }
  std::vector<std::string> load_weights(const std::map<std::string, Tensor>& tensors) override;
  std::vector<ops::Optimizer*> optimizers() override { return {optimizer_.get(), optimizer_d_.get()}; }
  bool supports_accumulation() const override { return false; }
  bool supports_fixed_batch() const override { return false; }
  StepResult train_step(int64_t step) override;
  Pix2PixHDNet& net() { return *net_; }
  const Pix2PixHDConfig& config() const { return config_; }
  // {"labels" [N, H, W, 1] (class ids, i64), "instances" [N, H, W, 1] (ids, i64), "images" [N, H, W, 3]}.
  Batch make_batch(int64_t step) override;
  // The generator's input: one-hot labels and the edge map, [N, H, W, label_nc + 1].
  Tensor encode_input(const Batch& batch) const;
  struct Losses {
    Tensor g_gan, g_feat, g_vgg, d_real, d_fake, loss_g, loss_d;
  };
  Losses losses(const Batch& batch);
  Tensor loss(const Batch& batch) override;  // loss_G (eval steps)

 protected:
  int64_t items(const Batch& batch) const override { return batch.at("images").size(0); }

 private:
  void build();
  Pix2PixHDConfig config_;
  std::shared_ptr<Pix2PixHDNet> net_;
  std::unique_ptr<ops::Optimizer> optimizer_d_;        // optimizer_ is G's
  std::shared_ptr<const data::CityscapesSet> reader_;  // --data; null: synthetic
};

}  // namespace models::vision
