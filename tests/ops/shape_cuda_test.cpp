// shape_cuda_test.cpp: the shape family on the GPU against the cpu reference: concat (contiguous parts by
// 2-D copies, strided parts by the copy kernel, every dtype), index_select / gather / embedding (rows form
// with 16-byte and element words, general form, i32/i64 indices, every dtype) and their scatter-add
// gradients (repeated indices, padding_idx; bit-identical to the cpu in f32), masked_fill and where with
// broadcasting, out-of-range indices raising the cpu's error, and the ledger equal to meta's. EmbeddingCuda.*:
// the sorted scatter-add (workspace path) on BERT's vocabulary, long / hot / empty segments, padding, outer
// slices, i32/i64 ids, every float dtype, run twice; EmbeddingCudaPerf.DISABLED_Backward times it at BERT-base.
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

#include "ops/cuda/shape.h"  // the tile kernel (no workspace), timed against the sorted path

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::cpu_input;
using testutil::expect_cuda_matches_cpu;
using testutil::expect_cuda_throws;
using testutil::to_cuda;

using testutil::median_ms;

namespace {

const DType kFloats[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
const DType kAll[] = {DType::f32, DType::f64, DType::bf16, DType::f16,
                      DType::i32, DType::i64, DType::u8,   DType::boolean};

// Values of any dtype: floats in [-2, 2), integers in [0, 50) (bool: 0/1).
Tensor values(const Shape& shape, DType dtype, bool requires_grad = false) {
  if (engine::is_floating(dtype)) return cpu_input(shape, dtype, -2, 2, requires_grad);
  return ops::to(ops::randint(shape, dtype == DType::boolean ? 2 : 50, DType::i64), dtype);
}

// Indices in [0, n) with repeats, as i64 or i32.
Tensor indices(const Shape& shape, int64_t n, DType dtype) {
  return ops::to(ops::randint(shape, n, DType::i64), dtype);
}

// Runs fn on cuda copies of the inputs and expects the cpu's exact values.
void expect_exact(const std::string& what, const testutil::Fn& fn, const std::vector<Tensor>& inputs) {
  Tensor want = fn(inputs);
  std::vector<Tensor> on_gpu;
  for (const Tensor& x : inputs) on_gpu.push_back(to_cuda(x));
  engine::DeviceGuard guard(testutil::cuda_device());
  testutil::expect_equal(what, want, fn(on_gpu));
}

}  // namespace

// NHWC concatenation along channels (NASNet's cells), copied exactly in every word width: 16-byte words (8 + 16
// bf16 channels, 4 + 8 f32), then 8, 4 and 2 bytes (6 + 10 and 3 + 5 channels: the widest word that divides both
// rows, the output's pitch and the offsets).
TEST(ShapeCuda, ConcatAlongChannelsInEveryWordWidth) {
  for (DType dt : {DType::bf16, DType::f32}) {
    const int64_t wide = dt == DType::bf16 ? 8 : 4;
    for (auto [a, b] : {std::pair<int64_t, int64_t>{wide, 2 * wide}, {6, 10}, {3, 5}}) {
      auto f = [](const std::vector<Tensor>& in) { return ops::concat({in[0], in[1]}, 3); };
      expect_exact(engine::str("concat channels ", engine::dtype_name(dt), " ", a, " + ", b), f,
                   {values({2, 3, 7, a}, dt, false), values({2, 3, 7, b}, dt, false)});
    }
  }
}

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

TEST(ShapeCuda, IndexErrorsWaitForTheNextSynchronization) {
  // Indexing ops do not synchronize: three ops, a bad index in the second, then the first error at the sync; the
  // ring of records (1024) wraps by synchronizing, so more indexing ops than records still report theirs.
  Tensor x = to_cuda(cpu_input({4, 6}, DType::f32));
  Tensor good = to_cuda(ops::from_vector(std::vector<int64_t>{0, 3, 2}, {3}));
  Tensor bad = to_cuda(ops::from_vector(std::vector<int64_t>{0, 9, 2}, {3}));
  engine::DeviceGuard guard(testutil::cuda_device());
  ops::embedding(x, good);
  ops::embedding(x, bad);  // returns: nothing waited for the GPU
  ops::index_select(x, 1, good);
  try {
    testutil::cuda_device()->synchronize();
    ADD_FAILURE() << "the bad index was not reported";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("embedding: index 9 is out of range"), std::string::npos) << e.what();
  }
  for (int i = 0; i < 1500; i++) ops::embedding(x, good);
  ops::embedding(x, bad);
  EXPECT_THROW(testutil::cuda_device()->synchronize(), engine::Error);
  EXPECT_NO_THROW(testutil::cuda_device()->synchronize());
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
    auto mft = [fill](const std::vector<Tensor>& in) {
      return ops::masked_fill(ops::transpose(in[0], 2, 3), in[1], fill);
    };
    expect_exact(what + " strided", mft, {values({2, 3, 64, 64}, dt), mask});
    // The vector kernel with a mask along other dimensions (its last stride 0), and rows that are not whole vectors
    // (the element kernel).
    Tensor rows_mask = ops::to(ops::randint({2, 1, 64, 1}, 2, DType::i64), DType::boolean);
    expect_exact(what + " row mask", mf, {values({2, 3, 64, 64}, dt), rows_mask});
    Tensor short_mask = ops::to(ops::randint({2, 1, 1, 6}, 2, DType::i64), DType::boolean);
    expect_exact(what + " rows of 6", mf, {values({2, 3, 5, 6}, dt), short_mask});

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
    std::printf(
        "embedding %s [16384 ids, 768]: forward %.3f ms %.0f GB/s, backward (30522 rows) %.3f ms %.0f GB/s; "
        "masked_fill [32, 12, 512, 512] %.3f ms %.0f GB/s\n",
        engine::dtype_name(dt), fwd, 2 * row_bytes / fwd / 1e6, bwd, (row_bytes + double(w.nbytes())) / bwd / 1e6, mf,
        2 * double(scores.nbytes()) / mf / 1e6);
  }
}

// ---------------------------------------------------------------------------------------------------
// The sorted (segment) scatter-add that index_select_backward and embedding_backward take on cuda with
// their workspace: each case against the cpu, exact in f32 and f64 (same summation order), close in
// bf16 / f16, and the same bits on a second GPU run (deterministic).

namespace {

// ids of the given values, shape [n], as `dtype` on the cpu.
Tensor id_tensor(const std::vector<int64_t>& values, DType dtype) {
  return ops::to(ops::from_vector(values, {int64_t(values.size())}), dtype);
}

// count ids in [0, rows) of which every `every`-th one (when every > 0) is `hot`: a long segment spread
// over the whole index, among ordinary ones.
std::vector<int64_t> ids_with_hot(int64_t count, int64_t rows, int64_t hot, int64_t every) {
  std::vector<double> r = ops::randint({count}, rows, DType::i64).to_double();
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; i++) ids[size_t(i)] = every > 0 && i % every == 0 ? hot : int64_t(r[size_t(i)]);
  return ids;
}

// fn(g, ids) on the cpu and twice on cuda: the first GPU run equals the cpu exactly (f32, f64) or within
// the dtype's tolerance (bf16, f16), the second equals the first bit for bit.
void expect_sorted_scatter(const std::string& what, const testutil::Fn& fn, const Tensor& g, const Tensor& ids) {
  Tensor want = fn({g, ids});
  Tensor g_gpu = to_cuda(g), ids_gpu = to_cuda(ids);
  engine::DeviceGuard guard(testutil::cuda_device());
  Tensor got = fn({g_gpu, ids_gpu}), again = fn({g_gpu, ids_gpu});
  const std::string name = engine::str(what, " ", engine::dtype_name(g.dtype()), " g ", engine::shape_str(g.shape()));
  if (g.dtype() == DType::f32 || g.dtype() == DType::f64) testutil::expect_equal(name + " (exact)", want, got);
  else testutil::expect_close(name, want, got);
  testutil::expect_equal(name + " (second GPU run)", testutil::to_cpu(got), again);
}

}  // namespace

TEST(EmbeddingCuda, SortedScatterAddBertVocabulary) {
  // BERT's shape with fewer ids: most of the 30522 rows are empty segments, a few hold repeats.
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor ids = indices({8, 512}, 30522, DType::i64);
    expect_sorted_scatter("embedding_backward [4096 ids -> 30522 x 768] padding 0",
                          [](const std::vector<Tensor>& in) { return ops::embedding_backward(in[0], in[1], 30522, 0); },
                          cpu_input({8, 512, 768}, dt, -1, 1), ids);
  }
}

TEST(EmbeddingCuda, SortedScatterAddSegments) {
  auto emb = [](int64_t rows, int64_t padding) {
    return
        [rows, padding](const std::vector<Tensor>& in) { return ops::embedding_backward(in[0], in[1], rows, padding); };
  };
  for (DType dt : kFloats) {
    for (DType idt : {DType::i64, DType::i32}) {
      const std::string ix = engine::str(" ids ", engine::dtype_name(idt));
      // One row takes every id: a segment of more than 2048 positions (the hot-rows kernel).
      expect_sorted_scatter("all 5000 ids on one row" + ix, emb(10, -1), cpu_input({5000, 96}, dt, -1, 1),
                            id_tensor(std::vector<int64_t>(5000, 7), idt));
      // A hot row (every 3rd of 9000 ids) among short segments; the hot row is also the padding row once.
      expect_sorted_scatter("hot row 3 of 50" + ix, emb(50, -1), cpu_input({9000, 40}, dt, -1, 1),
                            id_tensor(ids_with_hot(9000, 50, 3, 3), idt));
      expect_sorted_scatter("hot row 3 of 50 is the padding row" + ix, emb(50, 3), cpu_input({9000, 40}, dt, -1, 1),
                            id_tensor(ids_with_hot(9000, 50, 3, 3), idt));
      // Padding skipped among repeats; K smaller than J (short segments of ~600, rank-sorted).
      expect_sorted_scatter("5 rows, 3000 ids, padding 2" + ix, emb(5, 2), cpu_input({3000, 64}, dt, -1, 1),
                            indices({3000}, 5, idt));
      // Mostly empty segments; odd widths take the element (not 16-byte) path.
      expect_sorted_scatter("1000 rows, 50 ids, width 33" + ix, emb(1000, 0), cpu_input({50, 33}, dt, -1, 1),
                            indices({50}, 1000, idt));
      // Rows wider than a block's vectors (several column blocks per row), short and long segments.
      expect_sorted_scatter("wide rows" + ix, emb(4, -1), cpu_input({3000, 2500}, dt, -1, 1), indices({3000}, 4, idt));
    }
  }
}

TEST(EmbeddingCuda, SortedScatterAddOuterDimensions) {
  // index_select_backward along a middle dimension: P > 1 outer slices share the sorted segments.
  struct Case {
    const char* what;
    Shape g_shape;
    int64_t size;
    int64_t hot_every;  // 0: uniform ids
  };
  const Case cases[] = {
      {"P 3, width 7 (element path)", {3, 700, 7}, 40, 0},
      {"P 4, width 64 (vectors)", {4, 900, 64}, 30, 0},
      {"P 2, one hot row of 2700 (hot-rows kernel)", {2, 5400, 16}, 9, 2},
      {"P 2, hot row, 1300 wide (41 column slices)", {2, 4400, 1300}, 5, 2},
  };
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (const Case& c : cases) {
      const int64_t J = c.g_shape[1];
      Tensor index = id_tensor(ids_with_hot(J, c.size, 1, c.hot_every), DType::i64);
      const int64_t size = c.size;
      expect_sorted_scatter(engine::str("index_select_backward dim 1, ", c.what),
                            [size](const std::vector<Tensor>& in) {
                              return ops::index_select_backward(in[0], 1, in[1], size);
                            },
                            cpu_input(c.g_shape, dt, -1, 1), index);
    }
  }
  // A non-contiguous g gets no workspace and takes the tile kernel: still the cpu's result.
  Tensor index = indices({300}, 20, DType::i64);
  expect_exact("index_select_backward, transposed g (tile kernel)",
               [](const std::vector<Tensor>& in) {
                 return ops::index_select_backward(ops::transpose(in[0], 0, 1), 0, in[1], 20);
               },
               {cpu_input({48, 300}, DType::f32, -1, 1), index});
  // An out-of-range index still raises the cpu's error.
  Tensor g = to_cuda(cpu_input({3, 6}, DType::f32));
  Tensor bad = to_cuda(ops::from_vector(std::vector<int64_t>{0, 9, 2}, {3}));
  expect_cuda_throws("index_select_backward", [&] { ops::index_select_backward(g, 0, bad, 4); },
                     "index 9 is out of range for a dimension of size 4");
}

TEST(EmbeddingCuda, SortedScatterAddLedgerMatchesMeta) {
  // The workspace is allocated by the op on every device: meta places it where the GPU does.
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor g = ops::rand({4, 64, 48}, -1, 1, DType::f32);
    Tensor ids = ops::randint({4, 64}, 300, DType::i64);
    Tensor gw = ops::embedding_backward(g, ids, 300, 0);                               // [300, 48]
    Tensor gx = ops::index_select_backward(g, 1, ops::randint({64}, 10, DType::i32), 10);  // [4, 10, 48]
    Tensor gt = ops::index_select_backward(ops::transpose(g, 0, 2), 1, ops::randint({64}, 10, DType::i64), 10);
  });
}

// Not run by default (--gtest_also_run_disabled_tests): embedding_backward at BERT-base's training shape
// (K 30522 rows, J 16384 ids, Q 768), the sorted path against the tile kernel it replaces; also with a hot
// id, and BERT's position (512 rows) and token-type (2 rows) tables.
TEST(EmbeddingCudaPerf, DISABLED_Backward) {
  const int64_t V = 30522, N = 16384, C = 768;
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor g = testutil::to_cuda(cpu_input({32, 512, C}, dt));
    Tensor ids = testutil::to_cuda(indices({32, 512}, V, DType::i64));
    Tensor hot = testutil::to_cuda(id_tensor(ids_with_hot(N, V, 1012, 4), DType::i64));  // a quarter on one row
    // BERT's masking: 77 of 512 positions masked, 80% of them to [MASK] (id 103): about an eighth on one row
    Tensor mask = testutil::to_cuda(id_tensor(ids_with_hot(N, V, 103, 8), DType::i64));
    const double bytes = double(g.nbytes()) + double(V * C) * double(engine::dtype_size(dt));
    const double sorted = median_ms([&] { ops::embedding_backward(g, ids, V, 0); });
    const double sorted_hot = median_ms([&] { ops::embedding_backward(g, ops::reshape(hot, {32, 512}), V, 0); });
    const double sorted_mask = median_ms([&] { ops::embedding_backward(g, ops::reshape(mask, {32, 512}), V, 0); });
    Tensor out = ops::zeros({V, C}, dt, testutil::cuda_device());
    Tensor g_rows = ops::reshape(g, {N, C}), flat = ops::reshape(ids, {N});
    const double tiles = median_ms([&] {
      ops::cuda::scatter_add("embedding_backward", g_rows, 0, ops::expand_index(flat, {N, C}, 0), 0, out);
    }, 5);
    // BERT's two other tables: positions (512 rows, 32 ids each) and token types (2 rows, ~8192 ids each).
    std::vector<int64_t> pos(static_cast<size_t>(N)), types(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; i++) {
      pos[size_t(i)] = i % 512;
      types[size_t(i)] = i % 512 >= 200 ? 1 : 0;
    }
    Tensor pos_ids = testutil::to_cuda(ops::from_vector(pos, {32, 512}));
    Tensor type_ids = testutil::to_cuda(ops::from_vector(types, {32, 512}));
    const double positions = median_ms([&] { ops::embedding_backward(g, pos_ids, 512); });
    const double token_types = median_ms([&] { ops::embedding_backward(g, type_ids, 2); });
    std::printf("embedding_backward %s [%lld ids, %lld] -> [%lld, %lld]: sorted %.3f ms (%.0f GB/s), with a quarter of "
                "the ids on one row %.3f ms, an eighth %.3f ms; tile kernel %.3f ms; positions [512, %lld] %.3f ms; "
                "token types [2, %lld] %.3f ms\n",
                engine::dtype_name(dt), (long long)N, (long long)C, (long long)V, (long long)C, sorted,
                bytes / sorted / 1e6, sorted_hot, sorted_mask, tiles, (long long)C, positions, (long long)C,
                token_types);
  }
}
