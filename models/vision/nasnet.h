// vision/nasnet.h: NASNet-A Large (Zoph et al. 2018, "Learning Transferable Architectures for Scalable Image
// Recognition"; tensorflow/models research/slim/nets/nasnet, large_imagenet_config) for ImageNet at 331 x 331.
//
// The network is timm's nasnetalarge module for module (Cadene's port of the slim graph), so that its state
// dict loads by name: conv0 (3x3 stride 2, no padding) + BN, two stem reduction cells (cell_stem_0,
// cell_stem_1), then three stacks of 6 cells (cell_0 .. cell_17; each stack's first cell is a FirstCell whose
// previous input is halved by the factorized reduction, the others NormalCells) with reduction_cell_0 and
// reduction_cell_1 between them; 168 channels per operation in the first stack, doubling at each reduction;
// ReLU, global average pooling, dropout and last_linear (4032 -> classes).
//   A cell combines its two inputs in 5 pairs ("comb_iter_k_left/right"): separable convolutions (ReLU,
//   depthwise k x k, pointwise 1x1, BN, twice: BranchSeparables), 3x3 average or max pooling and identities;
//   the pairs are added and the cell's output is the concatenation of the unused ones (6 in a normal cell,
//   4 in a reduction cell).
//   Padding is TensorFlow's 'SAME', as timm computes it: symmetric (k - 1) / 2 at stride 1; at stride 2 the
//   total pad max((ceil(in/2) - 1) 2 + k - in, 0) split with the extra row and column at the bottom/right
//   (asymmetric only where in is even: reduction_cell_0's 42 x 42). timm's stride-2 average pools count the
//   zeros of that padding in their divisor (TF's do not); the engine follows timm, the parity reference.
//   BN: eps 1e-3, momentum 0.1 (timm; slim's decay 0.9997 is momentum 3e-4).
// What the engine adds from the slim recipe (both off in --size timm, for parity):
//   aux head      after cell_11 (before the last reduction), training only: ReLU, 5x5 average pool stride 3
//                 (valid), 1x1 conv 128 + BN + ReLU, a conv over the whole 6 x 6 map to 768 + BN + ReLU, fc to
//                 the classes; its loss weighs 0.4 (names aux_head.*: timm's model has none).
//   drop path     on the output of every operation but the identities, keep probability 0.7 scaled by the
//                 cell's depth (1 - (cell + 1) / 22 x 0.3, the stem cells being cells 0 and 1) and by training
//                 progress (x min(1, step / 250000)): slim's drop_connect_version v3. One Philox number per
//                 sample, nothing saved (ops::drop_path).
//   loss          label-smoothed cross-entropy (0.1) of the logits, + 0.4 x that of the aux logits.
//   training      RMSProp in TensorFlow's form (ops::RmsProp tf_style: decay 0.9, momentum 0.9, eps 1.0 inside
//                 the square root), lr 0.015 per 16 images (slim's per-replica batch) decayed by 0.97 every 2.4
//                 epochs of 1,281,167 images, weight decay 5e-5 (slim's L2), global gradient clipping at 10.
//                 1001 classes (ImageNet's 1000 + background, as slim). fp32.
// Sizes: imagenet (default: 331 x 331, batch 32), timm (the same network without aux head, drop path and
// dropout, for parity with timm.create_model('nasnetalarge', num_classes=1001)), tiny (the tests': 96 x 96,
// stem 8, 4 channels per operation, 2 cells per stack, 5 classes).
// --recompute cell: every cell keeps only its two inputs and runs again in backward (graph::recompute).
// Data: seeded synthetic images (one rectangle of the class's colour on a background, painted on the device:
// ops::paint_rectangles), or --data DIR, an ImageNet-style folder (models/data/classification.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/vision/layers.h"

namespace models::data {
class ClassificationSet;
}

namespace models::vision {

struct NasNetConfig {
  int64_t stem_size = 96;       // conv0's channels
  int64_t channels = 168;       // per operation in the first stack (timm: num_features / 24)
  int64_t cells_per_stack = 6;  // one FirstCell + NormalCells; at least 2
  int64_t classes = 1001;
  int64_t image_size = 331, batch = 32;
  bool aux_head = true;
  int64_t aux_proj = 128, aux_hidden = 768;  // the aux head's 1x1 and whole-map convolutions
  double aux_weight = 0.4;
  double drop_path_keep = 0.7;       // 1: off
  int64_t drop_path_steps = 250000;  // updates over which drop path ramps up (slim's total_training_steps)
  double dropout = 0.5;              // before last_linear
  double label_smoothing = 0.1;
  double lr_per_image = 0.015 / 16;  // slim: 0.015 for 16 images per replica
  double lr_decay = 0.97, lr_decay_epochs = 2.4;
  int64_t epoch_images = 1281167;  // ImageNet's training set
  double rmsprop_decay = 0.9, rmsprop_momentum = 0.9, rmsprop_eps = 1.0, weight_decay = 5e-5, clip_norm = 10;
  bool recompute_cells = false;
  std::string data;
  uint64_t seed = 1;
  int64_t num_cells() const { return 3 * cells_per_stack + 2 + 2; }  // normal + reduction + stem cells
  // imagenet (default) | timm | tiny, then --batch, --recompute, --data, --seed.
  static NasNetConfig from(const ModelConfig& c);
};

// The spatial sizes of the feature maps for an S x S image: conv0 (3x3 stride 2, no padding), then each stride-2
// cell halves, rounding up (TF 'SAME'): {conv0, stem 0, stem 1, reduction 0, reduction 1}. 331: 165 83 42 21 11.
std::vector<int64_t> nasnet_feature_sizes(int64_t image_size);

// ReLU -> 1x1 conv (no bias) -> BN: timm's ActConvBn.
class ActConvBn : public graph::Module {
 public:
  ActConvBn(int64_t in, int64_t out);
  Tensor forward(const Tensor& x) const;
  Tensor forward_relu(const Tensor& relu_x) const;  // given ReLU(x)
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
};

// depthwise k x k with TensorFlow's 'SAME' padding, then pointwise 1x1, no biases: timm's SeparableConv2d. The
// padding (ops::same_pool_padding's split, computed from the input's size at each call) goes into the convolution
// when it is symmetric, else an explicit zero pad2d comes first (timm's Conv2dSame does the same).
class SeparableConv2d : public graph::Module {
 public:
  SeparableConv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride);
  Tensor forward(const Tensor& x) const;
  int64_t kernel, stride;
  std::shared_ptr<Conv2d> depthwise_conv2d, pointwise_conv2d;
};

// ReLU, separable (stride), BN, ReLU, separable, BN: timm's BranchSeparables. The first separable widens to `out`
// in a stem cell (its input is conv0's 96 channels), else the second does.
class BranchSeparables : public graph::Module {
 public:
  BranchSeparables(int64_t in, int64_t out, int64_t kernel, int64_t stride, bool stem_cell = false);
  Tensor forward(const Tensor& x) const;
  Tensor forward_relu(const Tensor& relu_x) const;  // given ReLU(x)
  std::shared_ptr<SeparableConv2d> separable_1, separable_2;
  std::shared_ptr<BatchNorm2d> bn_sep_1, bn_sep_2;
};

// One NASNet-A cell, normal or reduction, described by a table (nasnet.cpp) of its five combinations.
//   Its inputs: x (the previous cell's output) and x_prev (the one before). It first makes
//     R = conv_1x1(x)      (ActConvBn to `filters` channels)
//     L = one of           raw          x itself (cell_stem_0, whose x_prev is its x)
//                          factorized   slim's factorized reduction of ReLU(x_prev): a 1x1 conv (path_1.conv) of
//                                       its even pixels and one (path_2.conv) of the pixels one down and right
//                                       (ZeroPad2d((-1, 1, -1, 1)): the last row and column zero), filters / 2
//                                       channels each, concatenated, final_path_bn (cell_stem_1, the FirstCells,
//                                       whose x_prev is twice the size of x)
//                          conv         conv_prev_1x1(x_prev) (ActConvBn; the other cells)
//   normal     comb0 = sep5(R) + sep3(L)    comb1 = sep5(L) + sep3(L)    comb2 = avg3(R) + L
//              comb3 = avg3(L) + avg3(L)    comb4 = sep3(R) + R;         output cat(L, comb0 .. comb4): 6 filters
//   reduction  comb0 = sep5/2(R) + sep7/2(L)   comb1 = max3/2(R) + sep7/2(L)   comb2 = avg3/2(R) + sep5/2(L)
//              comb3 = avg3(comb0) + comb1     comb4 = sep3(comb0) + max3/2(R); output cat(comb1 .. comb4): 4 filters
//   (sepK: BranchSeparables k x k; /2: stride 2; avg3 at stride 1 pads 1 and does not count the padding; stride-2
//   pools pad TF 'SAME', the average counting those zeros as timm's AvgPool2dSame does, the max ignoring them.)
//   Each combination's operands are named comb_iter_<k>_left / _right as in timm. Drop path multiplies every
//   operand but the identities (L, R, comb1 in comb3) when training.
class NasNetCell : public graph::Module {
 public:
  enum class Kind { normal, reduction };
  enum class Left { raw, factorized, conv };
  NasNetCell(Kind kind, Left left, int64_t in_left, int64_t in_right, int64_t filters);
  // keep: drop path's keep probability in this forward (1: none).
  Tensor forward(const Tensor& x, const Tensor& x_prev, double keep) const;
  int64_t out_channels() const { return (kind == Kind::normal ? 6 : 4) * filters; }
  Kind kind;
  Left left;
  int64_t filters;

  // One operand of a combination: an operation on a tensor of the cell.
  enum class Op { separable, avg_pool, max_pool, identity };
  enum Input { kL, kR, kComb0, kComb1 };
  struct Operand {
    Op op;
    Input input;
    int64_t kernel, stride;
    std::shared_ptr<BranchSeparables> separable;  // Op::separable
  };
  struct Combination {
    Operand left, right;
  };

 private:
  Tensor left_input(const Tensor& x_prev, const Tensor& relu_prev) const;
  Tensor apply(const Operand& o, const Tensor& in, const Tensor& relu_in, double keep) const;
  std::shared_ptr<ActConvBn> conv_1x1, conv_prev_1x1;
  std::shared_ptr<Conv2d> path_1, path_2;  // Left::factorized
  std::shared_ptr<BatchNorm2d> final_path_bn;
  std::vector<Combination> combinations;
};

// slim's auxiliary head (see above), on ReLU of a cell's output.
class NasNetAuxHead : public graph::Module {
 public:
  NasNetAuxHead(int64_t in, int64_t map_size, int64_t proj, int64_t hidden, int64_t classes);
  Tensor forward(const Tensor& x) const;  // [N, h, w, in] -> [N, classes]
  std::shared_ptr<Conv2d> proj, conv;
  std::shared_ptr<BatchNorm2d> proj_bn, conv_bn;
  std::shared_ptr<nn::Linear> fc;
};

class NasNetNet : public graph::Module {
 public:
  explicit NasNetNet(const NasNetConfig& c);
  struct Output {
    Tensor logits, aux_logits;  // [N, classes]; aux only in training with the aux head
  };
  // step: the optimizer updates done (drop path's schedule).
  Output forward(const Tensor& images, int64_t step) const;  // images [N, S, S, 3]
  // The keep probability drop path uses in cell `cell` (network order, the stem cells 0 and 1) after `step` updates.
  double drop_path_keep(int64_t step, int64_t cell) const;
  NasNetConfig config;
  std::shared_ptr<Conv2d> conv0;
  std::shared_ptr<BatchNorm2d> conv0_bn;
  std::vector<std::shared_ptr<NasNetCell>> cells;  // cell_stem_0, cell_stem_1, then network order
  std::vector<std::string> cell_names;
  // For cells[i]: the feature maps it reads, as indices into the list {conv0, cells[0], cells[1], ...}.
  std::vector<size_t> x_of, prev_of;
  size_t aux_after = 0;  // the aux head reads cells[aux_after]'s output
  std::shared_ptr<NasNetAuxHead> aux_head;
  std::shared_ptr<nn::Linear> last_linear;
};

// Seeded synthetic classification images, made on `device`: one rectangle (a third to two thirds of the side,
// covering the centre pixel) of class k's fixed colour (+ noise) per image on a background colour; labels [N] i64
// (the class). The same (seed, step) gives the same batch everywhere.
struct ClassificationBatch {
  Tensor images, labels;
};
ClassificationBatch synthetic_classification(int64_t batch, int64_t size, int64_t classes, uint64_t seed, int64_t step,
                                             engine::DType dtype = engine::DType::f32,
                                             std::shared_ptr<engine::Device> device = nullptr);

class NasNet : public Model {
 public:
  explicit NasNet(const ModelConfig& c);
  explicit NasNet(const NasNetConfig& c);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "img"; }
  int64_t batch_size() const override { return config_.batch; }
  // The aux head batch-normalizes [N, 1, 1, 768]: one value per channel at N = 1.
  int64_t min_batch() const override { return config_.aux_head ? 2 : 1; }
  int memory_report_depth() const override { return 1; }  // one row per cell
  // timm state dicts (OIHW convolutions, num_batches_tracked; without the aux head, whose parameters then keep
  // their values) and engine checkpoints alike.
  std::vector<std::string> load_weights(const std::map<std::string, Tensor>& tensors) override;
  StepResult train_step(int64_t step) override;
  NasNetNet& net() { return *net_; }
  const NasNetConfig& config() const { return config_; }
  Batch make_batch(int64_t step) override;  // {"images" [N, S, S, 3], "labels" [N] i64}
  Tensor loss(const Batch& batch) override;

 protected:
  int64_t items(const Batch& batch) const override { return batch.at("images").size(0); }

 private:
  void build();
  NasNetConfig config_;
  std::shared_ptr<NasNetNet> net_;
  std::shared_ptr<const data::ClassificationSet> reader_;
  Tensor last_main_, last_aux_;  // the step's two losses, detached (reporting)
};

}  // namespace models::vision
