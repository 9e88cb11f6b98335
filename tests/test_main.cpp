// test_main.cpp: the GoogleTest entry point shared by the CPU and CUDA test binaries.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
