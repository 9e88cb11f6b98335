// test_main.cpp: the GoogleTest entry point shared by the CPU and CUDA test binaries.
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int status = RUN_ALL_TESTS();
  // The plain closing line CI reads, in every language: "N passed, N failed".
  const auto* unit = ::testing::UnitTest::GetInstance();
  std::printf("%d passed, %d failed\n", unit->successful_test_count(), unit->failed_test_count());
  return status;
}
