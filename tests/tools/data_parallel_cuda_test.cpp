// data_parallel_cuda_test.cpp: data parallel over NCCL on two GPUs of one host, run as a user runs it
// (engine_train --nproc 2 --device cuda), against one GPU training the same data as two accumulated micro-batches,
// for plain data parallel and ZeRO-1/2/3; and each rank's ledger against meta's prediction of that rank
// (--device meta --world-size 2 --rank r), byte for byte. Skipped on a host with fewer than two GPUs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/tools/shell_util.h"
#include "tests/tools/world_util.h"
#include "tests/util/temp_dir.h"

namespace {

int visible_gpus() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

}  // namespace

// bert_base tiny with dropout off (so that rank 1 draws what the second micro-batch draws), fp32: the world's
// step losses are those of one GPU accumulating two micro-batches (printed to 4 decimals: the tied word embedding's
// gradient is a sum over its uses, which the two runs associate differently, a few units in the last place).
// Each rank's arena is the default one, all the GPU's free memory but a reserve: NCCL's buffers are made before it
// (engine/cuda/nccl.cpp), not at the first collective, where the default arena would leave them no room.
TEST(DataParallelCuda, TwoGpusTrainAsOneAccumulatingAndMetaPredictsEachRank) {
  const int gpus = visible_gpus();
  if (gpus < 2) GTEST_SKIP() << "needs two GPUs; this host shows " << gpus;
  testutil::TempDir dir;
  const std::string common = testutil::program("engine_train") +
                             " --model bert_base --size tiny --batch 4 --steps 3 --seed 3 --dropout 0 "
                             "--attention-dropout 0";
  const auto [rc_acc, out_acc] = testutil::shell(common + " --device cuda --accumulate 2");
  ASSERT_EQ(rc_acc, 0) << out_acc;
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE("--zero " + std::to_string(zero));
    const std::string z = " --zero " + std::to_string(zero) + " --bucket-mb 1";  // (a world's flags)
    const std::string json = dir.file("dp" + std::to_string(zero) + ".json");
    const auto [rc_dp, out_dp] = testutil::shell(common + z + " --device cuda --nproc 2 --json " + json);
    ASSERT_EQ(rc_dp, 0) << out_dp;
    EXPECT_NE(out_dp.find("data parallel: rank 0 of 2 (nccl)"), std::string::npos) << out_dp;
    EXPECT_EQ(testutil::step_losses(out_dp), testutil::step_losses(out_acc)) << out_dp << out_acc;
    for (int r = 0; r < 2; r++) {
      const std::string m = dir.file("meta" + std::to_string(zero) + "_" + std::to_string(r) + ".json");
      const auto [rc_m, out_m] =
          testutil::shell(common + z + " --device meta --world-size 2 --rank " + std::to_string(r) + " --json " + m);
      ASSERT_EQ(rc_m, 0) << out_m;
      EXPECT_EQ(testutil::ledger_of(r == 0 ? json : json + ".rank1"), testutil::ledger_of(m)) << "rank " << r;
    }
  }
}
