// view_test.cpp: reshape, permute, transpose, slice, select, squeeze/unsqueeze share storage (no
// allocation), index the right elements, and have correct first and second derivatives.
#include <gtest/gtest.h>

#include "engine/device.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/view.h"
#include "tests/util/gradcheck_util.h"

using engine::Tensor;
using testutil::rand_input;

TEST(View, ViewsShareStorageAndIndexCorrectly) {
  Tensor x = ops::arange(24, engine::DType::f64);
  size_t live = x.device().ledger().live_bytes();
  Tensor r = ops::reshape(x, {2, 3, 4});
  Tensor p = ops::permute(r, {2, 0, 1});       // [4, 2, 3]: p[k][i][j] = r[i][j][k]
  Tensor s = ops::slice(p, 2, 1, 3);           // [4, 2, 2]
  Tensor e = ops::select(s, 0, 3);             // [2, 2]: r[i][1 + j][3]
  EXPECT_EQ(x.device().ledger().live_bytes(), live) << "views allocate nothing";
  EXPECT_TRUE(e.same_storage(x));
  EXPECT_EQ(e.to_double(), (std::vector<double>{7, 11, 19, 23}));
  EXPECT_EQ(ops::slice(x, 0, 1, 10, 4).to_double(), (std::vector<double>{1, 5, 9}));
  EXPECT_EQ(ops::unsqueeze(r, 1).shape(), (engine::Shape{2, 1, 3, 4}));
  EXPECT_EQ(ops::squeeze(ops::unsqueeze(r, -1), -1).shape(), r.shape());
  EXPECT_EQ(ops::flatten(r, 1).shape(), (engine::Shape{2, 12}));
  EXPECT_EQ(ops::reshape(r, {-1, 6}).shape(), (engine::Shape{4, 6}));
  // reshape of a non-contiguous tensor copies
  Tensor t = ops::reshape(ops::transpose(r, 1, 2), {2, 12});
  EXPECT_FALSE(t.same_storage(x));
  EXPECT_EQ(t.to_double()[1], 4.0);
}

TEST(View, ErrorsSayWhatIsWrong) {
  Tensor x = ops::zeros({2, 3});
  EXPECT_THROW(ops::reshape(x, {4, 2}), engine::Error);
  EXPECT_THROW(ops::permute(x, {0, 0}), engine::Error);
  EXPECT_THROW(ops::slice(x, 1, 2, 1), engine::Error);
  EXPECT_THROW(ops::squeeze(x, 0), engine::Error);
  EXPECT_THROW(ops::select(x, 0, 2), engine::Error);
}

TEST(View, Gradients) {
  Tensor x = rand_input({3, 4, 5});
  std::vector<testutil::Fn> fns = {
      [](const std::vector<Tensor>& in) { return ops::reshape(in[0], {12, 5}); },
      [](const std::vector<Tensor>& in) { return ops::permute(in[0], {2, 0, 1}); },
      [](const std::vector<Tensor>& in) { return ops::slice(ops::transpose(in[0], 0, 2), 1, 1, 4, 2); },
      [](const std::vector<Tensor>& in) { return ops::select(in[0], 1, -1); },
      // squared so that the backward ops (slice_backward) are differentiated too
      [](const std::vector<Tensor>& in) { Tensor s = ops::slice(in[0], 2, 1, 5, 3); return ops::mul(s, s); },
  };
  for (size_t i = 0; i < fns.size(); i++) {
    SCOPED_TRACE(i);
    testutil::expect_gradcheck(fns[i], {x});
    testutil::expect_double_backward(fns[i], {x});
  }
}
