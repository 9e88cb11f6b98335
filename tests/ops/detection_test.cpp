// detection_test.cpp: topk, box_iou and nms against naive references written here (a full sort with the stated
// order, IoU in f64 from its definition, greedy NMS in plain loops), with ties, NaN, signed zeros, degenerate and
// duplicate boxes, suppression chains, the valid mask and the output's padding; errors; meta allocations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/device.h"
#include "ops/detection.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
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
}

TEST(Detection, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    std::mt19937_64 rng(1);
    Tensor boxes = ops::from_vector(random_boxes(130, rng), {1, 130, 4}, DType::f32);
    ops::TopK t = ops::topk(ops::full({2, 300}, 0.5, DType::bf16), 17);
    Tensor iou = ops::box_iou(boxes, boxes);
    Tensor keep = ops::nms(boxes, Tensor(), 0.7, 50);
    EXPECT_EQ(keep.shape(), (Shape{1, 50}));
    EXPECT_EQ(t.indices.dtype(), DType::i64);
  });
}
