// roi_align_test.cpp: RoIAlign against a naive reference written here from maskrcnn-benchmark's ROIAlign formulas
// (plain loops in f64: box, bins, samples, clamped bilinear interpolation), on several pyramid levels with boxes
// inside, across and outside the maps, tiny and inverted boxes, and padding RoIs; its backward against the same
// reference's scatter and the adjoint identity; gradient checks of both ops (each is the other's rule);
// determinism across thread counts; dtypes; errors; meta allocations; and torchvision's roi_align on the same
// inputs (tests/data/roi_align_reference.safetensors, written by tools/bench/roi_align_parity.py).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/device.h"
#include "engine/safetensors.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/roi_align.h"
#include "ops/view.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;

namespace {

struct Case {
  std::vector<Shape> shapes;    // levels [N, H, W, C]
  std::vector<float> rois;      // [R, 5]
  std::vector<int64_t> levels;  // [R]
  ops::RoiAlignParams p;
  int64_t R() const { return int64_t(levels.size()); }
  Tensor roi_tensor() const { return ops::from_vector(rois, {R(), 5}, DType::f32); }
  Tensor level_tensor() const { return ops::from_vector(levels, {R()}, DType::i64); }
};

// Two images, three levels at scales 1/4, 1/8, 1/16 of a 64 x 96 image; RoIs inside, cut by the edges, entirely
// outside, smaller than a feature pixel, inverted (x2 < x1), and padding (level -1, level 3, image -1, image 2).
Case pyramid_case(int64_t out = 3, int64_t ratio = 2, bool aligned = false) {
  Case c;
  c.shapes = {{2, 16, 24, 5}, {2, 8, 12, 5}, {2, 4, 6, 5}};
  c.p.out_h = out, c.p.out_w = out + 1, c.p.sampling_ratio = ratio, c.p.aligned = aligned;
  c.p.scales = {0.25, 0.125, 0.0625};
  const float rows[][6] = {
      {0, 4.f, 6.f, 40.f, 30.f, 0},    {1, 10.5f, 3.2f, 60.f, 62.f, 0},    {0, -20.f, -8.f, 30.f, 20.f, 1},
      {1, 70.f, 50.f, 120.f, 90.f, 1}, {0, 1.f, 1.f, 2.f, 2.5f, 0},        {1, 30.f, 20.f, 10.f, 5.f, 2},
      {0, 0.f, 0.f, 95.f, 63.f, 2},    {1, 200.f, 200.f, 260.f, 240.f, 0}, {0, 5.f, 5.f, 30.f, 30.f, -1},
      {0, 5.f, 5.f, 30.f, 30.f, 3},    {-1, 5.f, 5.f, 30.f, 30.f, 0},      {2, 5.f, 5.f, 30.f, 30.f, 1},
      {1, 92.f, 60.f, 96.f, 64.f, 0},  {0, 47.9f, 31.7f, 48.3f, 32.1f, 1}};
  for (const auto& r : rows) {
    for (int k = 0; k < 5; k++) c.rois.push_back(r[k]);
    c.levels.push_back(int64_t(r[5]));
  }
  return c;
}

std::vector<Tensor> random_levels(const Case& c, DType dtype, uint64_t seed, bool requires_grad = false) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<Tensor> xs;
  for (const Shape& s : c.shapes) {
    std::vector<double> v(size_t(engine::numel_of(s)));
    for (double& e : v) e = u(rng);
    Tensor t = ops::from_vector(v, s, dtype);
    if (requires_grad) t.set_requires_grad(true);
    xs.push_back(t);
  }
  return xs;
}

// The reference: for RoI r, bin (ph, pw), the weights of every input element (level, flat index) it averages.
struct Weight {
  int64_t level, index;  // index into level's [N, H, W] plane set (times C plus channel for the element)
  double w;
};

std::vector<Weight> reference_weights(const Case& c, int64_t r, int64_t ph, int64_t pw) {
  std::vector<Weight> out;
  const float* roi = c.rois.data() + r * 5;
  const int64_t l = c.levels[size_t(r)], L = int64_t(c.shapes.size()), N = c.shapes[0][0];
  if (l < 0 || l >= L || roi[0] < 0 || roi[0] >= float(N)) return out;
  const int64_t n = int64_t(roi[0]), H = c.shapes[size_t(l)][1], W = c.shapes[size_t(l)][2];
  const double s = c.p.scales[size_t(l)], off = c.p.aligned ? 0.5 : 0.0;
  const double x0 = roi[1] * s - off, y0 = roi[2] * s - off, x1 = roi[3] * s - off, y1 = roi[4] * s - off;
  double rw = x1 - x0, rh = y1 - y0;
  if (!c.p.aligned) rw = std::max(rw, 1.0), rh = std::max(rh, 1.0);
  const double bh = rh / double(c.p.out_h), bw = rw / double(c.p.out_w);
  const int64_t g = c.p.sampling_ratio;
  for (int64_t iy = 0; iy < g; iy++)
    for (int64_t ix = 0; ix < g; ix++) {
      double y = y0 + double(ph) * bh + (double(iy) + 0.5) * bh / double(g);
      double x = x0 + double(pw) * bw + (double(ix) + 0.5) * bw / double(g);
      if (y < -1.0 || y > double(H) || x < -1.0 || x > double(W)) continue;  // this sample is 0
      y = std::max(y, 0.0), x = std::max(x, 0.0);
      int64_t yl = int64_t(std::floor(y)), xl = int64_t(std::floor(x)), yh = yl + 1, xh = xl + 1;
      if (yl >= H - 1) yl = yh = H - 1, y = double(yl);
      if (xl >= W - 1) xl = xh = W - 1, x = double(xl);
      const double ly = y - double(yl), lx = x - double(xl), count = double(g * g);
      const int64_t base = n * H * W;
      out.push_back({l, base + yl * W + xl, (1 - ly) * (1 - lx) / count});
      out.push_back({l, base + yl * W + xh, (1 - ly) * lx / count});
      out.push_back({l, base + yh * W + xl, ly * (1 - lx) / count});
      out.push_back({l, base + yh * W + xh, ly * lx / count});
    }
  return out;
}

std::vector<double> reference_forward(const Case& c, const std::vector<std::vector<double>>& x) {
  const int64_t C = c.shapes[0][3], bins = c.p.out_h * c.p.out_w;
  std::vector<double> y(size_t(c.R() * bins * C), 0.0);
  for (int64_t r = 0; r < c.R(); r++)
    for (int64_t b = 0; b < bins; b++)
      for (const Weight& w : reference_weights(c, r, b / c.p.out_w, b % c.p.out_w))
        for (int64_t ch = 0; ch < C; ch++)
          y[size_t((r * bins + b) * C + ch)] += w.w * x[size_t(w.level)][size_t(w.index * C + ch)];
  return y;
}

std::vector<std::vector<double>> reference_backward(const Case& c, const std::vector<double>& g) {
  const int64_t C = c.shapes[0][3], bins = c.p.out_h * c.p.out_w;
  std::vector<std::vector<double>> dx;
  for (const Shape& s : c.shapes) dx.emplace_back(size_t(engine::numel_of(s)), 0.0);
  for (int64_t r = 0; r < c.R(); r++)
    for (int64_t b = 0; b < bins; b++)
      for (const Weight& w : reference_weights(c, r, b / c.p.out_w, b % c.p.out_w))
        for (int64_t ch = 0; ch < C; ch++)
          dx[size_t(w.level)][size_t(w.index * C + ch)] += w.w * g[size_t((r * bins + b) * C + ch)];
  return dx;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (!(std::abs(got[i] - want[i]) <= tol) && wrong++ < 5)
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", the reference " << want[i];
  EXPECT_EQ(wrong, 0) << what;
}

std::vector<std::vector<double>> values(const std::vector<Tensor>& xs) {
  std::vector<std::vector<double>> v;
  for (const Tensor& x : xs) v.push_back(x.to_double());
  return v;
}

}  // namespace

TEST(RoiAlign, ForwardAndBackwardEqualTheNaiveReference) {
  for (bool aligned : {false, true})
    for (int64_t ratio : {1, 2, 3}) {
      const Case c = pyramid_case(3, ratio, aligned);
      for (DType dt : {DType::f64, DType::f32}) {
        const std::string what = engine::str(engine::dtype_name(dt), " ratio ", ratio, aligned ? " aligned" : "");
        std::vector<Tensor> xs = random_levels(c, dt, 7);
        Tensor y = ops::roi_align(xs, c.roi_tensor(), c.level_tensor(), c.p);
        ASSERT_EQ(y.shape(), (Shape{c.R(), 3, 4, 5})) << what;
        const double tol = dt == DType::f64 ? 1e-12 : 2e-6;
        expect_close(y.to_double(), reference_forward(c, values(xs)), tol, what + ": forward");
        std::vector<Tensor> gs = random_levels(Case{{y.shape()}, {}, {}, {}}, dt, 11);
        std::vector<Tensor> dx = ops::roi_align_backward(gs[0], c.shapes, c.roi_tensor(), c.level_tensor(), c.p);
        ASSERT_EQ(dx.size(), c.shapes.size());
        const std::vector<std::vector<double>> want = reference_backward(c, gs[0].to_double());
        for (size_t l = 0; l < dx.size(); l++)
          expect_close(dx[l].to_double(), want[l], tol, what + engine::str(": backward, level ", l));
      }
    }
}

TEST(RoiAlign, PaddingRoisGiveZerosAndReceiveNothing) {
  const Case c = pyramid_case();
  std::vector<Tensor> xs = random_levels(c, DType::f32, 3);
  const std::vector<double> y = ops::roi_align(xs, c.roi_tensor(), c.level_tensor(), c.p).to_double();
  const int64_t per_roi = 3 * 4 * 5;
  for (int64_t r = 8; r < 12; r++)  // level -1, level 3, image -1, image 2
    for (int64_t k = 0; k < per_roi; k++) EXPECT_EQ(y[size_t(r * per_roi + k)], 0.0) << "RoI " << r;
  // The RoI entirely outside level 0 (x 200-260 at 1/4 of a 24-wide map) samples nothing either.
  for (int64_t k = 0; k < per_roi; k++) EXPECT_EQ(y[size_t(7 * per_roi + k)], 0.0);
}

// <roi_align(x), g> = sum over levels of <x_l, roi_align_backward(g)_l>: the backward is the forward's adjoint.
TEST(RoiAlign, TheBackwardIsTheForwardsAdjoint) {
  const Case c = pyramid_case(7, 2);
  std::vector<Tensor> xs = random_levels(c, DType::f64, 5);
  Tensor y = ops::roi_align(xs, c.roi_tensor(), c.level_tensor(), c.p);
  Tensor g = random_levels(Case{{y.shape()}, {}, {}, {}}, DType::f64, 6)[0];
  std::vector<Tensor> dx = ops::roi_align_backward(g, c.shapes, c.roi_tensor(), c.level_tensor(), c.p);
  double lhs = ops::sum(ops::mul(y, g)).item(), rhs = 0;
  for (size_t l = 0; l < xs.size(); l++) rhs += ops::sum(ops::mul(xs[l], dx[l])).item();
  EXPECT_NEAR(lhs, rhs, 1e-12 * std::max(1.0, std::abs(lhs)));
}

TEST(RoiAlign, GradientChecksOfBothOps) {
  Case c = pyramid_case(2, 2);
  c.shapes = {{2, 8, 12, 2}, {2, 4, 6, 2}, {2, 2, 3, 2}};  // small: finite differences per element
  c.p.scales = {0.125, 0.0625, 0.03125};
  const Tensor rois = c.roi_tensor(), levels = c.level_tensor();
  std::vector<Tensor> xs = random_levels(c, DType::f64, 9, true);
  testutil::expect_gradcheck([&](const std::vector<Tensor>& in) { return ops::roi_align(in, rois, levels, c.p); }, xs);
  // The backward op as a function of g: its rule is the forward.
  Tensor g = testutil::rand_input({c.R(), 2, 3, 2});
  for (size_t l = 0; l < c.shapes.size(); l++)
    testutil::expect_gradcheck(
        [&](const std::vector<Tensor>& in) { return ops::roi_align_backward(in[0], c.shapes, rois, levels, c.p)[l]; },
        {g});
}

TEST(RoiAlign, TheBackwardIsTheSameForAnyThreadCount) {
  const Case c = pyramid_case(7, 2);
  Tensor g = random_levels(Case{{{c.R(), 7, 8, 5}}, {}, {}, {}}, DType::f32, 4)[0];
  std::vector<std::vector<double>> runs;
  const int threads = omp_get_max_threads();
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    for (const Tensor& d : ops::roi_align_backward(g, c.shapes, c.roi_tensor(), c.level_tensor(), c.p))
      runs.push_back(d.to_double());
  }
  omp_set_num_threads(threads);
  const size_t L = c.shapes.size();
  for (size_t k = L; k < runs.size(); k++) EXPECT_EQ(runs[k], runs[k % L]) << "run " << k / L << " level " << k % L;
}

TEST(RoiAlign, Bf16MapsPoolInF32AndRoundOnce) {
  const Case c = pyramid_case();
  std::vector<Tensor> xs = random_levels(c, DType::bf16, 8), wide;
  for (const Tensor& x : xs) wide.push_back(ops::to(x, DType::f32));  // the same values, exactly
  Tensor y16 = ops::roi_align(xs, c.roi_tensor(), c.level_tensor(), c.p);
  Tensor y32 = ops::roi_align(wide, c.roi_tensor(), c.level_tensor(), c.p);
  EXPECT_EQ(y16.dtype(), DType::bf16);
  EXPECT_EQ(y16.to_double(), ops::to(y32, DType::bf16).to_double());
}

// An implementation that shares no code with this one: torchvision.ops.roi_align, both alignments, every RoI from
// its own level (padding RoIs: zeros), and its input gradients of sum(y * g).
TEST(RoiAlign, MatchesTorchvision) {
  auto file = engine::load_safetensors("tests/data/roi_align_reference.safetensors", engine::default_device());
  const std::vector<Tensor> xs = {file.at("x0"), file.at("x1")};
  const Tensor rois = file.at("rois"), levels = file.at("levels"), g = file.at("g");
  ops::RoiAlignParams p;
  p.out_h = 3, p.out_w = 4, p.sampling_ratio = 2, p.scales = {0.25, 0.125};
  for (int aligned : {0, 1}) {
    p.aligned = aligned == 1;
    const std::string a = engine::str(".aligned", aligned);
    Tensor y = ops::roi_align(xs, rois, levels, p);
    EXPECT_LE(testutil::max_abs_diff(y, file.at("expected.y" + a)), 1e-5) << "forward" << a;
    std::vector<Tensor> dx = ops::roi_align_backward(g, {xs[0].shape(), xs[1].shape()}, rois, levels, p);
    for (size_t l = 0; l < dx.size(); l++)
      EXPECT_LE(testutil::max_abs_diff(dx[l], file.at(engine::str("expected.dx", l, a))), 1e-5) << "dx" << l << a;
  }
}

TEST(RoiAlign, ErrorsNameTheProblem) {
  const Case c = pyramid_case();
  std::vector<Tensor> xs = random_levels(c, DType::f32, 1);
  auto expect_error = [&](const std::function<void()>& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one saying '" << text << "'";
    } catch (const engine::Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  const Tensor rois = c.roi_tensor(), levels = c.level_tensor();
  expect_error([&] { ops::roi_align({}, rois, levels, c.p); }, "at least one feature map");
  expect_error([&] { ops::roi_align({xs[0], ops::reshape(xs[1], {2, 8, 60})}, rois, levels, c.p); }, "[N, H, W, C]");
  expect_error([&] { ops::roi_align({xs[0], ops::slice(xs[1], 3, 0, 4)}, rois, levels, c.p); }, "level 0's N and C");
  expect_error([&] { ops::roi_align(xs, ops::to(rois, DType::f64), levels, c.p); }, "'rois' must be f32");
  expect_error([&] { ops::roi_align(xs, ops::reshape(rois, {7, 10}), levels, c.p); }, "rois must be [R, 5]");
  expect_error([&] { ops::roi_align(xs, rois, ops::slice(levels, 0, 0, 3), c.p); }, "roi_levels must be [R]");
  ops::RoiAlignParams q = c.p;
  q.sampling_ratio = 0;
  expect_error([&] { ops::roi_align(xs, rois, levels, q); }, "sampling_ratio must be positive");
  q = c.p, q.scales.pop_back();
  expect_error([&] { ops::roi_align(xs, rois, levels, q); }, "one scale per level");
  q = c.p, q.out_w = 0;
  expect_error([&] { ops::roi_align(xs, rois, levels, q); }, "output size must be positive");
  Tensor y = ops::roi_align(xs, rois, levels, c.p);
  expect_error([&] { ops::roi_align_backward(ops::slice(y, 3, 0, 2), c.shapes, rois, levels, c.p); }, "g [");
}

TEST(RoiAlign, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    const Case c = pyramid_case(7, 2);
    std::vector<Tensor> xs = random_levels(c, DType::bf16, 2, true);
    Tensor y = ops::roi_align(xs, c.roi_tensor(), c.level_tensor(), c.p);
    EXPECT_EQ(y.shape(), (Shape{c.R(), 7, 8, 5}));
    graph::backward(ops::sum(ops::to(y, DType::f32)));
    for (const Tensor& x : xs) EXPECT_TRUE(x.grad().defined());
  });
}
