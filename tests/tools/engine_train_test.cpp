// engine_train_test.cpp: the engine_train program's new flags, run as a user runs them: --gpu (capacity in
// the header, errors), --inference, --find-max-batch, --save/--load (resumed step lines equal an
// uninterrupted run's), and the checkpoint errors a user sees. Output is piped, so no progress bar.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <sstream>

#include "engine/device.h"
#include "engine/format.h"
#include "engine/json.h"
#include "engine/safetensors.h"
#include "ops/factory.h"
#include "tests/tools/bench_test_util.h"
#include "tests/tools/shell_util.h"
#include "tools/gpu_profiles.h"

namespace {

using testutil::shell;

const std::string kTrain =
    testutil::program("engine_train") + " --model transformer_lm --size tiny --seq 16 --batch 4 ";

// The "loss X" pieces of the step lines, in order.
std::vector<std::string> step_losses(const std::string& out) {
  std::vector<std::string> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("step ", 0) == 0) {
      size_t at = line.find("| loss ") + 7;
      v.push_back(line.substr(at, line.find(" |", at) - at));
    }
  return v;
}

}  // namespace

TEST(EngineTrain, GpuProfileSetsTheArena) {
  auto [code, out] = shell(kTrain + "--device meta --gpu h200 --steps 1");
  ASSERT_EQ(code, 0) << out;
  const auto& h200 = tools::find_gpu_profile("h200");
  std::string expected = "arena " + engine::format_bytes(tools::gpu_arena_capacity(h200)) +
                         " (gpu h200: 143771 MiB less a " + std::to_string(h200.reserve_mib) + " MiB reserve)";
  EXPECT_NE(out.find(expected), std::string::npos) << out;

  std::tie(code, out) = shell(kTrain + "--device meta --gpu rtx9090");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("unknown gpu profile 'rtx9090': valid profiles are rtx2060"), std::string::npos) << out;
  std::tie(code, out) = shell(kTrain + "--device meta --gpu h200 --memory 24GB");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("give --gpu or --memory, not both"), std::string::npos) << out;
  EXPECT_EQ(out.find("engine_train: engine_train:"), std::string::npos) << "one program prefix: " << out;
}

TEST(EngineTrain, InferenceRunsEvalSteps) {
  auto [code, out] = shell(kTrain + "--inference --steps 2");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("inference: forward only, eval mode"), std::string::npos) << out;
  EXPECT_NE(out.find("step 2/2 | loss "), std::string::npos) << out;
  EXPECT_EQ(out.find("| grad |"), std::string::npos) << "no gradients at the peak: " << out;
  EXPECT_EQ(out.find("| optimizer |"), std::string::npos) << "no optimizer state: " << out;
}

// A translation model's --inference generates greedily and computes no loss: the step line says "-", not 0.
TEST(EngineTrain, GenerationPrintsNoLossAndEvalPrintsTheRealOne) {
  auto [code, out] =
      shell(testutil::program("engine_train") + " --model transformer_big --size tiny --inference --steps 1");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("step 1/1 | loss - |"), std::string::npos) << out;
  EXPECT_NE(out.find("generated "), std::string::npos) << out;
  std::tie(code, out) = shell(kTrain + "--inference --steps 1");
  ASSERT_EQ(code, 0) << out;
  const std::vector<std::string> losses = step_losses(out);
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_GT(std::stod(losses[0]), 1.0) << "a tiny LM's eval cross-entropy over 64 words: about ln 64\n" << out;
}

// Output paths are checked before the first step: a missing folder is a clear error, and nothing trains.
TEST(EngineTrain, UnwritableOutputPathsStopBeforeTheRun) {
  for (const char* flag : {"--save", "--trace", "--report", "--json"}) {
    auto [code, out] = shell(kTrain + "--steps 1 " + flag + " /nonexistent_dir/x.out");
    EXPECT_EQ(code, 2) << flag << "\n" << out;
    EXPECT_NE(out.find(std::string(flag) + " /nonexistent_dir/x.out: the folder '/nonexistent_dir' does not exist"),
              std::string::npos) << out;
    EXPECT_EQ(out.find("step 1/1"), std::string::npos) << flag << ": the run started\n" << out;
  }
  auto [code, out] = shell(kTrain + "--steps 1 --save /tmp");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("this is a folder"), std::string::npos) << out;
}

// --profile on meta has no times to show; it says so and gives the step's counted work by op instead.
TEST(EngineTrain, ProfileOnMetaShowsTheCountedWork) {
  auto [code, out] = shell(kTrain + "--device meta --steps 1 --profile");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("meta runs no kernels, so there is no time to show"), std::string::npos) << out;
  EXPECT_NE(out.find("| linear |"), std::string::npos) << out;
}

// --profile on cpu times every kernel: the table by op, then the largest (module, op) pairs, each row naming the
// module scope its kernels ran in (a layer's forward and backward apart) with its share of the step.
TEST(EngineTrain, ProfileShowsTimeByModule) {
  auto [code, out] = shell(kTrain + "--steps 1 --profile");
  ASSERT_EQ(code, 0) << out;
  const size_t by_op = out.find("## Time by op"), by_module = out.find("## Time by module (the 30 largest of ");
  ASSERT_NE(by_op, std::string::npos) << out;
  ASSERT_NE(by_module, std::string::npos) << out;
  EXPECT_LT(by_op, by_module) << out;
  const std::string table = out.substr(by_module, out.find("## Memory at the peak") - by_module);
  EXPECT_NE(table.find("| module | op | kernels | ms | share of step | TFLOP/s |"), std::string::npos) << table;
  // 30 rows, each naming a module scope (dotted, no op in it) or the top level (the optimizer); the blocks' linear
  // layers' backward (their GEMMs, the step's largest kernels) among them, under their own module.
  std::istringstream rows(table);
  int n = 0;
  bool block_linear_backward = false;
  for (std::string line; std::getline(rows, line);) {
    if (line.rfind("| ", 0) != 0 || line.rfind("| module |", 0) == 0) continue;
    n++;
    const std::string module = line.substr(2, line.find(" |") - 2);
    EXPECT_TRUE(!module.empty() && module.find('/') == std::string::npos) << line;
    block_linear_backward |= module.rfind("h.", 0) == 0 && line.find(" | linear_backward | ") != std::string::npos;
  }
  EXPECT_EQ(n, 30) << table;
  EXPECT_TRUE(block_linear_backward) << "a layer's backward by its module: " << table;
}

// Gradients are owned by their parameter ("<name>/grad"), so the module tables put them beside it.
TEST(EngineTrain, GradientsAreNamedByTheirParameter) {
  auto [code, out] = shell(kTrain + "--steps 1");
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(out.find("(untagged)"), std::string::npos) << out;
  EXPECT_NE(out.find("| weight/grad |"), std::string::npos) << out;
}

TEST(EngineTrain, FindMaxBatch) {
  auto [code, out] = shell(testutil::program("engine_train") +
                           " --model transformer_lm --size tiny --device meta --memory 48MB "
                           "--find-max-batch");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find(" seq fit, "), std::string::npos) << out;
  EXPECT_NE(out.find("binding term: activation grew most"), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << "no progress bar when stderr is not a terminal";
  std::tie(code, out) =
      shell(testutil::program("engine_train") + " --model transformer_lm --device meta --find-max-batch");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("give --gpu NAME or --memory SIZE"), std::string::npos) << out;
}

TEST(EngineTrain, SaveThenLoadResumesTheSameLosses) {
  char tmpl[] = "/tmp/engine_train_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl, ck = dir + "/run.safetensors";
  auto [code, whole] = shell(kTrain + "--steps 4");
  ASSERT_EQ(code, 0) << whole;
  auto [c1, first] = shell(kTrain + "--steps 2 --save " + ck);
  ASSERT_EQ(c1, 0) << first;
  EXPECT_NE(first.find("saved " + ck + " after step 2"), std::string::npos) << first;
  auto [c2, second] =
      shell(testutil::program("engine_train") + " --load " + ck + " --steps 2");  // the config comes from the file
  ASSERT_EQ(c2, 0) << second;
  EXPECT_NE(second.find("optimizer state, resuming after step 2"), std::string::npos) << second;
  EXPECT_NE(second.find("step 4/4 | loss"), std::string::npos) << second;
  auto all = step_losses(whole), resumed = step_losses(first);
  for (const auto& l : step_losses(second)) resumed.push_back(l);
  EXPECT_EQ(resumed, all) << whole << "\n---\n" << first << "\n---\n" << second;

  std::filesystem::resize_file(ck, 64);
  auto [c3, broken] = shell(testutil::program("engine_train") + " --model transformer_lm --load " + ck + " --steps 1");
  EXPECT_EQ(c3, 2);
  EXPECT_NE(broken.find(ck), std::string::npos) << "the error names the file: " << broken;
  auto [c4, meta] = shell(kTrain + "--device meta --steps 1 --save " + dir + "/meta.safetensors");
  EXPECT_EQ(c4, 2);
  EXPECT_NE(meta.find("nothing to save"), std::string::npos) << meta;
  std::filesystem::remove_all(dir);
}

// --batch-file: every step reads the file's batch (the parity runs' mechanism, tools/bench/deeplab_parity.py).
// Eval steps on one fixed batch give one loss (the model's own batches differ by step); training on it memorizes
// it (the loss falls); the 10-digit loss line appears; a batch missing a tensor the model reads, and a model that
// reads several batches per step, are errors that say so.
TEST(EngineTrain, BatchFileFeedsEveryStep) {
  const std::string dir = ::testing::TempDir() + "batch_file_test";
  std::filesystem::create_directories(dir);
  auto cpu = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 26);
  engine::DeviceGuard guard(cpu);
  std::vector<int64_t> ids(4 * 16), targets(4 * 16);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = int64_t(i % 7), targets[i] = int64_t((i + 1) % 7);
  engine::save_safetensors(dir + "/batch.safetensors",
                           {{"ids", ops::from_vector(ids, {4, 16}, engine::DType::i64, cpu)},
                            {"targets", ops::from_vector(targets, {64}, engine::DType::i64, cpu)}});
  engine::save_safetensors(dir + "/no_targets.safetensors",
                           {{"ids", ops::from_vector(ids, {4, 16}, engine::DType::i64, cpu)}});

  auto [code, out] = shell(kTrain + "--inference --steps 3 --batch-file " + dir + "/batch.safetensors");
  ASSERT_EQ(code, 0) << out;
  auto losses = step_losses(out);
  ASSERT_EQ(losses.size(), 3u) << out;
  EXPECT_EQ(losses[0], losses[1]) << out;
  EXPECT_EQ(losses[1], losses[2]) << out;
  EXPECT_NE(out.find("\n  loss "), std::string::npos) << "the 10-digit loss line: " << out;
  std::tie(code, out) = shell(kTrain + "--inference --steps 3");
  ASSERT_EQ(code, 0) << out;
  losses = step_losses(out);
  ASSERT_EQ(losses.size(), 3u) << out;
  EXPECT_TRUE(losses[0] != losses[1] || losses[1] != losses[2]) << "the model's own batches differ: " << out;

  std::tie(code, out) = shell(kTrain + "--steps 8 --batch-file " + dir + "/batch.safetensors");
  ASSERT_EQ(code, 0) << out;
  losses = step_losses(out);
  ASSERT_EQ(losses.size(), 8u) << out;
  EXPECT_LT(std::stod(losses.back()), std::stod(losses.front())) << out;

  std::tie(code, out) = shell(kTrain + "--steps 1 --batch-file " + dir + "/no_targets.safetensors");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("the fixed batch lacks a tensor the model reads; it holds: ids [4, 16]"), std::string::npos)
      << out;
  std::tie(code, out) =
      shell(testutil::program("engine_train") + " --model unsupmt --size tiny --device meta --steps 1 --batch-file " +
            dir + "/batch.safetensors");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("reads several different batches per step"), std::string::npos) << out;
}

// --json: the same run as the text, as numbers: a step per step line with the text's losses (cpu) and peaks, the
// peak's bytes, moment and groups (each grouping summing to the peak), the text naming the same moment.
TEST(EngineTrain, JsonHoldsWhatTheTextSays) {
  testutil::TempDir dir;
  const std::string path = dir.file("run.json");
  auto [code, out] = shell(kTrain + "--device cpu --steps 3 --json " + path);
  ASSERT_EQ(code, 0) << out;
  engine::json::Value j = engine::json::parse_json(testutil::read_text(path), path);
  const auto& steps = j.at("steps", path).items;
  ASSERT_EQ(steps.size(), 3u);
  const std::vector<std::string> losses = step_losses(out);
  ASSERT_EQ(losses.size(), 3u) << out;
  for (size_t i = 0; i < 3; i++) {
    EXPECT_EQ(engine::json::integer_member(steps[i], "step", 1, 3, path), int64_t(i) + 1);
    EXPECT_EQ(engine::format_fixed(steps[i].at("loss", path).number, 4), losses[i]);
  }
  const engine::json::Value& peak = j.at("peak", path);
  const int64_t bytes = engine::json::integer_member(peak, "bytes", 1, INT64_MAX, path);
  EXPECT_EQ(engine::json::integer_member(steps[2], "peak_bytes", 1, INT64_MAX, path), bytes);
  for (const char* grouping : {"by_category", "by_module", "by_op"}) {
    int64_t sum = 0;
    for (const auto& [name, v] : peak.at(grouping, path).members) sum += int64_t(v.number);
    EXPECT_EQ(sum, bytes) << grouping;
  }
  const std::string owner = peak.at("owner", path).text, phase = peak.at("phase", path).text;
  const int64_t step = engine::json::integer_member(peak, "step", 1, 3, path);
  EXPECT_NE(out.find(engine::str("The peak, ", engine::format_bytes(size_t(bytes)), ", came in step ", step,
                                 ", phase ", phase, ", at the allocation of ", owner, ".")),
            std::string::npos)
      << out;
  EXPECT_EQ(j.at("flags", path).text, "--model transformer_lm --size tiny --seq 16 --batch 4");
}
