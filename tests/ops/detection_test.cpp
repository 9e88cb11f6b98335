// detection_test.cpp: topk, box_iou and nms against naive references written here (a full sort with the stated
// order, IoU in f64 from its definition, greedy NMS in plain loops), with ties, NaN, signed zeros, degenerate and
// duplicate boxes, suppression chains, the valid mask and the output's padding; box encoding and decoding against
// their formulas (round trip, clamp, clip) and match_boxes against its rule; torchvision's own utilities on the same
// boxes (tests/data/detection_reference.safetensors, from tools/bench/detection_parity.py); errors; meta.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/device.h"
#include "engine/rng.h"
#include "engine/safetensors.h"
#include "ops/detection.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/view.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;

namespace {

// The order topk promises, on doubles: NaN above everything, -0 == +0, equal values by lower index.
bool before(double a, int64_t i, double b, int64_t j) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return i < j;
}

std::vector<int64_t> naive_topk(const std::vector<double>& row, int64_t k) {
  std::vector<int64_t> idx(row.size());
  for (size_t i = 0; i < idx.size(); i++) idx[i] = int64_t(i);
  std::sort(idx.begin(), idx.end(), [&](int64_t i, int64_t j) { return before(row[size_t(i)], i, row[size_t(j)], j); });
  idx.resize(size_t(k));
  return idx;
}

double naive_iou(const float* a, const float* b) {
  const double area_a = (double(a[2]) - a[0]) * (double(a[3]) - a[1]),
               area_b = (double(b[2]) - b[0]) * (double(b[3]) - b[1]);
  const double w = std::max(0.0, std::min<double>(a[2], b[2]) - std::max<double>(a[0], b[0]));
  const double h = std::max(0.0, std::min<double>(a[3], b[3]) - std::max<double>(a[1], b[1]));
  const double uni = area_a + area_b - w * h;
  return uni > 0 ? w * h / uni : 0.0;
}

// torchvision.ops.nms's greedy rule, then only the valid boxes, the first max_out, -1 after.
std::vector<int64_t> naive_nms(const std::vector<float>& boxes, const std::vector<bool>& valid, double thr,
                               int64_t max_out) {
  const size_t K = boxes.size() / 4;
  std::vector<int64_t> kept;
  for (size_t i = 0; i < K; i++) {
    if (!valid[i]) continue;
    bool suppressed = false;
    for (int64_t j : kept) suppressed = suppressed || naive_iou(&boxes[size_t(j) * 4], &boxes[i * 4]) > thr;
    if (!suppressed) kept.push_back(int64_t(i));
  }
  kept.resize(size_t(max_out), -1);
  return kept;
}

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> v;
  for (double d : t.to_double()) v.push_back(int64_t(d));
  return v;
}

double testutil_max_abs(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_double(), y = b.to_double();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); i++) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

std::vector<float> random_boxes(int64_t K, std::mt19937_64& rng, double extent = 100) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<float> b;
  for (int64_t i = 0; i < K; i++) {
    const double x = u(rng) * extent, y = u(rng) * extent, w = u(rng) * extent / 3, h = u(rng) * extent / 3;
    b.insert(b.end(), {float(x), float(y), float(x + w), float(y + h)});
  }
  return b;
}

}  // namespace

TEST(Topk, EqualsAFullSortWithTiesNanAndSignedZeros) {
  std::mt19937_64 rng(5);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const int64_t N = 3, K = 257;
    std::vector<double> v(size_t(N * K));
    for (double& e : v) e = double(int64_t(rng() % 21) - 10) / 4;  // many ties
    v[3] = std::numeric_limits<double>::quiet_NaN(), v[40] = -0.0, v[41] = 0.0,
    v[K + 7] = -std::numeric_limits<double>::infinity();
    v[2 * K] = std::numeric_limits<double>::infinity(), v[2 * K + 9] = std::numeric_limits<double>::quiet_NaN();
    Tensor x = ops::from_vector(v, {N, K}, dt);
    const std::vector<double> stored = x.to_double();  // the values as x holds them (rounded to dt)
    for (int64_t k : {int64_t(1), int64_t(7), int64_t(100), K}) {
      ops::TopK t = ops::topk(x, k);
      ASSERT_EQ(t.values.shape(), (Shape{N, k}));
      ASSERT_EQ(t.values.dtype(), dt);
      const std::vector<int64_t> got = ints(t.indices);
      const std::vector<double> values = t.values.to_double();
      for (int64_t n = 0; n < N; n++) {
        const std::vector<double> row(stored.begin() + n * K, stored.begin() + (n + 1) * K);
        const std::vector<int64_t> want = naive_topk(row, k);
        for (int64_t j = 0; j < k; j++) {
          ASSERT_EQ(got[size_t(n * k + j)], want[size_t(j)])
              << engine::dtype_name(dt) << " k " << k << " row " << n << " rank " << j;
          const double a = values[size_t(n * k + j)], b = row[size_t(want[size_t(j)])];
          EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << "value at rank " << j;
        }
      }
    }
  }
}

TEST(BoxIou, EqualsTheDefinition) {
  std::mt19937_64 rng(2);
  std::vector<float> a = random_boxes(9, rng), b = random_boxes(7, rng);
  // Degenerate (zero area, both), identical, nested and touching boxes.
  a.insert(a.end(), {5, 5, 5, 5, 0, 0, 10, 10, 2, 2, 4, 4, 10, 0, 20, 10});
  b.insert(b.end(), {5, 5, 5, 5, 0, 0, 10, 10, 0, 0, 10, 10, 0, 0, 10, 10});
  const int64_t A = int64_t(a.size() / 4), B = int64_t(b.size() / 4);
  std::vector<float> a2 = a, b2 = b;  // a second image: the same boxes, shifted
  for (float& v : a2) v += 3.5f;
  for (float& v : b2) v += 3.5f;
  a.insert(a.end(), a2.begin(), a2.end());
  b.insert(b.end(), b2.begin(), b2.end());
  Tensor iou = ops::box_iou(ops::from_vector(a, {2, A, 4}, DType::f32), ops::from_vector(b, {2, B, 4}, DType::f32));
  ASSERT_EQ(iou.shape(), (Shape{2, A, B}));
  const std::vector<double> got = iou.to_double();
  for (int64_t n = 0; n < 2; n++)
    for (int64_t i = 0; i < A; i++)
      for (int64_t j = 0; j < B; j++)
        EXPECT_NEAR(got[size_t((n * A + i) * B + j)],
                    naive_iou(&a[size_t((n * A + i) * 4)], &b[size_t((n * B + j) * 4)]), 1e-6)
            << "image " << n << " a " << i << " b " << j;
  EXPECT_EQ(got[size_t(9 * B + 7)], 0.0);                  // two empty boxes: union 0
  EXPECT_EQ(got[size_t(10 * B + 8)], 1.0);                 // identical
  EXPECT_FLOAT_EQ(float(got[size_t(11 * B + 9)]), 0.04f);  // nested: 4 / 100
  EXPECT_EQ(got[size_t(12 * B + 10)], 0.0);                // touching along an edge
}

TEST(Nms, AChainKeepsTheThirdBox) {
  // b0 suppresses b1 (IoU 0.6); b1 would suppress b2 (0.6) but is gone, and b0 and b2 overlap less (0.2): b2 stays.
  const std::vector<float> boxes = {0, 0, 10, 10, 2.5f, 0, 12.5f, 10, 5, 0, 15, 10, 100, 100, 110, 110};
  Tensor keep = ops::nms(ops::from_vector(boxes, {1, 4, 4}, DType::f32), Tensor(), 0.5, 6);
  const double iou01 = naive_iou(&boxes[0], &boxes[4]), iou02 = naive_iou(&boxes[0], &boxes[8]);
  ASSERT_GT(iou01, 0.5);
  ASSERT_LT(iou02, 0.5);
  EXPECT_EQ(ints(keep), (std::vector<int64_t>{0, 2, 3, -1, -1, -1}));
}

TEST(Nms, EqualsTheGreedyRuleWithTheValidMaskAndTheCap) {
  std::mt19937_64 rng(9);
  const int64_t N = 3, K = 300;
  std::vector<float> boxes;
  std::vector<bool> valid;
  std::vector<uint8_t> valid_bytes;
  for (int64_t n = 0; n < N; n++) {
    std::vector<float> b = random_boxes(K, rng);
    for (int64_t d = 0; d < 10; d++)  // exact duplicates (IoU 1)
      std::copy(b.begin() + d * 4, b.begin() + d * 4 + 4, b.begin() + (K - 1 - d) * 4);
    boxes.insert(boxes.end(), b.begin(), b.end());
    for (int64_t i = 0; i < K; i++) valid.push_back(rng() % 5 != 0), valid_bytes.push_back(valid.back());
  }
  Tensor tb = ops::from_vector(boxes, {N, K, 4}, DType::f32);
  Tensor tv = ops::compare(
      ops::CompareOp::ne,
      ops::from_vector(std::vector<double>(valid_bytes.begin(), valid_bytes.end()), {N, K}, DType::f32), 0.0);
  for (double thr : {0.3, 0.7})
    for (int64_t cap : {int64_t(5), int64_t(400)})
      for (bool masked : {false, true}) {
        const std::vector<int64_t> got = ints(ops::nms(tb, masked ? tv : Tensor(), thr, cap));
        for (int64_t n = 0; n < N; n++) {
          const std::vector<float> b(boxes.begin() + n * K * 4, boxes.begin() + (n + 1) * K * 4);
          std::vector<bool> v(size_t(K), true);
          if (masked) v.assign(valid.begin() + n * K, valid.begin() + (n + 1) * K);
          const std::vector<int64_t> want = naive_nms(b, v, thr, cap);
          EXPECT_EQ(std::vector<int64_t>(got.begin() + n * cap, got.begin() + (n + 1) * cap), want)
              << "threshold " << thr << " cap " << cap << (masked ? " masked" : "") << " image " << n;
        }
      }
}

TEST(BoxCoder, EncodeMatchesTheFormulaAndDecodeInvertsIt) {
  std::mt19937_64 rng(4);
  const int64_t K = 50;
  std::vector<float> r = random_boxes(2 * K, rng, 300), b = random_boxes(2 * K, rng, 300);
  Tensor ref = ops::from_vector(r, {2, K, 4}, DType::f32), box = ops::from_vector(b, {2, K, 4}, DType::f32);
  ops::BoxCoderParams p;
  p.wx = 10, p.wy = 10, p.ww = 5, p.wh = 5;
  const std::vector<double> d = ops::box_encode(box, ref, p).to_double();
  for (int64_t i = 0; i < 2 * K; i++) {
    const float* R = &r[size_t(i * 4)];
    const float* B = &b[size_t(i * 4)];
    const double rw = R[2] - R[0], rh = R[3] - R[1], bw = B[2] - B[0], bh = B[3] - B[1];
    const double want[4] = {10 * ((B[0] + bw / 2) - (R[0] + rw / 2)) / rw,
                            10 * ((B[1] + bh / 2) - (R[1] + rh / 2)) / rh, 5 * std::log(bw / rw),
                            5 * std::log(bh / rh)};
    for (int k = 0; k < 4; k++) EXPECT_NEAR(d[size_t(i * 4 + k)], want[k], 1e-4 * (1 + std::abs(want[k]))) << i;
  }
  // Decoding the codes gives the boxes back (no clip needed: every code is below log(1000 / 16) here).
  const std::vector<double> back = ops::box_decode(ops::box_encode(box, ref, p), ref, p).to_double();
  for (size_t e = 0; e < back.size(); e++) EXPECT_NEAR(back[e], b[e], 1e-3) << e;
}

TEST(BoxCoder, DecodeClampsTheScaleAndClipsToEachImage) {
  const std::vector<float> r = {10, 10, 30, 50, 100, 100, 120, 140};  // two images, one box each
  const std::vector<float> d = {0, 0, 9, 9, 5, -5, 0, 0};
  const std::vector<float> hw = {60, 80, 120, 110};  // image 0: 60 x 80, image 1: 120 x 110
  ops::BoxCoderParams p;
  Tensor out = ops::box_decode(ops::from_vector(d, {2, 1, 4}, DType::f32), ops::from_vector(r, {2, 1, 4}, DType::f32),
                               p, ops::from_vector(hw, {2, 2}, DType::f32));
  const std::vector<double> v = out.to_double();
  // Image 0: dw, dh clamped at log(1000 / 16): a 1250 x 2500 box around (20, 30), clipped to [0, 80] x [0, 60].
  EXPECT_EQ(v[0], 0.0);
  EXPECT_EQ(v[1], 0.0);
  EXPECT_EQ(v[2], 80.0);
  EXPECT_EQ(v[3], 60.0);
  // Image 1: centre moved by (5 * 20, -5 * 40) = (210, -80): x in [200, 220] -> clipped to 110; y to 0.
  EXPECT_EQ(v[4], 110.0);
  EXPECT_EQ(v[5], 0.0);
  Tensor unclipped =
      ops::box_decode(ops::from_vector(d, {2, 1, 4}, DType::f32), ops::from_vector(r, {2, 1, 4}, DType::f32), p);
  EXPECT_NEAR(unclipped.to_double()[2] - unclipped.to_double()[0], 20 * 62.5, 1e-2);  // exp(clip) = 62.5
}

TEST(MatchBoxes, EqualsTheMatchersRule) {
  // 3 truths (the last padding) x 6 anchors. Anchor 0: truth 0 at 0.8 (>= high). 1: 0.5 with truth 1 (between).
  // 2: below low everywhere. 3: truth 1's best (0.6, a low-quality match). 4: ties truth 0 and 1 at 0.75 (the
  // lower index). 5: the padding truth's 0.99 does not count.
  const std::vector<float> iou = {0.8f, 0.1f, 0.0f, 0.2f, 0.75f, 0.1f,    // truth 0
                                  0.1f, 0.5f, 0.2f, 0.6f, 0.75f, 0.0f,    // truth 1
                                  0.0f, 0.0f, 0.0f, 0.0f, 0.0f,  0.99f};  // truth 2 (padding)
  Tensor q = ops::from_vector(iou, {1, 3, 6}, DType::f32);
  Tensor valid = ops::compare(ops::CompareOp::lt, ops::from_vector(std::vector<double>{0, 1, 2}, {1, 3}), 1.5);
  EXPECT_EQ(ints(ops::match_boxes(q, valid, 0.7, 0.3, false)), (std::vector<int64_t>{0, -2, -1, -2, 0, -1}));
  // Low quality: truth 0's best is 0.8 (anchor 0), truth 1's 0.75 (anchor 4): anchor 3 (0.6) is not one of them.
  EXPECT_EQ(ints(ops::match_boxes(q, valid, 0.7, 0.3, true)), (std::vector<int64_t>{0, -2, -1, -2, 0, -1}));
  // With the 0.75 tie removed truth 1's best is anchor 3 (0.6), which gets its best truth back (truth 1).
  std::vector<float> untied = iou;
  untied[6 + 4] = 0.05f;
  Tensor q2 = ops::from_vector(untied, {1, 3, 6}, DType::f32);
  EXPECT_EQ(ints(ops::match_boxes(q2, valid, 0.7, 0.3, true)), (std::vector<int64_t>{0, -2, -1, 1, 0, -1}));
  // No valid truth: all background.
  Tensor none = ops::compare(ops::CompareOp::lt, ops::from_vector(std::vector<double>{2, 2, 2}, {1, 3}), 1.5);
  EXPECT_EQ(ints(ops::match_boxes(q, none, 0.7, 0.3, true)), (std::vector<int64_t>(6, -1)));
}

// The same boxes through torchvision.ops.box_iou, nms, its Matcher and BoxCoder (tools/bench/detection_parity.py).
TEST(Detection, MatchesTorchvision) {
  auto file = engine::load_safetensors("tests/data/detection_reference.safetensors", engine::default_device());
  const Tensor anchors = file.at("anchors"), truths = file.at("truths");
  const int64_t A = anchors.size(0), G = truths.size(0) - 2;  // the last two truths are padding
  Tensor a3 = ops::reshape(anchors, {1, A, 4}), t3 = ops::reshape(truths, {1, G + 2, 4});
  Tensor iou = ops::box_iou(t3, a3);  // [1, G + 2, A]
  EXPECT_LE(testutil_max_abs(ops::slice(iou, 1, 0, G), file.at("expected.iou")), 1e-6);
  Tensor valid = ops::compare(ops::CompareOp::lt, ops::arange(G + 2, DType::f32), double(G) - 0.5);
  valid = ops::reshape(valid, {1, G + 2});
  EXPECT_EQ(ints(ops::match_boxes(iou, valid, 0.7, 0.3, true)), ints(file.at("expected.matches_rpn")));
  EXPECT_EQ(ints(ops::match_boxes(iou, valid, 0.5, 0.5, false)), ints(file.at("expected.matches_head")));
  // Encoding each anchor's best truth (argmax over the valid truths, first on ties).
  const std::vector<double> q = iou.to_double(), tv = truths.to_double();
  std::vector<float> best(size_t(A * 4));
  for (int64_t a = 0; a < A; a++) {
    int64_t arg = 0;
    for (int64_t g = 1; g < G; g++) arg = q[size_t(g * A + a)] > q[size_t(arg * A + a)] ? g : arg;
    for (int k = 0; k < 4; k++) best[size_t(a * 4 + k)] = float(tv[size_t(arg * 4 + k)]);
  }
  ops::BoxCoderParams p;
  p.wx = 10, p.wy = 10, p.ww = 5, p.wh = 5;
  EXPECT_LE(testutil_max_abs(ops::box_encode(ops::from_vector(best, {1, A, 4}, DType::f32), a3, p),
                             ops::reshape(file.at("expected.encoded"), {1, A, 4})),
            1e-4);
  Tensor hw = ops::from_vector(std::vector<float>{600, 800}, {1, 2}, DType::f32);
  EXPECT_LE(testutil_max_abs(ops::box_decode(ops::reshape(file.at("deltas"), {1, A, 4}), a3, p, hw),
                             ops::reshape(file.at("expected.decoded"), {1, A, 4})),
            1e-3);
  // NMS over the anchors sorted by score: torchvision's kept boxes, by their rank in that order.
  const std::vector<int64_t> order = ints(file.at("order"));
  const std::vector<double> av = anchors.to_double();
  std::vector<float> sorted;
  for (int64_t i : order)
    for (int k = 0; k < 4; k++) sorted.push_back(float(av[size_t(i * 4 + k)]));
  std::vector<int64_t> keep = ints(ops::nms(ops::from_vector(sorted, {1, A, 4}, DType::f32), Tensor(), 0.7, A));
  keep.erase(std::find(keep.begin(), keep.end(), -1), keep.end());
  EXPECT_EQ(keep, ints(file.at("expected.keep_sorted")));
  // AnchorGenerator's two levels (16 x 24 at stride 4 with size 32, 8 x 12 at stride 8 with size 64), exactly.
  Tensor level0 = ops::grid_anchors(16, 24, 4, 4, {32}, {0.5, 1.0, 2.0});
  Tensor level1 = ops::grid_anchors(8, 12, 8, 8, {64}, {0.5, 1.0, 2.0});
  std::vector<double> anchors_got = level0.to_double(), more = level1.to_double();
  anchors_got.insert(anchors_got.end(), more.begin(), more.end());
  EXPECT_EQ(anchors_got, file.at("expected.anchors").to_double());
  // LevelMapper(2, 5) on boxes of sqrt(area) from 1 to 1100.
  EXPECT_EQ(ints(ops::fpn_levels(file.at("level_boxes"))), ints(file.at("expected.levels")));
}

TEST(SampleBalanced, DrawsTheCountsFromTheRightCandidatesUniformly) {
  // Image 0: 3 positives, 40 negatives, the rest neither; image 1: 30 positives, 2 negatives (padding follows).
  const int64_t A = 100, num = 16;
  std::vector<int64_t> labels(size_t(2 * A), -1);
  for (int64_t i = 0; i < 3; i++) labels[size_t(7 * i + 1)] = 1;
  for (int64_t i = 0; i < 40; i++) labels[size_t(50 + i)] = 0;
  for (int64_t i = 0; i < 30; i++) labels[size_t(A + 3 * i)] = 1;
  labels[size_t(A + 91)] = labels[size_t(A + 95)] = 0;
  Tensor t = ops::from_vector(labels, {2, A}, DType::i64);
  std::vector<int64_t> hits(size_t(2 * A), 0);
  const int runs = 400;
  engine::manual_seed(11);
  for (int run = 0; run < runs; run++) {
    ops::Sampled s = ops::sample_balanced(t, num, 0.25);  // at most 4 positives
    const std::vector<int64_t> index = ints(s.index), label = ints(s.label);
    for (int64_t n = 0; n < 2; n++) {
      std::vector<int64_t> seen;
      int64_t pos = 0, neg = 0, pad = 0;
      for (int64_t j = 0; j < num; j++) {
        const int64_t i = index[size_t(n * num + j)], l = label[size_t(n * num + j)];
        if (l == -1) {
          pad++;
          EXPECT_EQ(i, 0);
          continue;
        }
        EXPECT_EQ(labels[size_t(n * A + i)], l) << "image " << n << " slot " << j << " anchor " << i;
        EXPECT_EQ(std::count(seen.begin(), seen.end(), i), 0) << "anchor " << i << " drawn twice";
        EXPECT_TRUE(l == 1 ? neg == 0 && pad == 0 : pad == 0) << "slots: positives, then negatives, then padding";
        seen.push_back(i);
        (l == 1 ? pos : neg)++;
        hits[size_t(n * A + i)]++;
      }
      EXPECT_EQ(pos, n == 0 ? 3 : 4);
      EXPECT_EQ(neg, n == 0 ? 13 : 2);
      EXPECT_EQ(pad, n == 0 ? 0 : 10);
    }
  }
  // Uniform without replacement: image 1's 30 positives are drawn 4 at a time (400 runs: 53.3 each, sd ~7);
  // image 0's 40 negatives 13 at a time (130 each, sd ~9.4).
  for (int64_t i = 0; i < 30; i++) EXPECT_NEAR(double(hits[size_t(A + 3 * i)]), 400.0 * 4 / 30, 30.0) << i;
  for (int64_t i = 0; i < 40; i++) EXPECT_NEAR(double(hits[size_t(50 + i)]), 400.0 * 13 / 40, 40.0) << i;
  // The seed decides the draw.
  engine::manual_seed(3);
  const std::vector<int64_t> a = ints(ops::sample_balanced(t, num, 0.25).index);
  engine::manual_seed(3);
  EXPECT_EQ(ints(ops::sample_balanced(t, num, 0.25).index), a);
}

namespace {

// A truth's parts as polygon_masks takes them, [G, P, V, 2] and counts [G, P], from lists of (x, y) vertices.
struct Polygons {
  int64_t G, P, V;
  std::vector<float> xy;
  std::vector<int64_t> counts;
  Polygons(int64_t g, int64_t p, int64_t v)
      : G(g), P(p), V(v), xy(size_t(g * p * v * 2), 0.f), counts(size_t(g * p), 0) {}
  void set(int64_t g, int64_t p, const std::vector<std::array<double, 2>>& vertices) {
    counts[size_t(g * P + p)] = int64_t(vertices.size());
    for (size_t k = 0; k < vertices.size() && int64_t(k) < V; k++)
      for (int c = 0; c < 2; c++) xy[size_t(((g * P + p) * V + int64_t(k)) * 2 + c)] = float(vertices[k][size_t(c)]);
  }
};

// A convex polygon's inside, in f64 from its definition (an independent rule from the even-odd crossing count):
// the point lies left of every edge of a counter-clockwise polygon; `margin` its distance to the nearest edge.
bool inside_convex(const std::vector<std::array<double, 2>>& v, double x, double y, double* margin) {
  bool inside = true;
  *margin = 1e300;
  for (size_t k = 0; k < v.size(); k++) {
    const auto& a = v[k];
    const auto& b = v[(k + 1) % v.size()];
    const double ex = b[0] - a[0], ey = b[1] - a[1];
    const double cross = ex * (y - a[1]) - ey * (x - a[0]);
    *margin = std::min(*margin, std::abs(cross) / std::hypot(ex, ey));
    if (cross < 0) inside = false;
  }
  return inside;
}

}  // namespace

TEST(PolygonMasks, ARectangleFillsTheCellsWhoseCentreItHolds) {
  // RoI (10, 20)-(24, 34), 7 x 7 cells of 2 x 2 pixels; the rectangle (12, 22)-(18, 30) is (1, 1)-(4, 5) in cells,
  // so it holds the centres j + 0.5 in (1, 4) and i + 0.5 in (1, 5): columns 1-3 of rows 1-4.
  Polygons poly(1, 1, 4);
  poly.set(0, 0, {{12, 22}, {18, 22}, {18, 30}, {12, 30}});
  Tensor masks = ops::polygon_masks(ops::from_vector(poly.xy, {1, 1, 1, 4, 2}, DType::f32),
                                    ops::from_vector(poly.counts, {1, 1, 1}, DType::i64),
                                    ops::from_vector(std::vector<float>{10, 20, 24, 34}, {1, 1, 4}, DType::f32),
                                    ops::from_vector(std::vector<int64_t>{0}, {1, 1}, DType::i64), 7);
  ASSERT_EQ(masks.shape(), (Shape{1, 1, 7, 7}));
  std::vector<double> want(49, 0.0);
  for (int i = 1; i <= 4; i++)
    for (int j = 1; j <= 3; j++) want[size_t(i * 7 + j)] = 1.0;
  EXPECT_EQ(masks.to_double(), want);
}

TEST(PolygonMasks, EqualConvexInsidenessUnionsPartsAndPadsWithZeros) {
  // Random convex polygons (points on an ellipse, in angle order) in random RoIs, two parts per truth (their union);
  // cells whose centre lies within 1e-3 cell of an edge are skipped (either answer is right to rounding).
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> u(0, 1);
  const int64_t N = 2, G = 3, P = 3, V = 12, R = 7, M = 14;
  Polygons poly(N * G, P, V);
  std::vector<std::vector<std::vector<std::array<double, 2>>>> parts(size_t(N * G));
  for (int64_t g = 0; g < N * G; g++)
    for (int64_t p = 0; p < 2; p++) {
      const int64_t n_vertices = 3 + int64_t(rng() % uint64_t(V - 2));
      std::vector<double> angles;
      for (int64_t k = 0; k < n_vertices; k++) angles.push_back(u(rng) * 2 * M_PI);
      std::sort(angles.begin(), angles.end());
      const double cx = 50 + 100 * u(rng), cy = 40 + 80 * u(rng), rx = 5 + 40 * u(rng), ry = 5 + 40 * u(rng);
      std::vector<std::array<double, 2>> v;
      for (double a : angles) v.push_back({cx + rx * std::cos(a), cy + ry * std::sin(a)});
      for (auto& q : v) q = {double(float(q[0])), double(float(q[1]))};  // the f32 vertices the op sees
      poly.set(g, p, v);
      parts[size_t(g)].push_back(v);
    }
  std::vector<float> rois;
  std::vector<int64_t> truth;
  for (int64_t n = 0; n < N; n++)
    for (int64_t r = 0; r < R; r++) {
      const double x1 = 200 * u(rng), y1 = 160 * u(rng);
      const double w = r == 0 ? 0.25 : 3 + 120 * u(rng), h = r == 0 ? 0.5 : 3 + 120 * u(rng);  // r 0: below 1 x 1
      rois.insert(rois.end(), {float(x1), float(y1), float(x1 + w), float(y1 + h)});
      truth.push_back(r == R - 1 ? -1 : (r == R - 2 ? G : int64_t(rng() % uint64_t(G))));  // two with no truth
    }
  Tensor masks = ops::polygon_masks(
      ops::from_vector(poly.xy, {N, G, P, V, 2}, DType::f32), ops::from_vector(poly.counts, {N, G, P}, DType::i64),
      ops::from_vector(rois, {N, R, 4}, DType::f32), ops::from_vector(truth, {N, R}, DType::i64), M);
  const std::vector<double> got = masks.to_double();
  int64_t checked = 0, ones = 0, wrong = 0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t r = 0; r < R; r++) {
      const float* b = rois.data() + (n * R + r) * 4;
      const int64_t g = truth[size_t(n * R + r)];
      const double w = std::max(double(b[2]) - double(b[0]), 1.0), h = std::max(double(b[3]) - double(b[1]), 1.0);
      for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < M; j++) {
          const double x = b[0] + (j + 0.5) * w / M, y = b[1] + (i + 0.5) * h / M;
          bool in = false, near = false;
          if (g >= 0 && g < G)
            for (const auto& v : parts[size_t(n * G + g)]) {
              double margin;
              in = inside_convex(v, x, y, &margin) || in;
              near = near || margin < 1e-3 * std::min(w, h) / M;
            }
          if (near) continue;
          checked++;
          ones += in;
          const double value = got[size_t(((n * R + r) * M + i) * M + j)];
          if (value != (in ? 1.0 : 0.0) && wrong++ < 5)
            ADD_FAILURE() << "image " << n << " roi " << r << " cell (" << i << ", " << j << "): " << value;
        }
    }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(ones, 50);  // the draw does put polygons in the RoIs
  EXPECT_GT(checked, N * R * M * M * 9 / 10);
  for (int64_t n = 0; n < N; n++)  // the RoIs with no truth are empty crops
    for (int64_t r = R - 2; r < R; r++)
      for (int64_t e = 0; e < M * M; e++) EXPECT_EQ(got[size_t((n * R + r) * M * M + e)], 0.0);
}

TEST(PolygonMasks, PartsOfFewerThanThreeVerticesAreEmpty) {
  Polygons poly(1, 2, 4);
  poly.set(0, 0, {{0, 0}, {10, 10}});                    // a segment: empty
  poly.set(0, 1, {{0, 0}, {10, 0}, {10, 10}, {0, 10}});  // the whole RoI
  Tensor rois = ops::from_vector(std::vector<float>{0, 0, 10, 10}, {1, 1, 4}, DType::f32);
  Tensor truth = ops::from_vector(std::vector<int64_t>{0}, {1, 1}, DType::i64);
  Tensor xy = ops::from_vector(poly.xy, {1, 1, 2, 4, 2}, DType::f32);
  Tensor all = ops::polygon_masks(xy, ops::from_vector(poly.counts, {1, 1, 2}, DType::i64), rois, truth, 5);
  EXPECT_EQ(all.to_double(), std::vector<double>(25, 1.0));
  poly.counts[1] = 2;  // the square cut to a segment too
  Tensor none = ops::polygon_masks(xy, ops::from_vector(poly.counts, {1, 1, 2}, DType::i64), rois, truth, 5);
  EXPECT_EQ(none.to_double(), std::vector<double>(25, 0.0));
}

TEST(Detection, ErrorsNameTheProblem) {
  auto expect_error = [](const std::function<void()>& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one saying '" << text << "'";
    } catch (const engine::Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  Tensor x = ops::full({2, 10}, 1.0, DType::f32);
  expect_error([&] { ops::topk(ops::to(x, DType::f64), 3); }, "x must be f32, bf16 or f16");
  expect_error([&] { ops::topk(ops::full({20}, 1.0, DType::f32), 3); }, "x must be [N, K]");
  expect_error([&] { ops::topk(x, 11); }, "k must be in [1, K = 10]");
  expect_error([&] { ops::topk(x, 0); }, "k must be in [1, K = 10]");
  expect_error([&] { ops::topk(ops::full({1, 5000}, 1.0, DType::f32), 4097); }, "the GPU kernel's limit");
  Tensor leaf = ops::full({2, 10}, 1.0, DType::f32);
  leaf.set_requires_grad(true);
  expect_error([&] { ops::topk(leaf, 3); }, "has no gradient");
  Tensor boxes = ops::full({1, 4, 4}, 1.0, DType::f32);
  expect_error([&] { ops::box_iou(boxes, ops::full({2, 4, 4}, 1.0, DType::f32)); }, "the same N");
  expect_error([&] { ops::box_iou(ops::full({1, 4, 5}, 1.0, DType::f32), boxes); }, "[N, K, 4] boxes");
  expect_error([&] { ops::nms(boxes, ops::full({1, 3}, 1.0, DType::f32), 0.5, 2); }, "'valid' must be");
  expect_error([&] { ops::nms(boxes, Tensor(), 0.5, 0); }, "max_out must be >= 1");
  expect_error([&] { ops::nms(boxes, Tensor(), std::nan(""), 2); }, "iou_threshold must be finite");
  Tensor polys = ops::full({1, 2, 1, 3, 2}, 1.0, DType::f32), counts = ops::full({1, 2, 1}, 3.0, DType::i64);
  Tensor truth = ops::full({1, 4}, 0.0, DType::i64);
  expect_error(
      [&] {
        ops::polygon_masks(ops::full({1, 2, 3, 2}, 1.0, DType::f32), counts, boxes, truth, 28);
      },
      "polygons must be contiguous [N, G, P, V, 2]");
  expect_error(
      [&] {
        ops::polygon_masks(polys, ops::full({1, 2}, 3.0, DType::i64), boxes, truth, 28);
      },
      "counts must be contiguous [N, G, P] = [1, 2, 1]");
  expect_error(
      [&] {
        ops::polygon_masks(polys, counts, boxes, ops::full({1, 3}, 0.0, DType::i64), 28);
      },
      "truth [N, R]");
  expect_error([&] { ops::polygon_masks(polys, counts, boxes, truth, 0); }, "size must be in [1, 4096]");
}

TEST(Detection, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    std::mt19937_64 rng(1);
    Tensor boxes = ops::from_vector(random_boxes(130, rng), {1, 130, 4}, DType::f32);
    ops::TopK t = ops::topk(ops::full({2, 300}, 0.5, DType::bf16), 17);
    Tensor iou = ops::box_iou(boxes, boxes);
    Tensor keep = ops::nms(boxes, Tensor(), 0.7, 50);
    EXPECT_EQ(keep.shape(), (Shape{1, 50}));
    ops::BoxCoderParams p;
    Tensor d = ops::box_encode(boxes, boxes, p);
    Tensor back = ops::box_decode(d, boxes, p, ops::full({1, 2}, 100.0, DType::f32));
    Tensor m = ops::match_boxes(iou, Tensor(), 0.7, 0.3, true);
    EXPECT_EQ(m.shape(), (Shape{1, 130}));
    Tensor levels = ops::fpn_levels(boxes);
    ops::Sampled s = ops::sample_balanced(ops::to(ops::compare(ops::CompareOp::ge, m, 0.0), DType::i64), 64, 0.5);
    EXPECT_EQ(s.index.shape(), (Shape{1, 64}));
    EXPECT_EQ(levels.dtype(), DType::i64);
    EXPECT_EQ(t.indices.dtype(), DType::i64);
    Tensor masks =
        ops::polygon_masks(ops::full({1, 3, 2, 5, 2}, 1.0, DType::f32), ops::full({1, 3, 2}, 5.0, DType::i64), boxes,
                           ops::full({1, 130}, 1.0, DType::i64), 28);
    EXPECT_EQ(masks.shape(), (Shape{1, 130, 28, 28}));
  });
}
