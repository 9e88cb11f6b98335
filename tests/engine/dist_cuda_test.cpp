// dist_cuda_test.cpp: the NCCL communicator on the GPU machine's one GPU. A world of one through NCCL runs the whole
// data-parallel path (buckets, the all-reduce on the engine's stream, the division by the world size), so it must
// train exactly as one process does, and its ledger must be what meta predicts for a world of one; under ZeRO-3 too
// (every parameter released after each use and gathered back on the GPU). (Several GPUs: the multi-GPU run.)
#include <gtest/gtest.h>

#include <cstdio>

#include "engine/device.h"
#include "engine/dist.h"
#include "models/registry.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Tensor;

TEST(DistCuda, NcclCollectivesOfAWorldOfOne) {
  engine::DeviceGuard guard(testutil::cuda_device());
  auto comm = engine::dist::connect_nccl(engine::dist::WorldSpec{});
  EXPECT_STREQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->world_size(), 1);
  std::printf("NCCL: %s\n", engine::dist::nccl_library().c_str());
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    Tensor t = ops::to(ops::randn({1 << 20}), dt), before = ops::clone(t);
    comm->all_reduce_sum(t);  // the sum over one rank
    testutil::expect_equal(engine::str("all_reduce_sum ", engine::dtype_name(dt)), before, t);
    comm->broadcast(t, 0);
    testutil::expect_equal(engine::str("broadcast ", engine::dtype_name(dt)), before, t);
  }
  std::vector<double> host = {1.5, -2.0, 3.25};
  comm->all_reduce_host(host);
  EXPECT_EQ(host, (std::vector<double>{1.5, -2.0, 3.25}));
  comm->barrier();
  EXPECT_THROW(comm->all_reduce_sum(ops::full({4}, 1.0, DType::i64)), engine::Error);
}

TEST(DistCuda, DataParallelOverNcclEqualsOneProcessAndMetaPredictsItsLedger) {
  struct Run {
    std::vector<double> losses;
    std::string events;
    size_t peak = 0;
  };
  // kind 0: one process; 1: a world of one through NCCL; 2: meta's world of one. `zero`: the ZeRO stage (3: the
  // parameters released between uses and gathered back through NCCL broadcasts of the rank's own pieces).
  auto run = [](int kind, int zero) {
    auto dev = engine::Device::create(kind == 2 ? engine::DeviceType::meta : engine::DeviceType::cuda, size_t(4) << 30);
    engine::DeviceGuard guard(dev);
    models::ModelConfig c;
    c.name = "bert_base";
    c.size = "tiny";
    c.bucket_mb = 1;  // several buckets
    auto model = models::create_model(c);
    if (kind == 1)
      model->set_data_parallel(engine::dist::connect_nccl(engine::dist::WorldSpec{}), size_t(1) << 20, zero);
    if (kind == 2) model->set_data_parallel(engine::dist::meta_world(1), size_t(1) << 20, zero);
    Run r;
    for (int s = 1; s <= 3; s++) r.losses.push_back(model->train_step(s).loss);
    dev->synchronize();
    r.events = dev->ledger().events_csv();
    r.peak = dev->ledger().peak_bytes();
    return r;
  };
  const Run one = run(0, 0);
  for (int zero : {0, 3}) {
    const Run nccl = run(1, zero), meta = run(2, zero);
    EXPECT_EQ(one.losses, nccl.losses) << "--zero " << zero;  // a sum over one rank and a division by 1: exact
    EXPECT_EQ(nccl.peak, meta.peak) << "--zero " << zero;
    EXPECT_TRUE(nccl.events == meta.events) << "--zero " << zero << ": the NCCL rank's allocation events differ "
                                            << "from meta's";
    if (zero == 0) {
      EXPECT_GT(nccl.peak, one.peak);  // the staging buffer of the buckets, category comm
    }
    std::printf("bert_base tiny --zero %d: one process peak %zu B, NCCL world of one %zu B == meta %zu B\n", zero,
                one.peak, nccl.peak, meta.peak);
  }
}
