// maskrcnn_reference_util.cpp: see maskrcnn_reference_util.h.
#include "tests/util/maskrcnn_reference_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "engine/safetensors.h"
#include "graph/autograd.h"
#include "models/registry.h"
#include "models/vision/maskrcnn.h"
#include "models/vision/roi_heads.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/view.h"

namespace testutil {

using engine::DType;
using engine::Tensor;

namespace {

// The largest |got - want| over the largest |want|, over the rows (of dimension 0) where `rows` is nonzero (all rows
// when rows is empty).
double relative_error(const Tensor& got, const Tensor& want, const std::vector<double>& rows = {}) {
  const std::vector<double> g = got.to_double(), w = want.to_double();
  EXPECT_EQ(g.size(), w.size());
  const size_t per = rows.empty() ? g.size() : g.size() / rows.size();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < g.size() && i < w.size(); i++) {
    if (!rows.empty() && rows[i / per] == 0) continue;
    diff = std::max(diff, std::abs(g[i] - w[i])), scale = std::max(scale, std::abs(w[i]));
  }
  return diff / std::max(scale, 1e-30);
}

}  // namespace

void expect_maskrcnn_matches_torchvision(const std::string& path, const std::string& size,
                                         std::shared_ptr<engine::Device> device, double tol) {
  engine::DeviceGuard guard(device);
  std::map<std::string, Tensor> file = engine::load_safetensors(path, device);
  std::map<std::string, Tensor> weights, ref;
  for (auto& [name, t] : file) (name.rfind("ref.", 0) == 0 ? ref[name.substr(4)] : weights[name]) = t;
  models::ModelConfig mc;
  mc.name = "maskrcnn";
  mc.size = size;
  models::vision::MaskRcnn model(models::vision::MaskRcnnConfig::from(mc));
  EXPECT_EQ(model.load_weights(weights).size(), weights.size());
  model.module().eval();  // frozen batch norm either way; no dropout
  graph::NoGrad no_grad;
  auto report = [&](const std::string& what, double error, double bound) {
    std::printf("maskrcnn %s vs torchvision: %s relative error %.3g\n", size.c_str(), what.c_str(), error);
    EXPECT_LT(error, bound) << what;
  };
  std::vector<Tensor> levels = model.net().features(ref.at("images"));
  ASSERT_EQ(levels.size(), 5u);
  for (size_t k = 0; k < 5; k++)
    report("P" + std::to_string(k + 2), relative_error(levels[k], ref.at("features." + std::to_string(k))), tol);
  models::vision::RpnHead::Output rpn = model.net().rpn_head_forward(levels);
  for (size_t k = 0; k < 5; k++) {
    report("RPN logits " + std::to_string(k),
           relative_error(rpn.objectness[k], ref.at("objectness." + std::to_string(k))), tol);
    report("RPN codes " + std::to_string(k), relative_error(rpn.deltas[k], ref.at("deltas." + std::to_string(k))), tol);
  }
  levels.pop_back();
  const int64_t mask_pool = model.config().mask_pool;
  const Tensor& rois = ref.at("box.rois");
  Tensor all = ops::full({rois.size(0), rois.size(1)}, 1.0, DType::boolean);
  auto [logits, regression] = model.net().box_head(model.net().pool(levels, rois, all, models::vision::Pooler::box));
  report("class logits", relative_error(logits, ref.at("box.class_logits")), tol);
  report("box regression", relative_error(regression, ref.at("box.box_regression")), tol);
  models::vision::FastRcnnLoss box =
      models::vision::fastrcnn_loss(logits, regression, ref.at("box.labels"), ref.at("box.targets"));
  const std::vector<double> box_want = ref.at("box.loss").to_double();
  report("classifier loss", std::abs(box.classifier.item() - box_want[0]) / box_want[0], 1e-4);
  report("box loss", std::abs(box.box.item() - box_want[1]) / box_want[1], 1e-4);
  // The mask head on each image's foreground slots (label > 0), padded.
  const Tensor& mask_labels = ref.at("mask.labels");
  const int64_t R = mask_labels.numel(), M = 2 * mask_pool;
  Tensor foreground = ops::compare(ops::CompareOp::gt, mask_labels, 0.0);
  Tensor mask_logits =
      model.net().mask_head(model.net().pool(levels, ref.at("mask.rois"), foreground, models::vision::Pooler::mask));
  ASSERT_EQ(mask_logits.shape(), (engine::Shape{R, M, M, model.config().classes}));
  report("mask logits",
         relative_error(mask_logits, ops::reshape(ref.at("mask.logits"), mask_logits.shape()),
                        ops::to(foreground, DType::f32).to_double()),
         tol);
  Tensor loss = models::vision::mask_loss(mask_logits, mask_labels, ops::reshape(ref.at("mask.targets"), {R, M, M}));
  const double mask_want = ref.at("mask.loss").item();
  report("mask loss", std::abs(loss.item() - mask_want) / mask_want, 1e-4);
}

}  // namespace testutil
