// synthetic_cuda_test.cpp: paint_rectangles on the GPU against the cpu reference: images bit for bit in
// every dtype (bf16/f16 also equal to the cpu's f32 images rounded once), labels and instances exactly, for shapes
// (square and not) whose pixel count leaves a tail group; the deeplabv3 and yolov3 synthetic batches equal on both
// devices (the models' cuda-vs-cpu step tests rely on it); the ledger against meta; and a DISABLED_ bandwidth run at
// deeplabv3's batch (8 x 513 x 513).
#include <gtest/gtest.h>

#include <random>

#include "engine/device.h"
#include "models/vision/deeplabv3.h"
#include "models/vision/yolov3.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/synthetic.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Tensor;
using testutil::to_cuda;

namespace {

// scenes [N, R, 5]: random rectangles in an H x W image (some cut by the edges, some slots empty or of a class
// >= K) and a palette [K, 3] in [-1, 1).
std::pair<Tensor, Tensor> random_scene(int64_t N, int64_t R, int64_t H, int64_t W, int64_t K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> rows(size_t(N * R * 5));
  for (size_t i = 0; i < rows.size(); i += 5) {
    rows[i] = int64_t(rng() % uint64_t(K + 2)) - 1;  // -1 .. K: empty and out-of-palette slots too
    rows[i + 1] = int64_t(rng() % uint64_t(H + 4)) - 2, rows[i + 2] = int64_t(rng() % uint64_t(W + 4)) - 2;
    rows[i + 3] = 1 + int64_t(rng() % uint64_t(H)), rows[i + 4] = 1 + int64_t(rng() % uint64_t(W));
  }
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> palette(size_t(K * 3));
  for (float& v : palette) v = u(rng);
  return {ops::from_vector(rows, {N, R, 5}, DType::i64), ops::from_vector(palette, {K, 3}, DType::f32)};
}

}  // namespace

TEST(PaintRectanglesCuda, BitForBitTheCpus) {
  struct Case {
    int64_t N, R, H, W, K;
  };
  // 3 x 13 x 13 = 507 pixels (a tail group of 3); 1 x 513 x 513 (deeplabv3's images, odd); 2 x 64 x 64; 2 x 37 x 70
  // and 1 x 256 x 512 (not square: pix2pixHD's 1 x 2 aspect, with its 8 slots).
  for (const Case& c : {Case{3, 5, 13, 13, 4}, Case{1, 3, 513, 513, 21}, Case{2, 4, 64, 64, 4}, Case{1, 1, 1, 1, 1},
                        Case{2, 8, 37, 70, 35}, Case{1, 8, 256, 512, 35}}) {
    auto [scenes, palette] = random_scene(c.N, c.R, c.H, c.W, c.K, uint64_t(c.H * 31 + c.W * 7 + c.N));
    Tensor scenes_c = to_cuda(scenes), palette_c = to_cuda(palette);
    for (bool borders : {true, false}) {
      ops::PaintOptions o;
      o.height = c.H, o.width = c.W, o.noise = 0.2, o.seed = 0xfeedface12345678ull, o.step = (int64_t(3) << 32) + 11;
      o.labels = borders, o.borders = borders, o.border_label = 255;
      o.instances = !borders;  // each map alone
      o.ellipses = !borders;   // and each shape
      o.dtype = DType::f32;
      const Tensor f32_images = ops::paint_rectangles(scenes, palette, o).images;
      for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
        o.dtype = dt;
        const std::string what = engine::str("paint_rectangles ", engine::dtype_name(dt), " N ", c.N, " R ", c.R, " H ",
                                             c.H, " W ", c.W, " K ", c.K, borders ? " borders + labels" : " instances");
        ops::PaintedImages cpu = ops::paint_rectangles(scenes, palette, o);
        ops::PaintedImages gpu = ops::paint_rectangles(scenes_c, palette_c, o);
        testutil::expect_equal(what + ": images", cpu.images, gpu.images);
        if (dt == DType::bf16 || dt == DType::f16)
          testutil::expect_equal(what + ": images against the f32 images rounded once", ops::to(f32_images, dt),
                                 gpu.images);
        ASSERT_EQ(gpu.labels.defined(), borders) << what;
        ASSERT_EQ(gpu.instances.defined(), !borders) << what;
        if (borders) testutil::expect_equal(what + ": labels", cpu.labels, gpu.labels);
        if (!borders) testutil::expect_equal(what + ": instances", cpu.instances, gpu.instances);
      }
    }
  }
}

TEST(PaintRectanglesCuda, ModelBatchesAreTheSameOnBothDevices) {
  auto cpu = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 30);
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::string t = engine::dtype_name(dt);
    ops::PaintedImages a = models::vision::synthetic_segmentation(3, 65, 21, 255, 7, 12, dt, cpu);
    ops::PaintedImages b = models::vision::synthetic_segmentation(3, 65, 21, 255, 7, 12, dt, testutil::cuda_device());
    testutil::expect_equal("deeplabv3 synthetic images " + t, a.images, b.images);
    testutil::expect_equal("deeplabv3 synthetic labels " + t, a.labels, b.labels);
    models::vision::DetectionBatch x = models::vision::synthetic_detection(3, 64, 80, 100, 7, 12, dt, cpu);
    models::vision::DetectionBatch y =
        models::vision::synthetic_detection(3, 64, 80, 100, 7, 12, dt, testutil::cuda_device());
    testutil::expect_equal("yolov3 synthetic images " + t, x.images, y.images);
    testutil::expect_equal("yolov3 synthetic boxes " + t, x.boxes, y.boxes);
    testutil::expect_equal("yolov3 synthetic labels " + t, x.labels, y.labels);
  }
}

TEST(PaintRectanglesCuda, LedgerMatchesMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    auto dev = engine::default_device();
    Tensor scenes = ops::from_vector(std::vector<int64_t>(2 * 3 * 5, 1), {2, 3, 5}, DType::i64, dev);
    Tensor palette = ops::from_vector(std::vector<float>(21 * 3, 0.5f), {21, 3}, DType::f32, dev);
    ops::PaintOptions o;
    o.height = o.width = 97, o.labels = true, o.borders = true, o.dtype = DType::bf16;
    ops::paint_rectangles(scenes, palette, o);
  });
}

// Perf mode: --gtest_also_run_disabled_tests --gtest_filter='PaintRectanglesCuda.DISABLED_Bandwidth'.
// Bytes: the images and labels written (the scene table and palette are negligible).
TEST(PaintRectanglesCuda, DISABLED_Bandwidth) {
  engine::DeviceGuard guard(testutil::cuda_device());
  auto [scenes, palette] = random_scene(8, 3, 513, 513, 21, 5);
  Tensor scenes_c = to_cuda(scenes), palette_c = to_cuda(palette);
  for (DType dt : {DType::f32, DType::bf16}) {
    ops::PaintOptions o;
    o.height = o.width = 513, o.labels = true, o.borders = true, o.dtype = dt;
    const double bytes = 8.0 * 513 * 513 * (3.0 * double(engine::dtype_size(dt)) + 8.0);
    testutil::measure_bandwidth(engine::str("paint_rectangles 8 x 513 x 513 ", engine::dtype_name(dt), " + labels"),
                                bytes, [&] { ops::paint_rectangles(scenes_c, palette_c, o); });
  }
}
