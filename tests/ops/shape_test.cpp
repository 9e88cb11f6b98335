// shape_test.cpp: concat / split / chunk, index_select, gather, masked_fill and where: values against loops
// written here, gradients and second derivatives against finite differences (squaring the output so the
// scatter-add backward ops' own rules run), index errors, and meta allocations equal to cpu.
#include <gtest/gtest.h>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::rand_input;

namespace {

Tensor ids(const std::vector<int64_t>& v, const Shape& shape, DType dtype = DType::i64) {
  return ops::from_vector(v, shape, dtype);
}

// f(x)^2: the first gradient then depends on x through g, so double backward runs the backward op's rule.
Tensor squared(const Tensor& y) { return ops::mul(y, y); }

void expect_error_mentions(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an engine::Error";
  } catch (const engine::Error& e) {
    std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

}  // namespace

TEST(Shape, ConcatValuesGradAndDoubleBackward) {
  Tensor a = ops::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = ops::from_vector(std::vector<double>{7, 8}, {2, 1});
  EXPECT_EQ(ops::concat({a, b}, 1).to_double(), (std::vector<double>{1, 2, 3, 7, 4, 5, 6, 8}));
  EXPECT_EQ(ops::concat({a, a}, 0).to_double(), (std::vector<double>{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(ops::concat({a, b}, -1).shape(), (Shape{2, 4}));

  Tensor x = rand_input({2, 3}), y = rand_input({2, 2}), z = rand_input({2, 1});
  testutil::Fn f = [](const std::vector<Tensor>& in) { return squared(ops::concat({in[0], in[1], in[2]}, 1)); };
  testutil::expect_gradcheck(f, {x, y, z});
  testutil::expect_double_backward(f, {x, y, z});
}

TEST(Shape, ConcatErrors) {
  Tensor a = ops::zeros({2, 3}), b = ops::zeros({3, 3});
  expect_error_mentions([&] { ops::concat({a, b}, 1); }, {"concat", "[3, 3]", "[2, 3]", "dimension 1"});
  expect_error_mentions([&] { ops::concat({a, ops::zeros({2, 3}, DType::f64)}, 0); }, {"concat", "f32", "f64"});
  EXPECT_THROW(ops::concat({}, 0), engine::Error);
}

TEST(Shape, SplitAndChunk) {
  Tensor x = ops::from_vector(std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {5, 2});
  std::vector<Tensor> parts = ops::split(x, {2, 0, 3}, 0);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].to_double(), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(parts[1].numel(), 0);
  EXPECT_EQ(parts[2].to_double(), (std::vector<double>{4, 5, 6, 7, 8, 9}));
  std::vector<Tensor> chunks = ops::chunk(x, 3, 0);  // 5 rows in 3: sizes 2, 2, 1 (PyTorch)
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[2].to_double(), (std::vector<double>{8, 9}));
  EXPECT_EQ(ops::chunk(x, 2, 1)[1].to_double(), (std::vector<double>{1, 3, 5, 7, 9}));
  EXPECT_EQ(ops::chunk(x, 4, 1).size(), 2u);  // fewer chunks than asked when the dimension is small
  expect_error_mentions([&] { ops::split(x, {2, 2}, 0); }, {"split", "sum to 4", "[5, 2]"});

  Tensor w = rand_input({4, 3});
  testutil::Fn f = [](const std::vector<Tensor>& in) {
    std::vector<Tensor> p = ops::split(in[0], {1, 2}, 1);
    return ops::concat({squared(p[1]), ops::mul(p[0], 3.0)}, 1);
  };
  testutil::expect_gradcheck(f, {w});
  testutil::expect_double_backward(f, {w});
  // Parts without a gradient count as zeros.
  testutil::Fn last = [](const std::vector<Tensor>& in) { return squared(ops::chunk(in[0], 3, 0)[2]); };
  testutil::expect_gradcheck(last, {rand_input({6, 3})});
  testutil::expect_double_backward(last, {rand_input({6, 3})});
}

TEST(Shape, SplitBackwardMakesOneGradientOfXsSize) {
  // One node for all the parts: x's gradient is one concat of theirs, not a zero-padded copy of x per part added up.
  auto meta = engine::Device::create(engine::DeviceType::meta, size_t(1) << 30);
  engine::DeviceGuard guard(meta);
  Tensor x = ops::zeros({64, 48}).set_requires_grad(true);
  std::vector<Tensor> parts = ops::chunk(x, 3, 1);
  Tensor loss = ops::add(ops::add(ops::sum(parts[0]), ops::sum(parts[1])), ops::sum(parts[2]));
  const int64_t from = meta->ledger().sequence();
  Tensor gx = graph::grad({loss}, {x})[0];
  int x_sized = 0;
  for (const engine::BlockInfo& b : meta->ledger().history())
    if (b.alloc_seq > from && b.requested == x.nbytes()) x_sized++;
  EXPECT_EQ(x_sized, 1);
  EXPECT_EQ(gx.shape(), x.shape());
}

TEST(Shape, IndexSelectMatchesLoopAndSumsRepeatedRows) {
  Tensor x = rand_input({3, 4, 2}, -1, 1, false);
  std::vector<double> xv = x.to_double();
  for (DType it : {DType::i64, DType::i32}) {
    Tensor index = ids({3, 0, 3, 1, 3}, {5}, it);  // repeats: the gradient must sum them
    Tensor y = ops::index_select(x, 1, index);
    ASSERT_EQ(y.shape(), (Shape{3, 5, 2}));
    std::vector<double> yv = y.to_double();
    const int64_t pick[5] = {3, 0, 3, 1, 3};
    for (int i = 0; i < 3; i++)
      for (int k = 0; k < 5; k++)
        for (int c = 0; c < 2; c++) EXPECT_EQ(yv[(i * 5 + k) * 2 + c], xv[(i * 4 + pick[k]) * 2 + c]);
  }
  Tensor index = ids({3, 0, 3, 1, 3}, {5});
  Tensor w = rand_input({3, 4, 2});
  testutil::Fn f = [&](const std::vector<Tensor>& in) { return squared(ops::index_select(in[0], 1, index)); };
  testutil::expect_gradcheck(f, {w});
  testutil::expect_double_backward(f, {w});
  // The scatter-add op on its own: linear in g, its rule is index_select.
  Tensor g = rand_input({3, 5, 2});
  testutil::Fn fb = [&](const std::vector<Tensor>& in) {
    return squared(ops::index_select_backward(in[0], 1, index, 4));
  };
  testutil::expect_gradcheck(fb, {g});
  testutil::expect_double_backward(fb, {g});
}

TEST(Shape, GatherMatchesLoop) {
  Tensor x = rand_input({3, 4}, -1, 1, false);
  std::vector<double> xv = x.to_double();
  Tensor i1 = ids({0, 3, 3, 2, 1, 1}, {2, 3});  // dim 1: out[i][j] = x[i][i1[i][j]]
  std::vector<double> y1 = ops::gather(x, 1, i1).to_double();
  const int64_t p1[6] = {0, 3, 3, 2, 1, 1};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) EXPECT_EQ(y1[i * 3 + j], xv[i * 4 + p1[i * 3 + j]]);
  Tensor i0 = ids({2, 0, 1, 1, 2, 2}, {2, 3}, DType::i32);  // dim 0: out[i][j] = x[i0[i][j]][j]
  std::vector<double> y0 = ops::gather(x, 0, i0).to_double();
  const int64_t p0[6] = {2, 0, 1, 1, 2, 2};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) EXPECT_EQ(y0[i * 3 + j], xv[p0[i * 3 + j] * 4 + j]);
  expect_error_mentions([&] { ops::gather(x, 1, ids({0, 1}, {2})); }, {"gather", "[2]", "[3, 4]"});
}

TEST(Shape, GatherGradAndDoubleBackward) {
  Tensor index = ids({0, 3, 3, 2, 1, 1}, {2, 3});
  Tensor x = rand_input({3, 4});
  testutil::Fn f = [&](const std::vector<Tensor>& in) { return squared(ops::gather(in[0], 1, index)); };
  testutil::expect_gradcheck(f, {x});
  testutil::expect_double_backward(f, {x});
  Tensor g = rand_input({2, 3});
  testutil::Fn fb = [&](const std::vector<Tensor>& in) {
    return squared(ops::gather_backward(in[0], 1, index, {3, 4}));
  };
  testutil::expect_gradcheck(fb, {g});
  testutil::expect_double_backward(fb, {g});
}

TEST(Shape, IndexOutOfRangeNamesOpIndexAndSize) {
  Tensor x = ops::zeros({2, 4});
  expect_error_mentions([&] { ops::index_select(x, 1, ids({1, 7}, {2})); }, {"index_select", "7", "4"});
  expect_error_mentions([&] { ops::index_select(x, 0, ids({-1}, {1}, DType::i32)); }, {"index_select", "-1", "2"});
  expect_error_mentions([&] { ops::gather(x, 0, ids({0, 5}, {1, 2})); }, {"gather", "5", "2"});
  expect_error_mentions([&] { ops::gather_backward(ops::zeros({1, 2}), 1, ids({0, 9}, {1, 2}), {2, 4}); },
                        {"gather_backward", "9", "4"});
  expect_error_mentions([&] { ops::index_select(x, 0, ops::zeros({2})); }, {"index_select", "index", "i64", "f32"});
}

TEST(Shape, MaskedFillValuesAndGrad) {
  Tensor x = ops::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor row_mask = ops::compare(ops::CompareOp::gt, ops::from_vector(std::vector<double>{0, 1}, {2, 1}), 0.5);
  EXPECT_EQ(ops::masked_fill(x, row_mask, -9).to_double(), (std::vector<double>{1, 2, 3, -9, -9, -9}));
  Tensor col_mask = ops::compare(ops::CompareOp::gt, ops::from_vector(std::vector<double>{1, 0, 1}, {3}), 0.5);
  EXPECT_EQ(ops::masked_fill(x, col_mask, 0).to_double(), (std::vector<double>{0, 2, 0, 0, 5, 0}));
  expect_error_mentions([&] { ops::masked_fill(x, ops::compare(ops::CompareOp::gt, ops::zeros({3, 3}), 0.0), 0); },
                        {"masked_fill", "[3, 3]", "[2, 3]"});
  expect_error_mentions([&] { ops::masked_fill(x, x, 0); }, {"masked_fill", "mask", "bool"});

  Tensor w = rand_input({2, 3});
  testutil::Fn f = [&](const std::vector<Tensor>& in) { return squared(ops::masked_fill(in[0], col_mask, 0.5)); };
  testutil::expect_gradcheck(f, {w});
  testutil::expect_double_backward(f, {w});
}

TEST(Shape, WhereBroadcastsValuesAndGrad) {
  Tensor cond = ops::compare(ops::CompareOp::gt, ops::from_vector(std::vector<double>{1, 0, 1}, {3, 1}), 0.5);
  Tensor a = rand_input({1, 4}), b = rand_input({3, 4});
  std::vector<double> y = ops::where(cond, a, b).to_double(), av = a.to_double(), bv = b.to_double();
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) EXPECT_EQ(y[i * 4 + j], i != 1 ? av[j] : bv[i * 4 + j]);
  testutil::Fn f = [&](const std::vector<Tensor>& in) { return squared(ops::where(cond, in[0], in[1])); };
  testutil::expect_gradcheck(f, {a, b});
  testutil::expect_double_backward(f, {a, b});
  expect_error_mentions([&] { ops::where(cond, a, ops::zeros({2, 4}, DType::f64)); }, {"where"});
}

TEST(Shape, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor x = ops::rand({4, 6}, -1, 1).set_requires_grad(true);
    Tensor y = ops::rand({4, 2}, -1, 1).set_requires_grad(true);
    Tensor index = ops::from_vector(std::vector<int64_t>{5, 0, 2}, {3});
    Tensor gidx = ops::from_vector(std::vector<int64_t>{1, 0, 3, 3}, {4, 1});
    Tensor mask = ops::compare(ops::CompareOp::gt, ops::rand({1, 6}), 0.5);
    Tensor c = ops::concat({x, y}, 1);                                      // [4, 8]
    Tensor s = ops::index_select(ops::split(c, {6, 2}, 1)[0], 1, index);    // [4, 3]
    Tensor t = ops::gather(x, 1, gidx);                                      // [4, 1]
    Tensor m = ops::where(mask, ops::masked_fill(x, mask, 2.0), x);          // [4, 6]
    Tensor loss = ops::add(ops::add(ops::sum(ops::mul(s, s)), ops::sum(ops::mul(t, t))), ops::sum(ops::mul(m, m)));
    graph::backward(loss);
  });
}
