// maskrcnn_cuda_test.cpp: the engine's Mask R-CNN on the GPU against torchvision with the same weights, fp32 (TF32
// off): torchvision's own modules at the tiny shapes (the cpu suite's file), and maskrcnn_resnet50_fpn itself at
// 800 x 1344 from the file tools/bench/maskrcnn_parity.py --size full writes on the GPU machine (300+ MB: not in the
// repository; tools/bench/maskrcnn_gpu.sh parity makes it and sets MASKRCNN_FULL_REFERENCE).
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/util/cuda_compare_util.h"
#include "tests/util/maskrcnn_reference_util.h"

TEST(MaskRcnnCuda, MatchesTorchvisionAtTheTinyShapes) {
  testutil::expect_maskrcnn_matches_torchvision("tests/data/maskrcnn_reference.safetensors", "tiny",
                                                testutil::cuda_device());
}

TEST(MaskRcnnCuda, MatchesMaskrcnnResnet50FpnAtFullSize) {
  const char* path = std::getenv("MASKRCNN_FULL_REFERENCE");
  if (!path || !*path)
    GTEST_SKIP() << "MASKRCNN_FULL_REFERENCE is not set: tools/bench/maskrcnn_gpu.sh parity writes the file "
                    "(python3 tools/bench/maskrcnn_parity.py --size full --device cuda --out FILE) and runs this";
  // Two fp32 implementations of a 50-layer network with random weights (the engine's kernels, cuDNN's), each some 5e-6
  // from the exact values at the deepest outputs: their difference is bounded by the sum, 2e-5. Measured on the H200
  // (2026-12-02): 4.5e-6 .. 1.02e-5 (the RPN logits at P5), the losses within 4e-7; on the cpu against torchvision's
  // cpu all within 5.5e-6.
  testutil::expect_maskrcnn_matches_torchvision(path, "torchvision", testutil::cuda_device(), 2e-5);
}
