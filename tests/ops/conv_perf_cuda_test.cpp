// conv_perf_cuda_test.cpp: benchmarks of the GPU convolution kernels (not run by default:
// --gtest_also_run_disabled_tests --gtest_filter='ConvCudaPerf*'): TFLOP/s per pass on ResNet-101 / Darknet-53 layer
// shapes in bf16, TF32 and true fp32 (CONV_PERF_RUNS and CONV_PERF_SHAPES pick rows), and the depthwise kernels on
// NASNet-A Large's shapes. tools/bench/conv_torch.py times cuDNN on the same lists. Their correctness tests are in
// conv_cuda_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ops/cuda/conv.h"
#include "ops/cuda/conv_kernels.cuh"
#include "tests/ops/conv_cuda_util.h"
#include "tests/util/cuda_compare_util.h"

using namespace conv_test;  // NOLINT: Case, geometry, random, poisoned, the scopes (conv_cuda_util.h)

// TFLOP/s of each pass on ResNet-101 / Darknet-53 layer shapes (tools/bench/conv_torch.py times cuDNN on the same
// list): bf16 with the wgmma kernels (where the build and device have them; tile by the shape, then 128 x 128,
// 128 x 256 and 256 x 128 forced, then by the shape with the forward's weights by cp.async instead of the bulk tensor
// copy: "cpa", then with the forward's x by cp.async and its weights by the bulk copy: "tmab") and with the mma.sync
// kernels' 128 x 128 tile variants (v0: warps of 64 x 32, v1: 64 x 64), f32 on TF32 tensor cores (allow_tf32, each
// kernel's default tile: v1 forward and weight gradient, v0 data gradient) on every shape, and true fp32 (CUDA cores,
// or cuBLASLt for 1x1; Winograd's F(2x2, 3x3) where the op runs it) on the first three, the stride-2 ones and
// Darknet's, then once more without Winograd ("fp32/d": the direct SIMT kernels). One row per run, then a table side
// by side (bf16 wgmma, bf16 v0, tf32, fp32).
TEST(ConvCudaPerf, DISABLED_TFlops) {
  const std::vector<std::pair<const char*, Case>> shapes = {
      {"ResNet 3x3 64->64 128^2 N8", {8, 128, 128, 64, 64, 3, 3, params(1, 1)}},
      {"ResNet 3x3 d2 256->256 32^2 N8", {8, 32, 32, 256, 256, 3, 3, params(1, 2, 2)}},
      {"ResNet 1x1 1024->256 32^2 N8", {8, 32, 32, 1024, 256, 1, 1, params(1, 0)}},
      {"stem 7x7 s2 3->64 513^2 N2", {2, 513, 513, 3, 64, 7, 7, params(2, 3)}},
      {"3x3 s2 128->256 76^2 N8", {8, 76, 76, 128, 256, 3, 3, params(2, 1)}},
      {"Darknet 3x3 128->256 152^2 N8", {8, 152, 152, 128, 256, 3, 3, params(1, 1)}},
      {"Darknet 3x3 s2 256->512 152^2 N8", {8, 152, 152, 256, 512, 3, 3, params(2, 1)}},
      {"Darknet stem 3x3 3->32 416^2 N8", {8, 416, 416, 3, 32, 3, 3, params(1, 1)}},
  };
  constexpr int kCalls = 10;  // per timed run: the synchronization's cost spread over 10 launches
  const auto dev = testutil::cuda_device();
  struct Run {
    const char* type;  // "bf16/wg", "bf16/w128", "bf16/w256", "bf16/m256", "bf16/cpa", "bf16/v0", "bf16/v1", "tf32",
                       // "fp32"
    DType dtype;
    int variant;  // mma.sync 128 x 128 tile variant, -1 the default
    bool wgmma;   // the wgmma kernels where available (16-bit types)
    bool tf32;
    bool all_shapes;  // else the first three and Darknet's
    ops::cuda::conv::WgShape wgmma_shape = ops::cuda::conv::WgShape::by_shape;
    bool tma = true;       // the wgmma forward's weight tiles by the bulk tensor copy
    bool im2col = true;    // the wgmma forward's x tiles by the im2col bulk copy where it applies
    bool winograd = true;  // f32: Winograd where the op would run it (conv_params.h's conv2d_winograd)
  };
  using ops::cuda::conv::WgShape;
  const Run runs[] = {{"bf16/wg", DType::bf16, -1, true, false, true},
                      {"bf16/w128", DType::bf16, -1, true, false, true, WgShape::m128n128},
                      {"bf16/w256", DType::bf16, -1, true, false, true, WgShape::m128n256},
                      {"bf16/m256", DType::bf16, -1, true, false, true, WgShape::m256n128},
                      {"bf16/cpa", DType::bf16, -1, true, false, true, WgShape::by_shape, false},
                      {"bf16/tmab", DType::bf16, -1, true, false, true, WgShape::by_shape, true, false},
                      {"bf16/v0", DType::bf16, 0, false, false, true},
                      {"bf16/v1", DType::bf16, 1, false, false, true},
                      {"tf32", DType::f32, -1, true, true, true},
                      {"fp32", DType::f32, -1, true, false, false},
                      {"fp32/d", DType::f32, -1, true, false, false, WgShape::by_shape, true, true, false}};
  const std::vector<size_t> fp32_shapes = {0, 1, 2, 4, 5, 6};
  std::map<std::pair<size_t, std::string>, std::array<double, 3>> tflops;  // (shape, type) -> fwd/data/weight
  std::printf("%-34s %-7s %-44s %9s %9s %9s\n", "layer", "dtype", "paths fwd/data/weight", "fwd", "data", "weight");
  // CONV_PERF_RUNS="bf16/wg,bf16/v0" times only those rows (a shorter call on the GPU machine); CONV_PERF_SHAPES=
  // "Darknet" only the layers whose names contain it (one kernel under ncu).
  const char* only = std::getenv("CONV_PERF_RUNS");
  const char* only_shapes = std::getenv("CONV_PERF_SHAPES");
  for (const Run& r : runs) {
    if (only && !std::string(only).empty() &&
        ("," + std::string(only) + ",").find("," + std::string(r.type) + ",") == std::string::npos)
      continue;
    engine::set_allow_tf32(r.tf32);
    WinogradScope winograd_on(r.winograd);  // "fp32/d": the direct kernels, for comparison
    ops::cuda::conv::set_igemm_wide_variant(r.variant);
    ops::cuda::conv::set_igemm_wgmma(r.wgmma);
    ops::cuda::conv::set_igemm_wgmma_shape(r.wgmma_shape);
    ops::cuda::conv::set_igemm_tma(r.tma);
    ops::cuda::conv::set_igemm_im2col(r.im2col);
    if (r.wgmma && r.dtype != DType::f32 && !ops::cuda::conv::igemm_wgmma_available()) continue;
    for (size_t s = 0; s < shapes.size(); s++) {
      if (!r.all_shapes && std::find(fp32_shapes.begin(), fp32_shapes.end(), s) == fp32_shapes.end()) continue;
      const auto& [name, c] = shapes[s];
      if (only_shapes && std::string(name).find(only_shapes) == std::string::npos) continue;
      const DType t = r.dtype;
      const bool slow = !r.tf32 && t == DType::f32;
      const int calls = slow ? 2 : kCalls, reps = slow ? 3 : 7;
      const ops::ConvGeometry g = geometry(c);
      const double flops = 2.0 * double(g.gemm_m()) * double(g.cout) * double(g.gemm_k());
      Tensor x = ops::to_device(random({g.n, g.h, g.w, g.cin}, t), dev);
      Tensor w = ops::to_device(random({g.cout, g.kh, g.kw, g.cin_per_group()}, t), dev);
      Tensor dy = ops::to_device(random({g.n, g.ho, g.wo, g.cout}, t), dev);
      Tensor y = poisoned(dy.shape(), t), dx = poisoned(x.shape(), t), dw = poisoned(w.shape(), t);
      // The op's Winograd workspaces (none for "fp32/d", whose scope turned Winograd off: the direct kernels).
      const Tensor wino_f = winograd_workspace(g, ConvPass::forward, t);
      const Tensor wino_d = winograd_workspace(g, ConvPass::data, t);
      const Tensor wino_w = winograd_workspace(g, ConvPass::weight, t);
      const int64_t splits = wino_w.defined() ? 1 : ops::conv2d_weight_grad_splits(g);
      Tensor ws = splits > 1 ? poisoned({splits, g.cout, g.kh, g.kw, g.cin_per_group()}, DType::f32) : Tensor();
      auto time = [&](const std::function<void()>& fn) { return testutil::median_ms_per_call(fn, calls, reps); };
      const double f = time([&] { ops::cuda::conv2d_forward(x, w, Tensor(), y, g, Tensor(), wino_f); });
      const double d = time([&] { ops::cuda::conv2d_backward_data(dy, w, dx, g, Tensor(), wino_d); });
      const double wt = time([&] { ops::cuda::conv2d_backward_weight(x, dy, dw, ws, g, Tensor(), wino_w); });
      const std::string paths = engine::str(ops::cuda::conv2d_path(ConvPass::forward, g, t), "/",
                                            ops::cuda::conv2d_path(ConvPass::data, g, t), "/",
                                            ops::cuda::conv2d_path(ConvPass::weight, g, t), " splits ", splits);
      tflops[{s, r.type}] = {flops / f * 1e-9, flops / d * 1e-9, flops / wt * 1e-9};
      std::printf("%-34s %-7s %-44s %9.1f %9.1f %9.1f   TFLOP/s (%.3f / %.3f / %.3f ms)\n", name, r.type, paths.c_str(),
                  flops / f * 1e-9, flops / d * 1e-9, flops / wt * 1e-9, f, d, wt);
    }
  }
  engine::set_allow_tf32(false);
  ops::cuda::conv::set_igemm_wide_variant(-1);
  ops::cuda::conv::set_igemm_wgmma(true);
  ops::cuda::conv::set_igemm_wgmma_shape(WgShape::by_shape);
  ops::cuda::conv::set_igemm_tma(true);
  ops::cuda::conv::set_igemm_im2col(true);
  std::printf("\nTFLOP/s fwd/data/weight %-10s %-20s %-20s %-20s %-20s\n", "", "bf16 (wgmma)", "bf16 (v0)", "tf32",
              "fp32");
  auto cell = [&](size_t s, const char* type) {
    auto it = tflops.find({s, type});
    if (it == tflops.end()) return std::string("-");
    return engine::str(std::round(it->second[0] * 10) / 10, " / ", std::round(it->second[1] * 10) / 10, " / ",
                       std::round(it->second[2] * 10) / 10);
  };
  for (size_t s = 0; s < shapes.size(); s++)
    std::printf("%-34s %-20s %-20s %-20s %-20s\n", shapes[s].first, cell(s, "bf16/wg").c_str(),
                cell(s, "bf16/v0").c_str(), cell(s, "tf32").c_str(), cell(s, "fp32").c_str());
}

// Depthwise convolutions on NASNet-A Large's shapes at batch 32 (cell_stem_0's stride-2 branches at 165^2,
// the normal cells' at 42^2 / 21^2 / 11^2, the reduction cells'): milliseconds per pass and the bandwidth of
// the bytes each pass must move at least (forward: x read, y written; data: dy read, dx written; weight:
// x and dy read), bf16 and f32. tools/bench/conv_torch.py --depthwise times cuDNN on the same list.
TEST(ConvCudaPerf, DISABLED_Depthwise) {
  struct Shape {
    const char* name;
    Case c;
  };
  auto dw = [](int64_t h, int64_t c, int64_t k, int64_t s) {
    return Case{32, h, h, c, c, k, k, params(s, (k - 1) / 2, 1, c)};
  };
  const std::vector<Shape> shapes = {
      {"dw 5x5 s2 42ch 165^2", dw(165, 42, 5, 2)}, {"dw 7x7 s2 96ch 165^2", dw(165, 96, 7, 2)},
      {"dw 5x5 s1 42ch 83^2", dw(83, 42, 5, 1)},   {"dw 7x7 s2 84ch 83^2", dw(83, 84, 7, 2)},
      {"dw 3x3 s1 168ch 42^2", dw(42, 168, 3, 1)}, {"dw 5x5 s1 168ch 42^2", dw(42, 168, 5, 1)},
      {"dw 7x7 s2 336ch 42^2", dw(42, 336, 7, 2)}, {"dw 5x5 s1 336ch 21^2", dw(21, 336, 5, 1)},
      {"dw 3x3 s1 672ch 11^2", dw(11, 672, 3, 1)}, {"dw 7x7 s1 672ch 11^2", dw(11, 672, 7, 1)},
  };
  const auto dev = testutil::cuda_device();
  std::printf("%-24s %-5s %10s %10s %10s   %s\n", "layer", "dtype", "fwd ms", "data ms", "weight ms",
              "GB/s fwd / data / weight");
  for (DType t : {DType::bf16, DType::f32}) {
    for (const Shape& sh : shapes) {
      const ops::ConvGeometry g = geometry(sh.c);
      Tensor x = ops::to_device(random({g.n, g.h, g.w, g.cin}, t), dev);
      Tensor w = ops::to_device(random({g.cout, g.kh, g.kw, 1}, t), dev);
      Tensor dy = ops::to_device(random({g.n, g.ho, g.wo, g.cout}, t), dev);
      Tensor y = poisoned(dy.shape(), t), dx = poisoned(x.shape(), t), dwt = poisoned(w.shape(), t);
      const int64_t splits = ops::conv2d_weight_grad_splits(g);
      Tensor ws = splits > 1 ? poisoned({splits, g.cout, g.kh, g.kw, 1}, DType::f32) : Tensor();
      auto time = [&](const std::function<void()>& fn) { return testutil::median_ms_per_call(fn, 10); };
      const double f = time([&] { ops::cuda::conv2d_forward(x, w, Tensor(), y, g); });
      const double d = time([&] { ops::cuda::conv2d_backward_data(dy, w, dx, g); });
      const double wt = time([&] { ops::cuda::conv2d_backward_weight(x, dy, dwt, ws, g); });
      const double bytes = double(x.nbytes() + dy.nbytes());
      std::printf("%-24s %-5s %10.4f %10.4f %10.4f   %.0f / %.0f / %.0f\n", sh.name, engine::dtype_name(t), f, d, wt,
                  bytes / f * 1e-6, bytes / d * 1e-6, bytes / wt * 1e-6);
    }
  }
}
