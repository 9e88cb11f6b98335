// shape_cuda_test.cpp: the shape family on the GPU against the cpu reference: concat (contiguous parts by
// 2-D copies, strided parts by the copy kernel, every dtype), index_select / gather / embedding (rows form
// with 16-byte and element words, general form, i32/i64 indices, every dtype) and their scatter-add
// gradients (repeated indices, padding_idx; bit-identical to the cpu in f32), masked_fill and where with
// broadcasting, out-of-range indices raising the cpu's error, and the ledger equal to meta's.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/view.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::cpu_input;
using testutil::expect_cuda_matches_cpu;
using testutil::to_cuda;

using testutil::median_ms;

namespace {

const DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
const DType kAll[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8, DType::boolean};

// Values of any dtype: floats in [-2, 2), integers in [0, 50) (bool: 0/1).
Tensor values(const Shape& shape, DType dtype, bool requires_grad = false) {
  if (engine::is_floating(dtype)) return cpu_input(shape, dtype, -2, 2, requires_grad);
  return ops::to(ops::randint(shape, dtype == DType::boolean ? 2 : 50, DType::i64), dtype);
}

// Indices in [0, n) with repeats, as i64 or i32.
Tensor indices(const Shape& shape, int64_t n, DType dtype) { return ops::to(ops::randint(shape, n, DType::i64), dtype); }

// Runs fn on cuda copies of the inputs and expects the cpu's exact values.
void expect_exact(const std::string& what, const testutil::Fn& fn, const std::vector<Tensor>& inputs) {
  Tensor want = fn(inputs);
  std::vector<Tensor> on_gpu;
  for (const Tensor& x : inputs) on_gpu.push_back(to_cuda(x));
  engine::DeviceGuard guard(testutil::cuda_device());
  testutil::expect_equal(what, want, fn(on_gpu));
}

// Expects fn to throw on cuda with a message containing `text`.
void expect_cuda_throws(const std::string& what, const std::function<void()>& fn, const std::string& text) {
  engine::DeviceGuard guard(testutil::cuda_device());
  try {
    fn();
    ADD_FAILURE() << what << ": did not throw on cuda";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << what << ": " << e.what();
  }
}


}  // namespace

TEST(ShapeCuda, ConcatEveryDtypeAndLayout) {
  for (DType dt : kAll) {
    for (int64_t dim : {0, 1, 2}) {
      std::string what = engine::str("concat ", engine::dtype_name(dt), " dim ", dim);
      // Three parts: contiguous, a transposed view (copy kernel), and an empty one.
      Shape s0 = {4, 6, 10}, s1 = {4, 6, 10}, s2 = {4, 6, 10};
      s0[size_t(dim)] = 3;
      s1[size_t(dim)] = 5;
      s2[size_t(dim)] = 0;
      Shape s1t = s1;
      std::swap(s1t[0], s1t[2]);
      auto f = [dim](const std::vector<Tensor>& in) {
        return ops::concat({in[0], ops::transpose(in[1], 0, 2), in[2]}, dim);
      };
      const bool grad = engine::is_floating(dt);
      std::vector<Tensor> in = {values(s0, dt, grad), values(s1t, dt, grad), values(s2, dt, grad)};
      if (grad) expect_cuda_matches_cpu(what, f, in);
      else expect_exact(what, f, in);
    }
  }
}

TEST(ShapeCuda, IndexSelectAndItsScatterAddBackward) {
  struct Case {
    const char* layout;
    Shape shape;
    int64_t dim, count;
  };
  const Case cases[] = {
      {"rows, dim 0 (16-byte words)", {50, 64}, 0, 200},
      {"rows, middle dim", {3, 40, 7}, 1, 90},
      {"rows, last dim (element words)", {6, 33}, 1, 70},
      {"rows, wide rows (column chunks)", {3, 20000}, 0, 9},
  };
  for (DType dt : kFloats) {
    for (const Case& c : cases) {
      for (DType idt : {DType::i64, DType::i32}) {
        std::string what = engine::str("index_select ", engine::dtype_name(dt), " ", c.layout, " index ",
                                       engine::dtype_name(idt));
        Tensor index = indices({c.count}, c.shape[size_t(c.dim)], idt);
        auto f = [&c](const std::vector<Tensor>& in) { return ops::index_select(in[0], c.dim, in[1]); };
        expect_cuda_matches_cpu(what, f, {values(c.shape, dt, true), index});
      }
    }
  }
  // Every dtype moves (forward only), and a strided x takes the general gather.
  for (DType dt : kAll) {
    Tensor index = indices({30}, 12, DType::i64);
    expect_exact(engine::str("index_select ", engine::dtype_name(dt)),
                 [](const std::vector<Tensor>& in) { return ops::index_select(in[0], 1, in[1]); },
                 {values({5, 12, 3}, dt), index});
    expect_exact(engine::str("index_select strided ", engine::dtype_name(dt)),
                 [](const std::vector<Tensor>& in) { return ops::index_select(ops::transpose(in[0], 0, 2), 1, in[1]); },
                 {values({3, 12, 5}, dt), index});
  }
  // The scatter-add sums repeated indices in the cpu's order: f32 gradients are bit-identical.
  Tensor index = indices({4000}, 37, DType::i64);
  expect_exact("index_select_backward f32, many repeats (exact)",
               [](const std::vector<Tensor>& in) { return ops::index_select_backward(in[0], 0, in[1], 37); },
               {cpu_input({4000, 96}, DType::f32, -1, 1), index});
}

TEST(ShapeCuda, GatherAndItsScatterAddBackward) {
  struct Case {
    Shape x_shape, index_shape;
    int64_t dim;
  };
  const Case cases[] = {
      {{5, 7}, {5, 4}, 1},
      {{6, 9, 4}, {3, 12, 2}, 1},  // index smaller off dim: the rest of the gradient is zero
      {{8, 3}, {20, 3}, 0},
      {{64, 10}, {64, 1}, 1},      // one class per row (a log-likelihood pick)
  };
  for (DType dt : kFloats) {
    for (const Case& c : cases) {
      std::string what = engine::str("gather ", engine::dtype_name(dt), " x ", engine::shape_str(c.x_shape), " index ",
                                     engine::shape_str(c.index_shape), " dim ", c.dim);
      Tensor index = indices(c.index_shape, c.x_shape[size_t(c.dim)], DType::i64);
      auto f = [&c](const std::vector<Tensor>& in) { return ops::gather(in[0], c.dim, in[1]); };
      expect_cuda_matches_cpu(what, f, {values(c.x_shape, dt, true), index});
    }
  }
  Tensor index = indices({40, 3}, 5, DType::i32);
  expect_exact("gather_backward f32 (exact)",
               [](const std::vector<Tensor>& in) { return ops::gather_backward(in[0], 0, in[1], {5, 3}); },
               {cpu_input({40, 3}, DType::f32, -1, 1), index});
}

TEST(ShapeCuda, EmbeddingAndItsBackward) {
  for (DType dt : kFloats) {
    for (int64_t padding : {-1, 3}) {
      for (DType idt : {DType::i64, DType::i32}) {
        std::string what = engine::str("embedding ", engine::dtype_name(dt), " padding_idx ", padding, " ids ",
                                       engine::dtype_name(idt));
        Tensor ids = indices({8, 50}, 40, idt);  // 400 ids over 40 rows: many repeats, the padding row too
        auto f = [padding](const std::vector<Tensor>& in) { return ops::embedding(in[0], in[1], padding); };
        expect_cuda_matches_cpu(what, f, {values({40, 96}, dt, true), ids});
      }
    }
  }
  // BERT-like sizes, exact in f32.
  Tensor ids = indices({16, 128}, 30522, DType::i64);
  expect_exact("embedding_backward [2048 ids, 30522 x 128] f32 (exact)",
               [](const std::vector<Tensor>& in) { return ops::embedding_backward(in[0], in[1], 30522, 0); },
               {cpu_input({16, 128, 128}, DType::f32, -1, 1), ids});
}

TEST(ShapeCuda, OutOfRangeIndicesRaiseTheCpuError) {
  Tensor x = to_cuda(cpu_input({4, 6}, DType::f32));
  Tensor bad = to_cuda(ops::from_vector(std::vector<int64_t>{0, 9, 2}, {3}));
  Tensor bad_gather = to_cuda(ops::from_vector(std::vector<int64_t>{0, 1, -2, 3}, {4, 1}));
  Tensor g = to_cuda(cpu_input({3, 6}, DType::f32));
  const std::string text = "is out of range for a dimension of size";
  expect_cuda_throws("index_select", [&] { ops::index_select(x, 1, bad); }, "index 9 " + text + " 6");
  expect_cuda_throws("embedding", [&] { ops::embedding(x, bad); }, "index 9 " + text + " 4");
  expect_cuda_throws("gather", [&] { ops::gather(x, 1, bad_gather); }, "index -2 " + text + " 6");
  expect_cuda_throws("embedding_backward", [&] { ops::embedding_backward(g, bad, 4); }, "index 9 " + text + " 4");
  expect_cuda_throws("gather_backward", [&] { ops::gather_backward(ops::slice(x, 1, 0, 1), 1, bad_gather, {4, 6}); },
                     "index -2 " + text + " 6");
}

TEST(ShapeCuda, MaskedFillAndWhere) {
  const double kInf = std::numeric_limits<double>::infinity();
  for (DType dt : kAll) {
    Tensor mask = ops::to(ops::randint({2, 1, 1, 64}, 2, DType::i64), DType::boolean);  // a key padding mask
    const bool grad = engine::is_floating(dt);
    const double fill = grad ? -kInf : 1;
    auto mf = [fill](const std::vector<Tensor>& in) { return ops::masked_fill(in[0], in[1], fill); };
    std::string what = engine::str("masked_fill ", engine::dtype_name(dt));
    std::vector<Tensor> in = {values({2, 3, 64, 64}, dt, grad), mask};
    if (grad) expect_cuda_matches_cpu(what, mf, in);
    else expect_exact(what, mf, in);
    // Strided x.
    auto mft = [fill](const std::vector<Tensor>& in) { return ops::masked_fill(ops::transpose(in[0], 2, 3), in[1], fill); };
    expect_exact(what + " strided", mft, {values({2, 3, 64, 64}, dt), mask});

    Tensor cond = ops::to(ops::randint({5, 1, 8}, 2, DType::i64), DType::boolean);
    auto wf = [](const std::vector<Tensor>& in) { return ops::where(in[0], in[1], in[2]); };
    std::vector<Tensor> win = {cond, values({5, 4, 8}, dt, grad), values({4, 1}, dt, grad)};
    what = engine::str("where ", engine::dtype_name(dt));
    if (grad) expect_cuda_matches_cpu(what, wf, win);
    else expect_exact(what, wf, win);
  }
}

TEST(ShapeCuda, LedgerMatchesMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor w = ops::rand({50, 32}, -1, 1, DType::f32).set_requires_grad(true);
    Tensor ids = ops::randint({4, 9}, 50, DType::i64);
    Tensor e = ops::embedding(w, ids, 0);  // [4, 9, 32]
    Tensor m = ops::compare(ops::CompareOp::gt, ops::rand({4, 9, 1}, 0, 1, DType::f32), 0.5);
    Tensor y = ops::concat({ops::masked_fill(e, m, 0.0), ops::index_select(e, 1, ops::randint({5}, 9, DType::i64))}, 1);
    Tensor c = ops::compare(ops::CompareOp::gt, ops::rand({4, 14, 1}, 0, 1, DType::f32), 0.5);
    graph::backward(ops::sum(ops::where(c, y, ops::mul(y, 2.0))));
  });
}

// Not run by default (--gtest_also_run_disabled_tests): embedding at BERT sizes, masked_fill of scores.
TEST(ShapeCuda, DISABLED_Bandwidth) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor w = testutil::to_cuda(cpu_input({30522, 768}, dt));
    Tensor ids = testutil::to_cuda(indices({32, 512}, 30522, DType::i64));
    Tensor g = testutil::to_cuda(cpu_input({32, 512, 768}, dt));
    const double row_bytes = double(g.nbytes());
    double fwd = median_ms([&] { ops::embedding(w, ids); });
    double bwd = median_ms([&] { ops::embedding_backward(g, ids, 30522); });
    Tensor scores = testutil::to_cuda(cpu_input({32, 12, 512, 512}, dt));
    Tensor mask = testutil::to_cuda(ops::to(ops::randint({32, 1, 1, 512}, 2, DType::i64), DType::boolean));
    double mf = median_ms([&] { ops::masked_fill(scores, mask, -1e4); });
    std::printf("embedding %s [16384 ids, 768]: forward %.3f ms %.0f GB/s, backward (30522 rows) %.3f ms %.0f GB/s; "
                "masked_fill [32, 12, 512, 512] %.3f ms %.0f GB/s\n",
                engine::dtype_name(dt), fwd, 2 * row_bytes / fwd / 1e6, bwd, (row_bytes + double(w.nbytes())) / bwd / 1e6,
                mf, 2 * double(scores.nbytes()) / mf / 1e6);
  }
}
