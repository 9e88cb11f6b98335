// synthetic_test.cpp: paint_rectangles against an independent painter written here (rectangles painted
// in slot order onto a grid, as the models did on the host, and the noise drawn from Philox by hand), its
// borders, labels, instances and colours agreeing, square and oblong images, determinism in (seed, step), dtypes,
// errors and meta allocations.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/device.h"
#include "engine/rng.h"
#include "ops/factory.h"
#include "ops/synthetic.h"
#include "ops/view.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;

namespace {

struct Scene {
  int64_t N, R;
  std::vector<int64_t> rows;  // [N, R, 5]: class, top, left, height, width
  std::vector<float> palette;  // [K, 3]
  int64_t K() const { return int64_t(palette.size() / 3); }
  Tensor scenes() const { return ops::from_vector(rows, {N, R, 5}, DType::i64); }
  Tensor colours() const { return ops::from_vector(palette, {K(), 3}, DType::f32); }
};

// Overlaps, a rectangle cut by the image's edges, an empty slot, a class outside the palette (skipped), a
// 1 x 1 rectangle (all border) and a 2-pixel-wide one (no interior).
Scene mixed_scene() {
  Scene s{2, 4, {}, {}};
  s.rows = {1, 1, 1, 6, 7,     2, 3, 4, 5, 5,    -1, 0, 0, 9, 9,    3, -2, 7, 6, 9,     // image 0
            3, 0, 0, 11, 11,   7, 2, 2, 4, 4,    1, 5, 5, 1, 1,     2, 8, 1, 2, 8};     // image 1
  s.palette = {0.1f, -0.3f, 0.25f, -0.9f, 0.8f, 0.05f, 0.6f, 0.6f, -0.6f, -0.2f, -0.7f, 0.9f};  // K = 4
  return s;
}

struct Painted {
  std::vector<float> images;       // [N, H, W, 3]
  std::vector<int64_t> labels;     // [N * H * W]
  std::vector<int64_t> instances;  // [N * H * W]: slot + 1 of the last rectangle painted there, 0 for none
};

// The definition, in plain loops: paint each rectangle's pixels in slot order (clipped to the image), then
// every element e's value is fma(noise, 2u - 1, colour) with u the top 24 bits of lane e % 4 of Philox
// block (counter (e / 4, step), key seed).
Painted naive_paint(const Scene& s, const ops::PaintOptions& o) {
  const int64_t H = o.height, W = o.width;
  Painted p;
  p.labels.assign(size_t(s.N * H * W), 0);
  p.instances.assign(size_t(s.N * H * W), 0);
  std::vector<int64_t> colour(size_t(s.N * H * W), 0);
  for (int64_t n = 0; n < s.N; n++)
    for (int64_t r = 0; r < s.R; r++) {
      const int64_t* row = s.rows.data() + (n * s.R + r) * 5;
      const int64_t cls = row[0], top = row[1], left = row[2], h = row[3], w = row[4];
      if (cls < 0 || cls >= s.K()) continue;
      for (int64_t y = std::max<int64_t>(top, 0); y < std::min(top + h, H); y++)
        for (int64_t x = std::max<int64_t>(left, 0); x < std::min(left + w, W); x++) {
          const bool border = o.borders && (y == top || y == top + h - 1 || x == left || x == left + w - 1);
          const size_t px = size_t((n * H + y) * W + x);
          p.labels[px] = border ? o.border_label : cls;
          p.instances[px] = r + 1;
          colour[px] = border ? 0 : cls;
        }
    }
  p.images.resize(size_t(s.N * H * W * 3));
  for (uint64_t e = 0; e < p.images.size(); e++) {
    const uint64_t block = e / 4, step = uint64_t(o.step);
    const uint32_t ctr[4] = {uint32_t(block), uint32_t(block >> 32), uint32_t(step), uint32_t(step >> 32)};
    const uint32_t key[2] = {uint32_t(o.seed), uint32_t(o.seed >> 32)};
    uint32_t bits[4];
    engine::philox4x32_10_full(ctr, key, bits);
    const float u = float(bits[e % 4] >> 8) / 16777216.0f;
    p.images[e] = std::fma(float(o.noise), 2 * u - 1, s.palette[size_t(colour[e / 3] * 3 + e % 3)]);
  }
  return p;
}

ops::PaintOptions options(int64_t height, int64_t width, bool borders) {
  ops::PaintOptions o;
  o.height = height, o.width = width;
  o.noise = 0.2;
  o.seed = 0x0123456789abcdefull;  // both key words used
  o.step = (int64_t(1) << 33) + 5;  // both counter words used
  o.labels = true;
  o.instances = true;
  o.borders = borders;
  o.border_label = 255;
  return o;
}

std::vector<int64_t> as_int(const Tensor& t) {
  std::vector<int64_t> v;
  for (double d : t.to_double()) v.push_back(int64_t(d));
  return v;
}

}  // namespace

TEST(PaintRectangles, EqualsTheNaivePainterInEveryDtype) {
  const Scene s = mixed_scene();
  for (bool borders : {true, false}) {
    // 7 x 7: rectangles cut by the right and bottom edges too; 11 x 6 and 5 x 12: oblong, cut on one side.
    for (auto [H, W] : {std::pair<int64_t, int64_t>{11, 11}, {7, 7}, {11, 6}, {5, 12}}) {
      ops::PaintOptions o = options(H, W, borders);
      const Painted want = naive_paint(s, o);
      for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
        o.dtype = dt;
        ops::PaintedImages got = ops::paint_rectangles(s.scenes(), s.colours(), o);
        const std::string what =
            engine::str(engine::dtype_name(dt), " ", H, " x ", W, borders ? " borders" : " no borders");
        ASSERT_EQ(got.images.shape(), (Shape{2, H, W, 3})) << what;
        ASSERT_EQ(got.images.dtype(), dt) << what;
        ASSERT_EQ(got.labels.shape(), (Shape{2 * H * W})) << what;
        ASSERT_EQ(got.instances.shape(), (Shape{2 * H * W})) << what;
        EXPECT_EQ(as_int(got.labels), want.labels) << what;
        EXPECT_EQ(as_int(got.instances), want.instances) << what;
        const std::vector<double> v = got.images.to_double();
        int64_t wrong = 0;
        for (size_t e = 0; e < v.size(); e++) {
          // f32 exactly; f64 the f32 value widened; bf16 / f16 the f32 value rounded once.
          const float f = want.images[e];
          const double expected = dt == DType::bf16  ? double(float(engine::bf16(f)))
                                  : dt == DType::f16 ? double(float(engine::f16(f)))
                                                     : double(f);
          if (v[e] != expected && wrong++ < 5)
            ADD_FAILURE() << what << ": element " << e << " is " << v[e] << ", expected " << expected;
        }
        EXPECT_EQ(wrong, 0) << what << ": elements that differ from the naive painter";
      }
    }
  }
}

TEST(PaintRectangles, EllipsesHoldThePixelsWhoseCentreIsInside) {
  // One 4 x 4 rectangle at (1, 2) in a 6 x 7 image: its inscribed ellipse (semi-axes 2) holds a pixel whose centre
  // is (dx, dy) from the rectangle's centre when (dx / 2)^2 + (dy / 2)^2 <= 1, with dx, dy in {-1.5, -0.5, 0.5, 1.5}:
  // every pixel but the four corners ((1.5 / 2)^2 2 = 1.125). A 1 x 3 rectangle: its ellipse has semi-axes 1.5 and
  // 0.5, the row's three centres at dx = -1, 0, 1: (1 / 1.5)^2 < 1, all three inside.
  std::vector<int64_t> rows = {1, 1, 2, 4, 4, 2, 5, 3, 1, 3};  // class, top, left, height, width
  Tensor scenes = ops::from_vector(rows, {1, 2, 5}, DType::i64);
  Tensor palette = ops::from_vector(std::vector<float>(9, 0.f), {3, 3}, DType::f32);
  ops::PaintOptions o = options(6, 7, false);
  o.ellipses = true;
  const std::vector<int64_t> got = as_int(ops::paint_rectangles(scenes, palette, o).labels);
  std::vector<int64_t> want(42, 0);
  for (int64_t y = 1; y < 5; y++)
    for (int64_t x = 2; x < 6; x++)
      if (!((y == 1 || y == 4) && (x == 2 || x == 5))) want[size_t(y * 7 + x)] = 1;
  for (int64_t x = 3; x < 6; x++) want[size_t(5 * 7 + x)] = 2;
  EXPECT_EQ(got, want);
}

TEST(PaintRectangles, BordersAreTheIgnoreIndexAndLookLikeTheBackground) {
  Scene s{1, 1, {2, 3, 4, 6, 5}, {-0.5f, -0.5f, -0.5f, 0.f, 0.f, 0.f, 0.5f, 0.5f, 0.5f}};
  ops::PaintOptions o = options(12, 12, true);
  o.noise = 0;  // the palette itself
  ops::PaintedImages p = ops::paint_rectangles(s.scenes(), s.colours(), o);
  const std::vector<int64_t> labels = as_int(p.labels);
  const std::vector<double> image = p.images.to_double();
  int64_t border = 0, inside = 0;
  for (int64_t y = 0; y < 12; y++)
    for (int64_t x = 0; x < 12; x++) {
      const bool in = y >= 3 && y < 9 && x >= 4 && x < 9;
      const bool edge = in && (y == 3 || y == 8 || x == 4 || x == 8);
      const int64_t want = edge ? 255 : in ? 2 : 0;
      EXPECT_EQ(labels[size_t(y * 12 + x)], want) << "pixel (" << y << ", " << x << ")";
      EXPECT_EQ(image[size_t((y * 12 + x) * 3)], edge || !in ? -0.5 : 0.5) << "pixel (" << y << ", " << x << ")";
      border += edge, inside += in && !edge;
    }
  EXPECT_EQ(border, 2 * (6 + 5) - 4);
  EXPECT_EQ(inside, 4 * 3);
}

TEST(PaintRectangles, LabelsAgreeWithColours) {
  // Colours 1.0 apart, noise 0.2: the nearest palette row to each painted pixel is its class (background
  // on a border).
  Scene s = mixed_scene();
  s.palette = {0.f, 0.f, 0.f, 1.f, 0.f, 0.f, 0.f, 1.f, 0.f, 0.f, 0.f, 1.f};
  ops::PaintOptions o = options(11, 11, true);
  ops::PaintedImages p = ops::paint_rectangles(s.scenes(), s.colours(), o);
  const std::vector<int64_t> labels = as_int(p.labels);
  const std::vector<double> image = p.images.to_double();
  for (size_t px = 0; px < labels.size(); px++) {
    int64_t nearest = -1;
    double best = 1e9;
    for (int64_t k = 0; k < 4; k++) {
      double d = 0;
      for (int c = 0; c < 3; c++) d += std::pow(image[px * 3 + c] - s.palette[size_t(k * 3 + c)], 2);
      if (d < best) best = d, nearest = k;
    }
    EXPECT_EQ(labels[px] == 255 ? 0 : labels[px], nearest) << "pixel " << px;
    for (int c = 0; c < 3; c++)
      EXPECT_LE(std::abs(image[px * 3 + c] - s.palette[size_t(nearest * 3 + c)]), 0.2 + 1e-7) << "pixel " << px;
  }
}

TEST(PaintRectangles, SeedAndStepDecideTheNoise) {
  const Scene s = mixed_scene();
  ops::PaintOptions o = options(11, 11, true);
  auto paint = [&](uint64_t seed, int64_t step) {
    ops::PaintOptions q = o;
    q.seed = seed, q.step = step;
    return ops::paint_rectangles(s.scenes(), s.colours(), q);
  };
  ops::PaintedImages a = paint(7, 3), b = paint(7, 3), c = paint(7, 4), d = paint(8, 3);
  EXPECT_EQ(a.images.to_double(), b.images.to_double());
  EXPECT_NE(a.images.to_double(), c.images.to_double());
  EXPECT_NE(a.images.to_double(), d.images.to_double());
  EXPECT_EQ(a.labels.to_double(), c.labels.to_double());  // the scene decides the labels
  // The noise is uniform in [-0.2, 0.2): mean near 0, both signs, spread over the range.
  Scene flat{1, 1, {-1, 0, 0, 0, 0}, {0.f, 0.f, 0.f}};
  o.height = o.width = 64;
  std::vector<double> v = ops::paint_rectangles(flat.scenes(), flat.colours(), o).images.to_double();
  double sum = 0, lo = 1, hi = -1;
  for (double e : v) sum += e, lo = std::min(lo, e), hi = std::max(hi, e);
  EXPECT_NEAR(sum / double(v.size()), 0.0, 0.005);  // 12288 draws: standard error 0.001
  EXPECT_GE(lo, -0.2f);
  EXPECT_LT(hi, 0.2f);
  EXPECT_LT(lo, -0.19);
  EXPECT_GT(hi, 0.19);
}

TEST(PaintRectangles, MapsOnlyWhenAsked) {
  const Scene s = mixed_scene();
  ops::PaintOptions o = options(5, 5, false);
  o.labels = false, o.instances = false;
  ops::PaintedImages p = ops::paint_rectangles(s.scenes(), s.colours(), o);
  EXPECT_FALSE(p.labels.defined());
  EXPECT_FALSE(p.instances.defined());
  const std::vector<float> want = naive_paint(s, o).images;
  EXPECT_EQ(p.images.to_double(), std::vector<double>(want.begin(), want.end()));
}

TEST(PaintRectangles, ErrorsNameTheProblem) {
  const Scene s = mixed_scene();
  const ops::PaintOptions o = options(8, 8, true);
  Tensor scenes = s.scenes(), colours = s.colours();
  auto expect_error = [&](const Tensor& sc, const Tensor& pal, const ops::PaintOptions& q, const std::string& text) {
    try {
      ops::paint_rectangles(sc, pal, q);
      ADD_FAILURE() << "no error; expected one saying '" << text << "'";
    } catch (const engine::Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error(ops::from_vector(s.rows, {2, 4, 5}, DType::f32), colours, o, "'scenes' must be i64");
  expect_error(scenes, ops::from_vector(s.palette, {4, 3}, DType::f64), o, "'palette' must be f32");
  expect_error(ops::reshape(scenes, {8, 5}), colours, o, "scenes");
  expect_error(ops::reshape(scenes, {2, 5, 4}), colours, o, "scenes must be [N, R, 5]");
  expect_error(scenes, ops::reshape(colours, {3, 4}), o, "palette must be [K >= 1, 3]");
  expect_error(ops::transpose(ops::from_vector(s.rows, {4, 2, 5}, DType::i64), 0, 1), colours, o, "contiguous");
  ops::PaintOptions q = o;
  q.height = 0;
  expect_error(scenes, colours, q, "image height and width must be positive");
  q = o, q.width = -3;
  expect_error(scenes, colours, q, "image height and width must be positive");
  q = o, q.dtype = DType::i64;
  expect_error(scenes, colours, q, "floating dtype");
  q = o, q.noise = -1;
  expect_error(scenes, colours, q, "noise amplitude");
}

TEST(PaintRectangles, MetaAllocatesLikeCpu) {
  const Scene s = mixed_scene();
  for (bool labels : {true, false}) {
    testutil::expect_meta_allocates_like_cpu([&] {
      ops::PaintOptions o = options(33, 20, true);
      o.labels = labels, o.instances = !labels;
      o.dtype = DType::bf16;
      ops::PaintedImages p = ops::paint_rectangles(s.scenes(), s.colours(), o);
      EXPECT_EQ(p.images.shape(), (Shape{2, 33, 20, 3}));
      EXPECT_EQ(p.labels.defined(), labels);
      EXPECT_EQ(p.instances.defined(), !labels);
    });
  }
}
