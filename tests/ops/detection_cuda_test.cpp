// detection_cuda_test.cpp: topk, box_iou and nms on the GPU against the cpu reference, exactly (indices, values,
// IoUs and kept lists), at the RPN's sizes (a level's anchors: tens of thousands per row, k 2000, many ties) and
// odd ones; the ledger against meta.
#include <gtest/gtest.h>

#include <random>

#include "engine/device.h"
#include "engine/rng.h"
#include "ops/detection.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/view.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Tensor;
using testutil::to_cuda;

namespace {

Tensor random_boxes(int64_t N, int64_t K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<float> b;
  for (int64_t i = 0; i < N * K; i++) {
    const double x = u(rng) * 800, y = u(rng) * 600, w = 5 + u(rng) * 200, h = 5 + u(rng) * 200;
    b.insert(b.end(), {float(x), float(y), float(x + w), float(y + h)});
  }
  return ops::from_vector(b, {N, K, 4}, DType::f32);
}

}  // namespace

TEST(DetectionCuda, TopkEqualsTheCpus) {
  std::mt19937_64 rng(3);
  struct Case {
    int64_t N, K, k;
  };
  for (const Case& c : {Case{2, 201600, 2000}, Case{3, 12345, 4096}, Case{5, 1000, 1}, Case{1, 77, 77}})
    for (DType dt : {DType::f32, DType::bf16}) {
      std::vector<double> v(size_t(c.N * c.K));
      for (double& e : v) e = double(int64_t(rng() % 2001) - 1000) / 64;  // ties at every k
      Tensor x = ops::from_vector(v, {c.N, c.K}, dt);
      ops::TopK cpu = ops::topk(x, c.k), gpu = ops::topk(to_cuda(x), c.k);
      const std::string what = engine::str("topk ", engine::dtype_name(dt), " N ", c.N, " K ", c.K, " k ", c.k);
      testutil::expect_equal(what + ": indices", cpu.indices, gpu.indices);
      testutil::expect_equal(what + ": values", cpu.values, gpu.values);
    }
}

TEST(DetectionCuda, BoxIouAndNmsEqualTheCpus) {
  for (int64_t K : {int64_t(2000), int64_t(131), int64_t(1)}) {
    Tensor boxes = random_boxes(2, K, uint64_t(K));
    Tensor cb = to_cuda(boxes);
    testutil::expect_equal(engine::str("box_iou K ", K), ops::box_iou(boxes, boxes), ops::box_iou(cb, cb));
    Tensor valid = ops::compare(ops::CompareOp::gt, ops::slice(boxes, 2, 0, 1), 100.0);  // x1 > 100
    valid = ops::contiguous(ops::reshape(valid, {2, K}));
    for (double thr : {0.5, 0.7})
      for (int64_t cap : {int64_t(1000), int64_t(3000)}) {
        const std::string what = engine::str("nms K ", K, " threshold ", thr, " cap ", cap);
        testutil::expect_equal(what, ops::nms(boxes, Tensor(), thr, cap), ops::nms(cb, Tensor(), thr, cap));
        testutil::expect_equal(what + " masked", ops::nms(boxes, valid, thr, cap),
                               ops::nms(cb, to_cuda(valid), thr, cap));
      }
  }
}

TEST(DetectionCuda, BoxCoderAndMatcherEqualTheCpus) {
  Tensor anchors = random_boxes(2, 5000, 7), truths = random_boxes(2, 40, 8);
  Tensor ca = to_cuda(anchors), ct = to_cuda(truths);
  ops::BoxCoderParams p;
  p.wx = 10, p.wy = 10, p.ww = 5, p.wh = 5;
  // Encoding and decoding use exp / log, whose GPU versions differ from glibc's by an ulp or so.
  Tensor codes = ops::box_encode(random_boxes(2, 5000, 9), anchors, p);
  Tensor gpu_codes = ops::box_encode(to_cuda(random_boxes(2, 5000, 9)), ca, p);
  EXPECT_TRUE(testutil::expect_close("box_encode", codes, gpu_codes, {1e-5, 1e-5}));
  Tensor hw = ops::from_vector(std::vector<float>{600, 800, 500, 700}, {2, 2}, DType::f32);
  EXPECT_TRUE(testutil::expect_close("box_decode", ops::box_decode(codes, anchors, p, hw),
                                     ops::box_decode(to_cuda(codes), ca, p, to_cuda(hw)), {1e-3, 1e-5}));
  // Matching compares IoUs that are equal on both devices: the same matches exactly.
  Tensor iou = ops::box_iou(truths, anchors), gpu_iou = ops::box_iou(ct, ca);
  Tensor valid =
      ops::contiguous(ops::reshape(ops::compare(ops::CompareOp::lt, ops::slice(truths, 2, 0, 1), 700.0), {2, 40}));
  for (bool low_quality : {true, false})
    testutil::expect_equal(engine::str("match_boxes low quality ", low_quality),
                           ops::match_boxes(iou, valid, 0.7, 0.3, low_quality),
                           ops::match_boxes(gpu_iou, to_cuda(valid), 0.7, 0.3, low_quality));
}

// The ops built from others: anchors, levels and the sampler's draws (ops::rand reserves the same Philox numbers on
// every device) equal the cpu's.
TEST(DetectionCuda, AnchorsLevelsAndSamplesEqualTheCpus) {
  testutil::expect_equal("grid_anchors", ops::grid_anchors(50, 84, 16, 16, {128}, {0.5, 1.0, 2.0}),
                         ops::grid_anchors(50, 84, 16, 16, {128}, {0.5, 1.0, 2.0}, testutil::cuda_device()));
  Tensor boxes = random_boxes(2, 3000, 5);
  testutil::expect_equal("fpn_levels", ops::fpn_levels(boxes), ops::fpn_levels(to_cuda(boxes)));
  Tensor iou = ops::box_iou(random_boxes(2, 20, 6), boxes);
  Tensor m = ops::match_boxes(iou, Tensor(), 0.7, 0.3, true);
  Tensor labels = ops::to(ops::compare(ops::CompareOp::ge, m, 0.0), DType::i64);  // 1 matched, 0 background
  engine::manual_seed(21);
  ops::Sampled cpu = ops::sample_balanced(labels, 256, 0.5);
  Tensor gpu_labels = to_cuda(labels);
  engine::manual_seed(21);
  ops::Sampled gpu;
  {
    engine::DeviceGuard guard(testutil::cuda_device());
    gpu = ops::sample_balanced(gpu_labels, 256, 0.5);
  }
  testutil::expect_equal("sample_balanced index", cpu.index, gpu.index);
  testutil::expect_equal("sample_balanced label", cpu.label, gpu.label);
}

TEST(DetectionCuda, PolygonMasksEqualTheCpus) {
  // Mask R-CNN's sizes: 100 truths of 4 parts of up to 64 vertices (random, self-intersecting too), 128 RoIs of
  // 28 x 28 per image, some with no truth.
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(0, 1);
  const int64_t N = 2, G = 100, P = 4, V = 64, R = 128;
  std::vector<float> xy(size_t(N * G * P * V * 2));
  for (auto& v : xy) v = float(u(rng) * 600);
  std::vector<int64_t> counts(size_t(N * G * P)), truth(size_t(N * R));
  for (auto& c : counts) c = int64_t(rng() % 70);  // some empty, some past V (clamped)
  for (auto& t : truth) t = int64_t(rng() % (G + 2)) - 1;
  Tensor polys = ops::from_vector(xy, {N, G, P, V, 2}, DType::f32);
  Tensor cnt = ops::from_vector(counts, {N, G, P}, DType::i64), which = ops::from_vector(truth, {N, R}, DType::i64);
  Tensor rois = random_boxes(N, R, 10);
  testutil::expect_equal("polygon_masks", ops::polygon_masks(polys, cnt, rois, which, 28),
                         ops::polygon_masks(to_cuda(polys), to_cuda(cnt), to_cuda(rois), to_cuda(which), 28));
}

TEST(DetectionCuda, LedgerMatchesMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor boxes = random_boxes(2, 700, 1);
    ops::TopK t = ops::topk(ops::reshape(ops::slice(boxes, 2, 0, 1), {2, 700}), 300);
    Tensor iou = ops::box_iou(boxes, boxes);
    Tensor keep = ops::nms(boxes, Tensor(), 0.7, 100);
    Tensor masks =
        ops::polygon_masks(ops::full({2, 3, 2, 5, 2}, 1.0, DType::f32), ops::full({2, 3, 2}, 5.0, DType::i64), boxes,
                           ops::full({2, 700}, 1.0, DType::i64), 28);
  });
}
