// gpu_profiles_test.cpp: the GPU profile table (every card of the 2020 study present, sane numbers), its
// lookups and errors, and the progress bar's formatting.
#include <gtest/gtest.h>

#include <set>

#include "engine/error.h"
#include "tools/gpu_profiles.h"
#include "tools/progress.h"
#include "tests/util/error_util.h"

namespace {

std::string error_of(const std::string& name) {
  return testutil::error_of([&] { tools::find_gpu_profile(name); });
}

}  // namespace

TEST(GpuProfiles, EveryCardOfThe2020TableAndTheNewerOnes) {
  // The columns of shared/lambda2020.csv, then the later cards.
  for (const char* name :
       {"rtx2060", "rtx2070", "rtx2080", "gtx1080ti", "rtx2080ti", "titanrtx", "rtx6000", "rtx8000", "t4", "v100-16",
        "v100-32", "a100-40", "a100-80", "rtx3090", "rtx4090", "l4", "h100", "h200"})
    EXPECT_NO_THROW(tools::find_gpu_profile(name)) << name;
  std::set<std::string> names;
  for (const auto& g : tools::gpu_profiles()) {
    EXPECT_TRUE(names.insert(g.name).second) << "duplicate profile " << g.name;
    EXPECT_GT(g.reserve_mib, 0u) << g.name;
    EXPECT_LT(g.reserve_mib * 10, g.memory_mib) << g.name << ": a reserve is a small part of the card";
    EXPECT_GT(g.fp32_tflops, 0) << g.name;
    EXPECT_GE(g.fp16_tflops, 0) << g.name;
  }
}

TEST(GpuProfiles, MemoryAndCapacity) {
  const tools::GpuProfile& ti = tools::find_gpu_profile("rtx2080ti");
  EXPECT_EQ(ti.memory_mib, 11264u);  // 11 GB of GDDR6, as nvidia-smi reports it
  EXPECT_EQ(tools::gpu_arena_capacity(ti), (size_t(11264) - ti.reserve_mib) * 1024 * 1024);
  EXPECT_EQ(tools::find_gpu_profile("rtx2060").memory_mib, 6144u);
  EXPECT_EQ(tools::find_gpu_profile("rtx8000").memory_mib, 49152u);
  EXPECT_EQ(tools::find_gpu_profile("h200").memory_mib, 143771u);
  // Same card, same memory: the ordering of the 2020 table's columns by memory holds.
  EXPECT_LT(tools::gpu_arena_capacity(tools::find_gpu_profile("rtx2070")),
            tools::gpu_arena_capacity(tools::find_gpu_profile("gtx1080ti")));
}

TEST(GpuProfiles, PeakRatesFallBackToFp32WithoutTensorCores) {
  const auto& a100 = tools::find_gpu_profile("a100-40");
  EXPECT_DOUBLE_EQ(tools::gpu_peak_tflops(a100, "bf16"), 312);
  EXPECT_DOUBLE_EQ(tools::gpu_peak_tflops(a100, "tf32"), 156);
  EXPECT_DOUBLE_EQ(tools::gpu_peak_tflops(a100, "fp32"), 19.5);
  const auto& pascal = tools::find_gpu_profile("gtx1080ti");
  EXPECT_DOUBLE_EQ(tools::gpu_peak_tflops(pascal, "fp16"), pascal.fp32_tflops);
  const auto& turing = tools::find_gpu_profile("rtx2080ti");
  EXPECT_DOUBLE_EQ(tools::gpu_peak_tflops(turing, "bf16"), turing.fp32_tflops) << "Turing has no bf16 path";
  EXPECT_DOUBLE_EQ(tools::gpu_peak_tflops(turing, "fp16"), 53.8);
  try {
    tools::gpu_peak_tflops(turing, "fp8");
    FAIL() << "fp8 accepted";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected fp32, tf32, bf16 or fp16"), std::string::npos) << e.what();
  }
}

TEST(GpuProfiles, UnknownNameListsTheProfiles) {
  std::string e = error_of("rtx9090");
  EXPECT_NE(e.find("unknown gpu profile 'rtx9090'"), std::string::npos) << e;
  EXPECT_NE(e.find("rtx2080ti"), std::string::npos) << e;
  EXPECT_NE(e.find("h200"), std::string::npos) << e;
  EXPECT_NE(error_of("").find("unknown gpu profile"), std::string::npos);
}

TEST(Progress, RendersKnownAndUnknownTotals) {
  EXPECT_EQ(tools::render_progress("train", 5, 10, 2.0, "step 5", 10),
            "train [#####.....] 5/10 | 2.0 s, 2.0 s left | step 5");
  EXPECT_EQ(tools::render_progress("train", 10, 10, 4.0, "", 4), "train [####] 10/10 | 4.0 s");
  EXPECT_EQ(tools::render_progress("train", 0, 4, 0.0, "", 4), "train [....] 0/4 | 0.0 s");
  EXPECT_EQ(tools::render_progress("max batch", 3, 0, 1.5, "batch 4 fits"),
            "max batch [probe 3] | 1.5 s | batch 4 fits");
}
