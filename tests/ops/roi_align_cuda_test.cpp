// roi_align_cuda_test.cpp: RoIAlign on the GPU against the cpu reference, forward and backward bit for bit in f32,
// f64 and bf16, on random pyramids (boxes across the edges, tiny and inverted ones, padding RoIs) of Mask R-CNN-like
// and odd sizes, both alignments; repeatable; the ledger against meta.
#include <gtest/gtest.h>

#include <random>

#include "engine/device.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/roi_align.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::to_cuda;

namespace {

struct Pyramid {
  std::vector<Tensor> levels;
  Tensor rois, roi_levels;
  ops::RoiAlignParams p;
};

// N images of image_h x image_w, levels at 1/4 .. 1/2^(L+1), C channels, R random RoIs (some padding).
Pyramid random_pyramid(int64_t N, int64_t image_h, int64_t image_w, int64_t L, int64_t C, int64_t R, int64_t out,
                       bool aligned, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  Pyramid p;
  p.p.out_h = p.p.out_w = out, p.p.sampling_ratio = 2, p.p.aligned = aligned;
  for (int64_t l = 0; l < L; l++) {
    const double s = 1.0 / double(int64_t(4) << l);
    p.p.scales.push_back(s);
    const Shape shape{N, int64_t(std::ceil(double(image_h) * s)), int64_t(std::ceil(double(image_w) * s)), C};
    std::vector<double> v(size_t(engine::numel_of(shape)));
    for (double& e : v) e = 2 * u(rng) - 1;
    p.levels.push_back(ops::from_vector(v, shape, dtype));
  }
  std::vector<float> rois;
  std::vector<int64_t> levels;
  for (int64_t r = 0; r < R; r++) {
    const double x1 = u(rng) * 1.2 * double(image_w) - 0.1 * double(image_w), w = u(rng) * 0.6 * double(image_w);
    const double y1 = u(rng) * 1.2 * double(image_h) - 0.1 * double(image_h), h = u(rng) * 0.6 * double(image_h);
    const bool inverted = r % 17 == 5, pad = r % 13 == 7;
    rois.insert(rois.end(), {float(pad && r % 2 ? -1 : int64_t(rng() % uint64_t(N))), float(x1),
                             float(inverted ? y1 - h : y1), float(x1 + w), float(inverted ? y1 : y1 + h)});
    levels.push_back(pad && r % 2 == 0 ? L : int64_t(rng() % uint64_t(L)));
  }
  p.rois = ops::from_vector(rois, {R, 5}, DType::f32);
  p.roi_levels = ops::from_vector(levels, {R}, DType::i64);
  return p;
}

}  // namespace

TEST(RoiAlignCuda, BitForBitTheCpus) {
  struct Shape_ {
    int64_t N, H, W, L, C, R, out;
  };
  // Mask R-CNN's box pooler (4 levels, 7 x 7, 256 channels: more than one channel block) at a small image; its mask
  // pooler (14 x 14); odd sizes with 3 channels and one level.
  for (const Shape_& s :
       {Shape_{2, 96, 160, 4, 256, 64, 7}, Shape_{1, 64, 64, 4, 130, 24, 14}, Shape_{3, 37, 51, 1, 3, 40, 5}}) {
    for (bool aligned : {false, true})
      for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
        const std::string what =
            engine::str("roi_align ", engine::dtype_name(dt), " N ", s.N, " ", s.H, "x", s.W, " L ", s.L, " C ", s.C,
                        " R ", s.R, " out ", s.out, aligned ? " aligned" : "");
        Pyramid p = random_pyramid(s.N, s.H, s.W, s.L, s.C, s.R, s.out, aligned, dt, uint64_t(s.H * 7 + s.C));
        std::vector<Tensor> gpu_levels;
        std::vector<Shape> shapes;
        for (const Tensor& x : p.levels) gpu_levels.push_back(to_cuda(x)), shapes.push_back(x.shape());
        const Tensor rois = to_cuda(p.rois), roi_levels = to_cuda(p.roi_levels);
        Tensor y_cpu = ops::roi_align(p.levels, p.rois, p.roi_levels, p.p);
        Tensor y_gpu = ops::roi_align(gpu_levels, rois, roi_levels, p.p);
        testutil::expect_equal(what + ": forward", y_cpu, y_gpu);
        Tensor g_cpu = ops::mul(y_cpu, 3.0);  // any values of g's shape
        std::vector<Tensor> dx_cpu = ops::roi_align_backward(g_cpu, shapes, p.rois, p.roi_levels, p.p);
        std::vector<Tensor> dx_gpu = ops::roi_align_backward(to_cuda(g_cpu), shapes, rois, roi_levels, p.p);
        for (size_t l = 0; l < shapes.size(); l++)
          testutil::expect_equal(what + engine::str(": backward level ", l), dx_cpu[l], dx_gpu[l]);
        std::vector<Tensor> again = ops::roi_align_backward(to_cuda(g_cpu), shapes, rois, roi_levels, p.p);
        for (size_t l = 0; l < shapes.size(); l++)
          testutil::expect_equal(what + engine::str(": backward repeated, level ", l), dx_gpu[l], again[l]);
      }
  }
}

TEST(RoiAlignCuda, LedgerMatchesMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Pyramid p = random_pyramid(2, 64, 96, 4, 32, 20, 7, false, DType::bf16, 3);
    for (Tensor& x : p.levels) {
      x = ops::to(x, DType::bf16);
      x.set_requires_grad(true);
    }
    Tensor y = ops::roi_align(p.levels, p.rois, p.roi_levels, p.p);
    graph::backward(ops::sum(ops::to(y, DType::f32)));
  });
}
