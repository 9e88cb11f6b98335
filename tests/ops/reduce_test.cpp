// reduce_test.cpp: sum, mean, amax, argmax and sum_to against loops, their gradients (first and second
// order) against finite differences, and their errors.
#include <gtest/gtest.h>

#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/view.h"
#include "tests/util/gradcheck_util.h"

using engine::DType;
using engine::Tensor;
using testutil::rand_input;

TEST(Reduce, SumAndMeanOverDimsMatchLoops) {
  Tensor x = rand_input({2, 3, 4}, -1, 1, false);
  std::vector<double> v = x.to_double();
  auto at = [&](int i, int j, int k) { return v[size_t((i * 3 + j) * 4 + k)]; };
  Tensor s = ops::sum(x, {0, 2});  // [3]
  ASSERT_EQ(s.shape(), (engine::Shape{3}));
  Tensor m = ops::mean(x, {1}, true);  // [2, 1, 4]
  ASSERT_EQ(m.shape(), (engine::Shape{2, 1, 4}));
  std::vector<double> sv = s.to_double(), mv = m.to_double();
  for (int j = 0; j < 3; j++) {
    double e = 0;
    for (int i = 0; i < 2; i++)
      for (int k = 0; k < 4; k++) e += at(i, j, k);
    EXPECT_NEAR(sv[j], e, 1e-14);
  }
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 4; k++)
      EXPECT_NEAR(mv[size_t(i * 4 + k)], (at(i, 0, k) + at(i, 1, k) + at(i, 2, k)) / 3, 1e-14);
  EXPECT_NEAR(ops::sum(x).item(), [&] { double t = 0; for (double e : v) t += e; return t; }(), 1e-13);
}

TEST(Reduce, AmaxAndArgmax) {
  Tensor x = ops::from_vector(std::vector<double>{1, 5, 2, 7, 0, 7}, {2, 3}, DType::f64);
  EXPECT_EQ(ops::amax(x, 1).to_double(), (std::vector<double>{5, 7}));
  EXPECT_EQ(ops::argmax(x, 1).to_double(), (std::vector<double>{1, 0}));  // first maximum on ties
  EXPECT_EQ(ops::amax(x, 0, true).shape(), (engine::Shape{1, 3}));
  EXPECT_EQ(ops::argmax(x, -1).dtype(), DType::i64);
}

TEST(Reduce, SumToUndoesBroadcasting) {
  Tensor x = ops::ones({2, 3, 4}, DType::f64);
  EXPECT_EQ(ops::sum_to(x, {3, 1}).to_double(), (std::vector<double>{8, 8, 8}));
  EXPECT_EQ(ops::sum_to(x, {4}).to_double(), (std::vector<double>{6, 6, 6, 6}));
  EXPECT_THROW(ops::sum_to(x, {5}), engine::Error);
}

TEST(Reduce, Gradients) {
  Tensor x = rand_input({3, 4, 2});
  std::vector<testutil::Fn> fns = {
      [](const std::vector<Tensor>& in) { return ops::sum(in[0], {1}); },
      [](const std::vector<Tensor>& in) { return ops::mean(in[0], {0, 2}, true); },
      [](const std::vector<Tensor>& in) { return ops::mul(ops::amax(in[0], 1), ops::amax(in[0], 1)); },
      [](const std::vector<Tensor>& in) { return ops::mul(ops::sum(in[0]), ops::sum(in[0])); },
  };
  for (size_t i = 0; i < fns.size(); i++) {
    SCOPED_TRACE(i);
    testutil::expect_gradcheck(fns[i], {x});
    testutil::expect_double_backward(fns[i], {x});
  }
}

TEST(Reduce, ErrorsNameTheOpAndDimension) {
  Tensor x = ops::zeros({2, 3});
  try {
    ops::sum(x, {2});
    FAIL();
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum: dimension 2 is out of range"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::mean(x, {0, 0}), engine::Error);
  EXPECT_THROW(ops::amax(ops::zeros({2}, DType::i64), 0), engine::Error);
}
