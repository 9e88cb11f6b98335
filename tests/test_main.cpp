// test_main.cpp: the GoogleTest entry point shared by the CPU and CUDA test binaries.
#include <gtest/gtest.h>

#include <cstdio>

#include "engine/rng.h"

namespace {
// Every test starts from the generator's initial state (seed 0, offset 0), so the random inputs a test draws do
// not depend on which tests ran before it (a new test, or --gtest_filter, would otherwise change them).
class FreshGeneratorPerTest : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo&) override { engine::manual_seed(0); }
};
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new FreshGeneratorPerTest);
  int status = RUN_ALL_TESTS();
  // The plain closing line CI reads, in every language: "N passed, N failed".
  const auto* unit = ::testing::UnitTest::GetInstance();
  std::printf("%d passed, %d failed\n", unit->successful_test_count(), unit->failed_test_count());
  return status;
}
