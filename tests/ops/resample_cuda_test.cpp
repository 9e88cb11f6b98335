// resample_cuda_test.cpp: nearest / bilinear upsampling and constant / reflection padding on the GPU against
// the cpu reference for every dtype: outputs and gradients (the gather-form backward kernels), the backward
// ops' own rules (the forward ops again); the ledger equal to meta's.
#include <gtest/gtest.h>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/resample.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::cpu_input;

namespace {

const DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

struct Case {
  const char* name;
  Shape shape;  // x, NHWC
  ops::UpsampleParams p;
};

ops::UpsampleParams up(ops::UpsampleMode mode, int64_t h, int64_t w, bool align_corners, double sh = 0, double sw = 0) {
  ops::UpsampleParams p;
  p.mode = mode, p.out_h = h, p.out_w = w, p.align_corners = align_corners, p.scale_h = sh, p.scale_w = sw;
  return p;
}

std::vector<Case> cases() {
  using M = ops::UpsampleMode;
  return {
      {"nearest 2x (YOLOv3)", {2, 13, 13, 32}, up(M::nearest, 26, 26, false)},
      {"nearest 3 -> 7, 5 -> 4", {2, 3, 5, 7}, up(M::nearest, 7, 4, false)},
      {"nearest scale 1.7", {1, 10, 6, 3}, up(M::nearest, 17, 10, false, 1.7, 1.7)},
      {"bilinear 33 -> 257 (DeepLab logits)", {1, 33, 33, 21}, up(M::bilinear, 257, 257, false)},
      {"bilinear align_corners 9 -> 31", {2, 9, 9, 8}, up(M::bilinear, 31, 31, true)},
      {"bilinear down 17 -> 6", {2, 17, 11, 5}, up(M::bilinear, 6, 4, false)},
      {"bilinear scale 2.5", {1, 6, 7, 4}, up(M::bilinear, 15, 17, false, 2.5, 2.5)},
  };
}

ops::Pad2dParams pads(int64_t l, int64_t r, int64_t t, int64_t b, ops::PadMode mode, double value = 0) {
  ops::Pad2dParams p;
  p.left = l, p.right = r, p.top = t, p.bottom = b, p.mode = mode, p.value = value;
  return p;
}

}  // namespace

TEST(ResampleCuda, UpsampleMatchesCpu) {
  for (DType dt : kFloats) {
    for (const Case& c : cases()) {
      const ops::UpsampleParams p = c.p;
      testutil::expect_cuda_matches_cpu(
          engine::str("upsample ", engine::dtype_name(dt), " ", c.name, " ", engine::shape_str(c.shape)),
          [p](const std::vector<Tensor>& in) { return ops::upsample2d(in[0], p); },
          {cpu_input(c.shape, dt, -2, 2, true)});
    }
  }
}

TEST(ResampleCuda, PadMatchesCpu) {
  for (DType dt : kFloats) {
    for (auto mode : {ops::PadMode::constant, ops::PadMode::reflect}) {
      const ops::Pad2dParams p = pads(3, 2, 1, 3, mode, 0.75);
      testutil::expect_cuda_matches_cpu(
          engine::str("pad2d ", engine::dtype_name(dt), mode == ops::PadMode::reflect ? " reflect" : " constant"),
          [p](const std::vector<Tensor>& in) { return ops::pad2d(in[0], p); },
          {cpu_input({2, 9, 10, 36}, dt, -2, 2, true)});
    }
    // An odd channel count: one channel per thread (36 channels take 16-byte vectors where they fit).
    testutil::expect_cuda_matches_cpu(
        engine::str("pad2d 35 channels ", engine::dtype_name(dt)),
        [](const std::vector<Tensor>& in) { return ops::pad2d(in[0], pads(1, 2, 2, 1, ops::PadMode::reflect)); },
        {cpu_input({2, 9, 10, 35}, dt, -2, 2, true)});
    // Negative constant padding crops (NASNet's shifted path: ZeroPad2d((-1, 1, -1, 1))), forward and backward.
    const ops::Pad2dParams crop = pads(-1, 1, -1, 1, ops::PadMode::constant);
    testutil::expect_cuda_matches_cpu(engine::str("pad2d crop ", engine::dtype_name(dt)),
                                      [crop](const std::vector<Tensor>& in) { return ops::pad2d(in[0], crop); },
                                      {cpu_input({2, 9, 10, 36}, dt, -2, 2, true)});
  }
}

TEST(ResampleCuda, BackwardOpsAndTheirRulesMatchCpu) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (const Case& c : cases()) {
      const ops::UpsampleParams p = c.p;
      const Shape xs = c.shape;
      testutil::expect_cuda_matches_cpu(
          engine::str("upsample2d_backward ", engine::dtype_name(dt), " ", c.name),
          [&](const std::vector<Tensor>& in) { return ops::upsample2d_backward(in[0], xs, p); },
          {cpu_input({xs[0], p.out_h, p.out_w, xs[3]}, dt, -1, 1, true)},
          // An input pixel sums up to (257 / 33)^2 ~ 64 weighted gradients (cpu: separate multiply and add, cuda:
          // fused): in f32 a few 1e-5 of error on sums of that many terms.
          dt == DType::f32 ? testutil::Tolerance{5e-5, 5e-5} : testutil::Tolerance{});
    }
    const ops::Pad2dParams p = pads(3, 2, 1, 3, ops::PadMode::reflect);
    testutil::expect_cuda_matches_cpu(engine::str("pad2d_backward reflect ", engine::dtype_name(dt)),
                                      [&](const std::vector<Tensor>& in) {
                                        return ops::pad2d_backward(in[0], {2, 9, 10, 36}, p);
                                      },
                                      {cpu_input({2, 13, 15, 36}, dt, -1, 1, true)});
  }
}

TEST(ResampleCuda, LedgerMatchesMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor x = ops::rand({2, 13, 13, 16}).set_requires_grad(true);
    Tensor a = ops::pad2d(x, pads(1, 1, 1, 1, ops::PadMode::reflect));
    Tensor b = ops::upsample_nearest2d(a, 30, 30);
    Tensor c = ops::upsample_bilinear2d(b, 65, 65, false);
    graph::backward(ops::sum(ops::mul(c, c)));
  });
}

// Not run by default (--gtest_also_run_disabled_tests): DeepLab's logits upsampling, YOLO's 2x nearest.
TEST(ResampleCuda, DISABLED_Bandwidth) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor x = testutil::to_cuda(cpu_input({8, 33, 33, 256}, dt, -2, 2));
    Tensor y = testutil::to_cuda(cpu_input({8, 513, 513, 21}, dt, -2, 2));
    Tensor logits = testutil::to_cuda(cpu_input({8, 33, 33, 21}, dt, -2, 2));
    testutil::measure_bandwidth(engine::str("upsample_nearest2d 2x ", engine::dtype_name(dt)), 5.0 * double(x.nbytes()),
                                [&] { ops::upsample_nearest2d(x, 66, 66); });
    testutil::measure_bandwidth(engine::str("upsample_bilinear2d 33 -> 513 ", engine::dtype_name(dt)),
                                double(y.nbytes()), [&] { ops::upsample_bilinear2d(logits, 513, 513, false); });
    testutil::measure_bandwidth(engine::str("upsample2d_backward bilinear 513 -> 33 ", engine::dtype_name(dt)),
                                double(y.nbytes()), [&] {
                                  ops::UpsampleParams p;
                                  p.mode = ops::UpsampleMode::bilinear, p.out_h = 513, p.out_w = 513;
                                  ops::upsample2d_backward(y, {8, 33, 33, 21}, p);
                                });
  }
}
