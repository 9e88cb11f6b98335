// embedding_test.cpp: rows picked by ids, the scatter-add gradient against a loop written here (repeated ids
// sum, the padding row gets nothing), finite-difference first and second derivatives, errors, what is saved,
// meta allocations equal to cpu, and the GPU workspace every device allocates.
#include <gtest/gtest.h>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/view.h"
#include "tests/util/gradcheck_util.h"
#include "tests/util/meta_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::rand_input;

namespace {
const std::vector<int64_t> kIds = {4, 1, 0, 1, 4, 4};  // [2, 3], with repeats and the padding id 0
Tensor squared(const Tensor& y) { return ops::mul(y, y); }
}  // namespace

TEST(Embedding, PicksRowsForAnyIdShape) {
  Tensor w = rand_input({5, 3}, -1, 1, false);
  std::vector<double> wv = w.to_double();
  for (DType it : {DType::i64, DType::i32}) {
    Tensor ids = ops::from_vector(kIds, {2, 3}, it);
    Tensor y = ops::embedding(w, ids);
    ASSERT_EQ(y.shape(), (Shape{2, 3, 3}));
    std::vector<double> yv = y.to_double();
    for (size_t n = 0; n < kIds.size(); n++)
      for (int c = 0; c < 3; c++) EXPECT_EQ(yv[n * 3 + c], wv[kIds[n] * 3 + c]);
  }
  // The padding row is still looked up (PyTorch): only its gradient is withheld.
  Tensor ids = ops::from_vector(kIds, {6});
  EXPECT_EQ(ops::embedding(w, ids, 0).to_double(), ops::embedding(w, ids).to_double());
}

TEST(Embedding, BackwardSumsRepeatsAndSkipsPadding) {
  Tensor ids = ops::from_vector(kIds, {2, 3});
  Tensor g = rand_input({2, 3, 3}, -1, 1, false);
  std::vector<double> gv = g.to_double();
  for (int64_t pad : {-1, 0, 4}) {
    std::vector<double> expected(5 * 3, 0.0);
    for (size_t n = 0; n < kIds.size(); n++)
      if (kIds[n] != pad)
        for (int c = 0; c < 3; c++) expected[kIds[n] * 3 + c] += gv[n * 3 + c];
    Tensor gw = ops::embedding_backward(g, ids, 5, pad);
    ASSERT_EQ(gw.shape(), (Shape{5, 3}));
    std::vector<double> got = gw.to_double();
    for (size_t i = 0; i < expected.size(); i++) EXPECT_NEAR(got[i], expected[i], 1e-15) << "pad " << pad << " i " << i;
  }
  // Through autograd: the weight's gradient is the same scatter-add, with the padding row zero.
  Tensor w = rand_input({5, 3});
  graph::backward(ops::sum(ops::mul(ops::embedding(w, ids, 4), g)));
  std::vector<double> gw = w.grad().to_double();
  for (int c = 0; c < 3; c++) EXPECT_EQ(gw[4 * 3 + c], 0.0);
  EXPECT_NEAR(gw[1 * 3 + 0], gv[1 * 3 + 0] + gv[3 * 3 + 0], 1e-15);
}

TEST(Embedding, GradAndDoubleBackward) {
  Tensor ids = ops::from_vector(kIds, {2, 3});
  Tensor w = rand_input({5, 3});
  // Without padding the forward is smooth in every row, so finite differences see the whole gradient.
  testutil::Fn f = [&](const std::vector<Tensor>& in) { return squared(ops::embedding(in[0], ids)); };
  testutil::expect_gradcheck(f, {w});
  testutil::expect_double_backward(f, {w});
  // embedding_backward as a function of g, with padding: its rule must withhold the padding row too.
  Tensor g = rand_input({2, 3, 3});
  for (int64_t pad : {-1, 1}) {
    SCOPED_TRACE(pad);
    // Unsquared, the weights of the padding row are nonzero, so a rule that let them through would fail.
    testutil::Fn fb = [&](const std::vector<Tensor>& in) { return ops::embedding_backward(in[0], ids, 5, pad); };
    testutil::expect_gradcheck(fb, {g});
    testutil::Fn fb2 = [&](const std::vector<Tensor>& in) {
      return squared(ops::embedding_backward(in[0], ids, 5, pad));
    };
    testutil::expect_gradcheck(fb2, {g});
    testutil::expect_double_backward(fb2, {g});
  }
}

TEST(Embedding, SavesOnlyTheIds) {
  Tensor ids = ops::from_vector(kIds, {2, 3});
  Tensor w = rand_input({5, 3});
  Tensor y = ops::embedding(w, ids, 0);
  ASSERT_TRUE(y.grad_fn());
  ASSERT_EQ(y.grad_fn()->saved_tensors.size(), 1u);
  EXPECT_EQ(y.grad_fn()->saved_tensors[0].data.impl(), ids.impl());
}

TEST(Embedding, Errors) {
  Tensor w = ops::zeros({5, 3});
  try {
    ops::embedding(w, ops::from_vector(std::vector<int64_t>{1, 9}, {2}));
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("embedding"), std::string::npos) << msg;
    EXPECT_NE(msg.find("9"), std::string::npos) << msg;
    EXPECT_NE(msg.find("5"), std::string::npos) << msg;
  }
  EXPECT_THROW(ops::embedding(w, ops::zeros({2})), engine::Error);                        // float ids
  EXPECT_THROW(ops::embedding(ops::zeros({5}), ops::from_vector(kIds, {6})), engine::Error);  // 1-D weight
  EXPECT_THROW(ops::embedding(w, ops::from_vector(kIds, {6}), 5), engine::Error);          // padding_idx >= V
  EXPECT_THROW(ops::embedding_backward(ops::zeros({6, 2}), ops::from_vector(kIds, {2, 3}), 5), engine::Error);
}

TEST(Embedding, MetaAllocatesLikeCpu) {
  testutil::expect_meta_allocates_like_cpu([] {
    Tensor w = ops::rand({7, 4}).set_requires_grad(true);
    Tensor ids = ops::from_vector(std::vector<int64_t>{6, 1, 0, 1, 3, 3}, {3, 2}, DType::i32);
    Tensor y = ops::embedding(w, ids, 0);  // [3, 2, 4]
    graph::backward(ops::sum(ops::mul(y, y)));
  });
}

TEST(Embedding, BackwardWorkspaceForTheGpuSortedScatterAdd) {
  // i32 [2V + 1 + N] for a contiguous g (the GPU's counting sort of the ids); none for a strided g (the GPU
  // takes its tile kernel), so that every device allocates the same.
  Tensor g = ops::zeros({6, 4});
  Tensor ws = ops::scatter_add_rows_workspace(g, 7, 6);
  ASSERT_TRUE(ws.defined());
  EXPECT_EQ(ws.dtype(), DType::i32);
  EXPECT_EQ(ws.shape(), (Shape{2 * 7 + 1 + 6}));
  EXPECT_FALSE(ops::scatter_add_rows_workspace(ops::transpose(ops::zeros({4, 6}), 0, 1), 7, 6).defined());
}
