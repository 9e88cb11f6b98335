// reduce_cuda_test.cpp: sum, mean, amax and argmax on the GPU against the cpu reference, over every kernel
// path: rows (warp and block, dense and strided, misaligned), columns, reductions split into partial sums
// (the op's workspace), ties and NaNs in max (first index, NaN wins), gradients, bit-for-bit repeatability,
// and a GPU run's ledger equal to meta's (workspace included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/view.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::cpu_input;
using testutil::expect_cuda_matches_cpu;
using testutil::to_cuda;

namespace {

const DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

struct SumCase {
  const char* layout;
  Shape shape;
  std::vector<int64_t> dims;
  bool transpose;  // reduce transpose(x, 0, last) instead of x
};

// Sums over long runs: the cpu adds one at a time in float, so its own rounding error grows like
// sqrt(n) ulps of the running sum (1.3e-5 relative was seen for 300001 terms); the GPU adds in trees.
testutil::Tolerance long_sum_tolerance(DType dt) {
  return dt == DType::f32 ? testutil::Tolerance{1e-4, 1e-4} : testutil::Tolerance{};
}

}  // namespace

TEST(ReduceCuda, SumAndMeanMatchCpuOnEveryPath) {
  const SumCase cases[] = {
      {"rows (warp per output)", {6, 7, 129}, {2}, false},
      {"columns", {6, 7, 129}, {0}, false},
      {"middle dim (columns with outer outputs)", {6, 7, 129}, {1}, false},
      {"outer and inner dims (rows, two reduced dims)", {6, 7, 129}, {0, 2}, false},
      {"all", {6, 7, 129}, {}, false},
      {"leading two (columns)", {6, 7, 129}, {0, 1}, false},
      {"columns of even width (16-bit pairs)", {50, 6, 34}, {0}, false},
      {"columns of even width, a partial tile", {70, 3, 264}, {0}, false},
      {"transposed input", {9, 4, 33}, {0}, true},
      {"long rows (block per output)", {3, 5000}, {1}, false},
      {"split rows (partial sums)", {2, 70000}, {1}, false},
      {"split columns (partial sums)", {20000, 40}, {0}, false},
      {"split full sum", {300001}, {}, false},
  };
  for (DType dt : kFloats) {
    for (const SumCase& c : cases) {
      for (bool is_mean : {false, true}) {
        std::string what = engine::str(is_mean ? "mean " : "sum ", engine::dtype_name(dt), " ", c.layout, " ",
                                       engine::shape_str(c.shape));
        auto f = [&c, is_mean](const std::vector<Tensor>& in) {
          Tensor x = c.transpose ? ops::transpose(in[0], 0, in[0].dim() - 1) : in[0];
          return is_mean ? ops::mean(x, c.dims, true) : ops::sum(x, c.dims, false);
        };
        // [0, 1): sums stay positive and well conditioned; f16 holds the largest (35000).
        expect_cuda_matches_cpu(what, f, {cpu_input(c.shape, dt, 0, 1, true)}, long_sum_tolerance(dt));
      }
    }
  }
}

TEST(ReduceCuda, SumOfMisalignedRunsAndEmptyInputs) {
  for (DType dt : kFloats) {
    // Rows that start 1 element into the storage: the scalar head before the 16-byte packs.
    expect_cuda_matches_cpu(
        engine::str("sum misaligned rows ", engine::dtype_name(dt)),
        [](const std::vector<Tensor>& in) { return ops::sum(ops::slice(in[0], 1, 1, 5001), {1}); },
        {cpu_input({3, 5001}, dt, 0, 1, true)}, long_sum_tolerance(dt));
    // No inputs per output: zeros.
    Tensor empty = ops::zeros({0, 5}, dt);
    testutil::expect_equal(engine::str("sum of [0, 5] ", engine::dtype_name(dt)), ops::sum(empty, {0}),
                           ops::sum(to_cuda(empty), {0}));
  }
}

TEST(ReduceCuda, SplitSumsAreBitwiseRepeatable) {
  Tensor x = to_cuda(cpu_input({2, 70000}, DType::f32, -1, 1));
  Tensor c = to_cuda(cpu_input({20000, 40}, DType::f32, -1, 1));
  testutil::expect_equal("split row sum, run twice", ops::sum(x, {1}), ops::sum(x, {1}));
  testutil::expect_equal("split column sum, run twice", ops::sum(c, {0}), ops::sum(c, {0}));
}

TEST(ReduceCuda, AmaxAndArgmaxTakeTheFirstMaxAndNaN) {
  // Small integers (many ties) with NaNs sprinkled in: rows with none, one, and several.
  auto values = [](const Shape& shape, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<double> v(size_t(engine::numel_of(shape)));
    for (double& e : v) e = double(rng() % 5) - 2;
    for (size_t i = 0; i < v.size(); i += 37 + rng() % 50) v[i] = std::numeric_limits<double>::quiet_NaN();
    return v;
  };
  struct Case {
    const char* layout;
    Shape shape;
    int64_t dim;
  };
  const Case cases[] = {{"rows (warp)", {12, 50}, 1},    {"rows (block)", {3, 5000}, 1},
                        {"columns", {40, 30}, 0},        {"middle", {5, 40, 7}, 1},
                        {"one element", {6, 1}, 1}};
  for (DType dt : kFloats) {
    for (const Case& c : cases) {
      Tensor x = ops::from_vector(values(c.shape, 7), c.shape, dt);
      Tensor xc = to_cuda(x);
      std::string what = engine::str(engine::dtype_name(dt), " ", c.layout, " ", engine::shape_str(c.shape));
      testutil::expect_equal("argmax " + what, ops::argmax(x, c.dim), ops::argmax(xc, c.dim));
      testutil::expect_equal("amax " + what, ops::amax(x, c.dim, true), ops::amax(xc, c.dim, true));
      // A transposed view: the dim's stride is no longer 1.
      testutil::expect_equal("argmax transposed " + what, ops::argmax(ops::transpose(x, 0, -1), c.dim),
                             ops::argmax(ops::transpose(xc, 0, -1), c.dim));
    }
    // Gradients of amax (one-hot at the first maximum), on distinct random values.
    expect_cuda_matches_cpu(engine::str("amax gradient ", engine::dtype_name(dt)),
                            [](const std::vector<Tensor>& in) { return ops::amax(in[0], 1); },
                            {cpu_input({8, 300}, dt, -1, 1, true)});
  }
}

TEST(ReduceCuda, LedgerOfAGpuRunEqualsMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor x = ops::rand({2, 70000}).set_requires_grad(true);  // split: allocates the partial-sum workspace
    Tensor y = ops::mean(ops::mul(x, x), {1});
    Tensor m = ops::amax(x, 1);
    graph::backward(ops::sum(ops::add(y, m)));
    Tensor cols = ops::sum(ops::rand({20000, 40}), {0});
    Tensor idx = ops::argmax(ops::rand({7, 9}), 0);
  });
}

TEST(ReduceCuda, DISABLED_ColumnSumBandwidth) {
  // Bias gradients: the column sums of the models' linear outputs' gradients (bert_base 512 x 32: q, k and v as one,
  // the attention output, the feed-forward pair; transformer_big 8192 tokens; BERT-Large 512 x 8), as linear's
  // backward asks for them (ops::sum over the rows, its partial-sum workspace included).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{16384, 2304}, {16384, 768}, {16384, 3072},
                                                           {8192, 1024},  {8192, 4096}, {4096, 1024}};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const auto& [rows, cols] : shapes) {
      Tensor g = to_cuda(cpu_input({rows, cols}, dt, -1, 1));
      const double ms = testutil::median_ms_per_call([&] { ops::sum(g, {0}); }, 20);
      std::printf("column sum %s [%ld, %ld]: %.4f ms, %.0f GB/s of g read\n", engine::dtype_name(dt), long(rows),
                  long(cols), ms, double(g.nbytes()) / ms / 1e6);
    }
  }
}
