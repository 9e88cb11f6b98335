// registry.cpp: the table of models. An explicit table (not self-registering static objects, which a
// static library's linker may drop) so that what exists is visible in one place.
#include "models/registry.h"

#include <algorithm>
#include <optional>
#include "engine/dist.h"

#include "engine/dist.h"
#include "engine/error.h"
#include "models/bert/pretraining.h"
#include "models/bert/squad.h"
#include "models/convs2s/convs2s.h"
#include "models/mtdnn/mtdnn.h"
#include "models/transformer_lm.h"
#include "models/translation/transformer_big.h"
#include "models/translation/unsupmt.h"
#include "models/vision/deeplabv3.h"
#include "models/vision/maskrcnn.h"
#include "models/vision/nasnet.h"
#include "models/vision/pix2pixhd.h"
#include "models/vision/stylegan.h"
#include "models/vision/yolov3.h"

namespace models {

const std::vector<ModelEntry>& registry() {
  static const std::vector<ModelEntry> table = {
      {"transformer_lm", "decoder-only Transformer language model (GPT-2 shapes; sizes tiny, small, medium, large, xl)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new TransformerLM(c)); },
       kDims | kSeq | kFlash | kGenerate},
      {"bert_base", "BERT-Base masked-LM + next-sentence pretraining (sizes base, large, tiny)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new bert::BertPretraining(c)); },
       kDims | kSeq | kFlash},
      {"bert_squad", "BERT fine-tuning for SQuAD 1.1 span prediction (sizes base, large, tiny)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new bert::BertSquad(c)); }, kDims | kSeq | kFlash},
      {"mtdnn", "MT-DNN: BERT-Large with SAN/linear heads, multi-task GLUE fine-tuning (--task one or a list)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new mtdnn::Mtdnn(c)); },
       kDims | kSeq | kFlash | kTasks},
      {"transformer_big",
       "fairseq's Transformer Big for WMT16 en-de (6+6 layers, d 1024; batches in --tokens; sizes big, tiny)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new translation::TransformerBig(c)); },
       kDims | kTokens | kFlash},
      {"unsupmt",
       "XLM unsupervised MT en-fr: AE per language + greedy back-translation per direction (sizes big, tiny)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new translation::UnsupMT(c)); },
       kDims | kTokens | kFlash},
      {"convs2s",
       "fairseq's fconv_wmt_en_de for WMT14 en-de (15+15 gated conv layers, weight norm, NAG; batches in --tokens; "
       "sizes wmt, tiny)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new convs2s::Convs2s(c)); }, kTokens},
      {"nasnet_large",
       "NASNet-A Large on ImageNet 331x331: stem + 2 stem cells, 3 x 6 cells @ 168 filters (doubling at 2 reduction "
       "cells), aux head, drop path, RMSProp (TF), 1001 classes (sizes imagenet, timm, tiny)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new vision::NasNet(c)); }},
      {"deeplabv3",
       "DeepLabv3 on PASCAL VOC 513x513: ResNet-101 output stride 16 (multi-grid 1/2/4), ASPP 6/12/18 + image pooling, "
       "21 classes (sizes voc, torchvision, tiny)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new vision::DeepLabV3(c)); }},
      {"pix2pixhd",
       "pix2pixHD on Cityscapes 2048x1024: LocalEnhancer G (global 9 ResNet blocks at 1024 + local 3 at 64), 3 "
       "PatchGAN "
       "D with feature matching, frozen VGG19 perceptual loss; one step = G's Adam then D's (sizes 1024p, tiny)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new vision::Pix2PixHD(c)); }},
      {"stylegan",
       "StyleGAN v1 on FFHQ 1024x1024: mapping 8 x 512, style-modulated synthesis from a 4x4 constant (18 layers, "
       "noise, "
       "blur), D_basic with minibatch stddev, logistic losses + R1 (gamma 10); D step then G step (sizes 1024, tiny)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new vision::StyleGAN(c)); }, kR1Every},
      {"yolov3",
       "YOLOv3 on MSCOCO 608x608: Darknet-53 + 3 YOLO scales (19/38/76), 9 anchors, 80 classes, darknet's loss with "
       "on-device targets from 100 box slots (sizes coco, tiny)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new vision::YoloV3(c)); }},
      {"maskrcnn",
       "Mask R-CNN R-50-FPN on MSCOCO 800x1333: frozen-BN ResNet-50 + FPN P2-P6, RPN (3 ratios), box head 2 x FC 1024, "
       "mask head 4 x conv 256, 81 classes; every count fixed (2000 proposals, 512 RoIs, 128 mask RoIs, 100 truths) "
       "(sizes coco, torchvision, tiny)",
       [](const ModelConfig& c) { return std::unique_ptr<Model>(new vision::MaskRcnn(c)); }, kBackbone},
  };
  return table;
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& e : registry()) names.push_back(e.name);
  return names;
}

namespace {

// The sizes a config may ask for, checked before a model builds anything (its host-side data is made from
// them, so a batch of 2^58 would wrap a size computation or fill the host's memory first). Far above what any
// arena holds: a million sequences or images, a million-token sequence, 2^30 tokens per step (one [tokens, 64]
// f32 activation of that is 256 GiB).
constexpr int64_t kMaxBatch = int64_t(1) << 20, kMaxSeq = int64_t(1) << 20, kMaxTokens = int64_t(1) << 30;
constexpr int64_t kDefaultSeqBound = 1024;  // at least the longest default sequence of a registered model

void check_sizes(const ModelConfig& c) {
  auto check = [](const char* flag, int64_t v, int64_t max) {
    ENGINE_CHECK(v >= 0 && v <= max, "--", flag, " ", v, ": expected 0 (the model's default) to ", max,
                 "; a larger step could not fit any arena");
  };
  check("batch", c.batch, kMaxBatch);
  check("seq", c.seq, kMaxSeq);
  check("tokens", c.tokens, kMaxTokens);
  const int64_t tokens = std::max<int64_t>(c.batch, 1) * (c.seq > 0 ? c.seq : kDefaultSeqBound);
  ENGINE_CHECK(tokens <= kMaxTokens, "--batch ", c.batch, " x --seq ",
               c.seq > 0 ? std::to_string(c.seq) : "(default, up to 1024)", " = ", tokens, " tokens per step: at most ",
               kMaxTokens, "; a larger step could not fit any arena");
}

}  // namespace

bool model_takes(const std::string& name, Takes t) {
  for (const auto& e : registry())
    if (e.name == name) return e.has(t);
  return false;
}

std::string models_taking(Takes t) {
  std::string s;
  for (const auto& e : registry())
    if (e.has(t)) s += (s.empty() ? "" : ", ") + e.name;
  return s;
}

std::unique_ptr<Model> create_model(const ModelConfig& config) {
  for (const auto& e : registry())
    if (e.name == config.name) {
      check_sizes(config);
      // A field the model does not take is an error naming the models that do (a model ignoring it would train
      // something other than what was asked).
      ENGINE_CHECK(
          !config.dims.any() || e.has(kDims), config.name,
          " is not a transformer: --layers, --hidden, --heads, --ffn, --vocab, --positions and --config are for ",
          models_taking(kDims), "; ", config.name, " has its own sizes (--size)");
      ENGINE_CHECK(config.seq == 0 || e.has(kSeq), "--seq sets the sequence length of ", models_taking(kSeq), "; ",
                   config.name, " takes none (an image model's --size sets its images' shape; a translation ",
                   "model's sentence lengths come from its data, its batches in --tokens)");
      ENGINE_CHECK(config.tokens == 0 || e.has(kTokens), "--tokens counts the batches of ", models_taking(kTokens),
                   "; ", config.name, "'s batch is --batch");
      ENGINE_CHECK(config.attention == "naive" || e.has(kFlash), "--attention ", config.attention, " is for ",
                   models_taking(kFlash), "; ", config.name, " has no multi-head attention with a flash path");
      ENGINE_CHECK(config.task.empty() || e.has(kTasks), "--task chooses the tasks of ", models_taking(kTasks), "; ",
                   config.name, " has one task");
      const Precision precision = precision_from_name(config.precision);  // a bad name fails before building
      ENGINE_CHECK(config.backbone.empty() || e.has(kBackbone), "--backbone chooses ", models_taking(kBackbone),
                   "'s ResNet (r50, r101); ", config.name, " has one backbone (its --size chooses the rest)");
      ENGINE_CHECK(config.generate == 0 || e.has(kGenerate), "--generate is for decoder language models (",
                   models_taking(kGenerate), "); ", config.name,
                   " generates by its own rule under --inference, or not at all");
      ENGINE_CHECK(config.r1_every == 1 || e.has(kR1Every), "--r1-every is ", models_taking(kR1Every),
                   "'s (its R1 penalty); ", config.name, " has none");
      ENGINE_CHECK(config.generate == 0 || config.inference, "--generate decodes in eval steps: add --inference");
      // Inference in bf16/fp16: the parameters are made in that dtype as they are built (no f32 copy of them all).
      std::optional<graph::ParameterDtypeScope> low;
      if (config.inference && compute_dtype(precision) != engine::DType::f32) low.emplace(compute_dtype(precision));
      std::unique_ptr<Model> model = e.create(config);
      low.reset();
      if (!config.optimizer.empty()) model->use_optimizer(config.optimizer);
      model->set_accumulation(config.accumulate);
      model->set_precision(precision, /*keep_masters=*/!config.inference);
      if (config.world_size > 1 && engine::default_device()->type() == engine::DeviceType::meta)
        model->set_data_parallel(engine::dist::meta_world(config.world_size, config.rank),
                                 size_t(config.bucket_mb) << 20, config.zero, config.bucket_view);
      return model;
    }
  std::string valid;
  for (const auto& n : model_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw engine::Error(engine::str("unknown model '", config.name, "': valid models are ", valid));
}

}  // namespace models
