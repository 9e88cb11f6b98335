// nasnet_cuda_test.cpp: the engine's NASNet on the GPU against timm's on a small network (the check the cpu suite
// runs too: tests/util/nasnet_reference_util.h): the CUDA kernels of the separable convolutions, pools, padding and
// the optimizer give timm's float64 logits, loss, gradients and loss after one update.
#include <gtest/gtest.h>

#include "engine/device.h"
#include "tests/util/nasnet_reference_util.h"

TEST(NasNetCuda, MatchesTimmOnASmallNetwork) {
  testutil::expect_nasnet_matches_timm_reference(engine::Device::create(engine::DeviceType::cuda, size_t(8) << 30));
}
