// dropout_cuda_test.cpp: everything the GPU draws from Philox against the cpu: dropout's kept masks and
// outputs bit for bit (packed and strided kernels, any generator offset), its gradient, and the random
// factories (rand and randint bit for bit, randn to 1e-6), plus a GPU run's ledger equal to meta's.
#include <gtest/gtest.h>

#include "engine/rng.h"
#include "graph/autograd.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/view.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::cpu_input;
using testutil::to_cuda;

namespace {

const DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

// Checks dropout_mask_apply(x, p, seed, offset) on both devices: the kept masks (out != 0; x has no zeros)
// exactly, then the values exactly (one float multiply on both).
void expect_same_dropout(const std::string& what, const Tensor& x, const Tensor& xc, double p, uint64_t seed,
                         uint64_t offset) {
  Tensor y = ops::dropout_mask_apply(x, p, seed, offset);
  Tensor yc = ops::dropout_mask_apply(xc, p, seed, offset);
  testutil::expect_equal(what + ": kept mask", ops::compare(ops::CompareOp::ne, y, 0.0),
                         ops::compare(ops::CompareOp::ne, yc, 0.0));
  testutil::expect_equal(what + ": values", y, yc);
}

}  // namespace

TEST(DropoutCuda, MasksAndValuesAreBitForBitTheCpus) {
  const uint64_t seed = 0x1234abcd5678ull;
  for (DType dt : kFloats) {
    // [0.5, 1.5): no zeros, so a zero output means a dropped element.
    Tensor x = cpu_input({37, 129}, dt, 0.5, 1.5), xc = to_cuda(x);
    for (double p : {0.1, 0.5, 0.9, 1.0}) {
      for (uint64_t offset : {uint64_t(0), uint64_t(4096), uint64_t(3), uint64_t(1) << 40}) {
        std::string what = engine::str("dropout ", engine::dtype_name(dt), " p ", p, " offset ", offset);
        expect_same_dropout(what + " dense", x, xc, p, seed, offset);  // packed kernel unless offset % 4
        expect_same_dropout(what + " transposed", ops::transpose(x, 0, 1), ops::transpose(xc, 0, 1), p, seed, offset);
        expect_same_dropout(what + " misaligned", ops::slice(x, 1, 1, 129), ops::slice(xc, 1, 1, 129), p, seed, offset);
      }
    }
  }
}

TEST(DropoutCuda, ForwardAndBackwardThroughTheGenerator) {
  engine::manual_seed(2024);
  ops::rand({5});  // the generator off offset 0
  for (DType dt : kFloats) {
    // The helper gives both runs the same generator state, so both draw the mask at the same (seed, offset).
    testutil::expect_cuda_matches_cpu(
        engine::str("dropout ", engine::dtype_name(dt)),
        [](const std::vector<Tensor>& in) { return ops::dropout(ops::mul(in[0], in[0]), 0.3); },
        {cpu_input({8, 1001}, dt, 0.5, 1.5, true)}, testutil::Tolerance{0, 0});
  }
}

TEST(DropoutCuda, RandomFactoriesDrawTheCpusNumbers) {
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8};
  for (uint64_t offset : {uint64_t(0), uint64_t(8), uint64_t(5)}) {  // 5: not a multiple of 4 (set by hand)
    for (DType dt : dtypes) {
      std::string what = engine::str(engine::dtype_name(dt), " at offset ", offset);
      auto draw = [&](const std::function<Tensor(std::shared_ptr<engine::Device>)>& make) {
        engine::generator() = engine::Generator{77, offset};
        Tensor on_cpu = make(nullptr);
        uint64_t after = engine::generator().offset;
        engine::generator() = engine::Generator{77, offset};
        Tensor on_cuda = make(testutil::cuda_device());
        EXPECT_EQ(engine::generator().offset, after) << what << ": numbers reserved";
        return std::make_pair(on_cpu, on_cuda);
      };
      auto r = draw([&](auto d) { return ops::randint({3, 333}, 100, dt, d); });
      testutil::expect_equal("randint " + what, r.first, r.second);
      if (!engine::is_floating(dt)) continue;
      r = draw([&](auto d) { return ops::rand({3, 333}, -2.5, 4.0, dt, d); });
      testutil::expect_equal("rand " + what, r.first, r.second);
      r = draw([&](auto d) { return ops::randn({3, 333}, 0.5, 2.0, dt, d); });
      // The device's log and cos may differ from the host's in the last bits (f32: ~1e-7 relative).
      testutil::Tolerance tol = dt == DType::f64   ? testutil::Tolerance{1e-12, 1e-12}
                                : dt == DType::f32 ? testutil::Tolerance{1e-6, 1e-6}
                                                   : testutil::tolerance_for(dt);
      testutil::expect_close("randn " + what, r.first, r.second, tol);
    }
  }
}

TEST(DropoutCuda, LedgerOfAGpuRunEqualsMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor x = ops::randn({16, 257}).set_requires_grad(true);
    Tensor y = ops::dropout(ops::gelu(x), 0.1);
    Tensor z = ops::dropout(ops::to(y, DType::bf16), 0.2);
    graph::backward(ops::sum(ops::to(z, DType::f32)));
  });
}

// Drop path on the GPU: the same per-sample draws and values as the cpu, dense (vectorized and not) and strided.
TEST(DropoutCuda, DropPathIsBitForBitTheCpus) {
  for (DType dt : kFloats) {
    for (const Shape& xs : {Shape{9, 5, 4, 16}, Shape{7, 3, 3, 3}}) {  // 16-byte rows, and odd ones
      Tensor x = cpu_input(xs, dt, 0.5, 1.5), xc = to_cuda(x);
      for (uint64_t offset : {uint64_t(0), uint64_t(5)}) {
        const std::string what = engine::str("drop_path ", engine::dtype_name(dt), " ", engine::shape_str(xs));
        testutil::expect_equal(what, ops::drop_path_mask_apply(x, 0.6, 77, offset),
                               ops::drop_path_mask_apply(xc, 0.6, 77, offset));
        testutil::expect_equal(what + " strided", ops::drop_path_mask_apply(ops::transpose(x, 1, 2), 0.6, 77, offset),
                               ops::drop_path_mask_apply(ops::transpose(xc, 1, 2), 0.6, 77, offset));
      }
    }
  }
}
