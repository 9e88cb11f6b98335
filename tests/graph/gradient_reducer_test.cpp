// gradient_reducer_test.cpp: the reducer's bucket in flight (graph/data_parallel.h). A communicator whose started
// all-reduce completes only at wait(), as NCCL's on its own stream does: the reducer must not read a bucket's sum
// before wait(), and backward must go on while a bucket is in flight (the next bucket's gradients are computed
// between its start and its wait).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/dist.h"
#include "graph/autograd.h"
#include "graph/data_parallel.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

using engine::Tensor;

namespace {

// Rank 0 of 2 whose peer holds the same gradients: a sum is the tensor doubled, applied at wait().
class DeferredPair : public engine::dist::Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  const char* backend() const override { return "deferred"; }
  void all_reduce_sum(const Tensor& t) override {
    start_all_reduce_sum(t);
    wait();
  }
  void start_all_reduce_sum(const Tensor& t) override {
    events.push_back("start " + std::to_string(t.numel()) + (watched.grad().defined() ? " (watched ready)" : ""));
    started.push_back(t);
  }
  void wait() override {
    events.push_back(std::string("wait") + (watched.grad().defined() ? " (watched ready)" : ""));
    graph::NoGrad no_grad;
    for (const Tensor& t : started) ops::mul_(t, 2.0);
    started.clear();
  }
  void broadcast(const Tensor&, int) override {}
  void all_reduce_host(std::vector<double>& values) override {
    for (double& v : values) v *= 2;
  }
  void barrier() override {}

  Tensor watched;  // a parameter of the second bucket backward completes
  std::vector<std::string> events;
  std::vector<Tensor> started;
};

}  // namespace

TEST(GradientReducer, ABucketIsSummedWhileBackwardGoesOnAndReadOnlyAfterWait) {
  auto dev = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 28);
  engine::DeviceGuard guard(dev);
  // y = sum(tanh(tanh(x a) b)): backward completes b's gradient first, then a's.
  Tensor a = ops::rand({8, 8}).set_requires_grad(true), b = ops::rand({8, 8}).set_requires_grad(true);
  const Tensor x = ops::rand({4, 8});
  auto loss = [&] { return ops::sum(ops::tanh(ops::matmul(ops::tanh(ops::matmul(x, a)), b))); };
  graph::backward(loss());
  const std::vector<double> want_a = a.grad().to_double(), want_b = b.grad().to_double();
  a.set_grad(Tensor()), b.set_grad(Tensor());

  auto comm = std::make_shared<DeferredPair>();
  comm->watched = a;
  // Buckets of at most one 8 x 8 f32 matrix: b's (reverse registration order), then a's.
  graph::GradientReducer reducer(comm, {{"a", a}, {"b", b}}, 8 * 8 * 4);
  ASSERT_EQ(reducer.buckets().size(), 2u);
  reducer.reduce_during([&] { graph::backward(loss()); });
  // b's sum started before a's gradient existed and was waited for only when a's bucket needed the staging.
  EXPECT_EQ(comm->events, (std::vector<std::string>{"start 64", "wait (watched ready)", "start 64 (watched ready)",
                                                    "wait (watched ready)"}));
  // Each mean is (g + g) / 2 = g exactly: read before wait() it would be g / 2.
  EXPECT_EQ(a.grad().to_double(), want_a);
  EXPECT_EQ(b.grad().to_double(), want_b);
}
