// bench_diff_test.cpp: engine_bench diff (tools/bench_diff.h). Each side's peak is the ledger's own peak of the
// same steps run directly; each table (category, module, op) adds up to the difference of the peaks exactly;
// what a lever is known to do shows where it should (flash attention keeps no softmax probabilities and adds
// its own op; layer recomputation moves activations out); a config against itself differs nowhere; the program
// splits A -- B, writes its files and refuses a command line without "--".
#include <gtest/gtest.h>

#include <numeric>

#include "engine/device.h"
#include "engine/json.h"
#include "models/registry.h"
#include "tests/tools/bench_test_util.h"
#include "tools/bench_diff.h"

namespace {

models::ModelConfig tiny_bert() {
  models::ModelConfig c;
  c.name = "bert_base";
  c.size = "tiny";
  c.seq = 128;
  c.batch = 4;
  return c;
}

// The ledger's peak after `steps` training steps on a fresh meta device: the reference for each side.
size_t ledger_peak(const models::ModelConfig& c, int steps) {
  auto device = engine::Device::create(engine::DeviceType::meta, size_t(1) << 40);
  engine::DeviceGuard guard(device);
  auto model = models::create_model(c);
  for (int s = 1; s <= steps; s++) model->train_step(s);
  return device->ledger().peak_bytes();
}

int64_t sum_of_deltas(const std::vector<tools::DiffRow>& rows) {
  return std::accumulate(rows.begin(), rows.end(), int64_t(0),
                         [](int64_t s, const tools::DiffRow& r) { return s + r.delta(); });
}

const tools::DiffRow* row(const std::vector<tools::DiffRow>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}

}  // namespace

TEST(BenchDiff, TablesAddUpToTheDifferenceOfThePeaks) {
  models::ModelConfig a = tiny_bert(), b = tiny_bert();
  b.attention = "flash";
  const tools::PeakDiff d = tools::diff_peaks(a, b, 2);
  EXPECT_EQ(d.a.peak, ledger_peak(a, 2));
  EXPECT_EQ(d.b.peak, ledger_peak(b, 2));
  const int64_t delta = int64_t(d.b.peak) - int64_t(d.a.peak);
  EXPECT_LT(delta, 0) << "flash attention keeps less at the peak";
  EXPECT_EQ(sum_of_deltas(d.by_category), delta);
  EXPECT_EQ(sum_of_deltas(d.by_module), delta);
  EXPECT_EQ(sum_of_deltas(d.by_op), delta);
  // Flash attention materializes no softmax probabilities and has an op of its own.
  const tools::DiffRow* softmax = row(d.by_op, "core/softmax");
  ASSERT_NE(softmax, nullptr);
  EXPECT_GT(softmax->a, 0u);
  EXPECT_EQ(softmax->b, 0u);
  const tools::DiffRow* flash = row(d.by_op, "core/flash_attention");
  ASSERT_NE(flash, nullptr);
  EXPECT_EQ(flash->a, 0u);
  EXPECT_GT(flash->b, 0u);
  // The moments: a step that ran, a phase, the owner of the allocation.
  for (const tools::PeakAccount* p : {&d.a, &d.b}) {
    EXPECT_GE(p->peak_step, 1);
    EXPECT_LE(p->peak_step, 2);
    EXPECT_FALSE(p->peak_phase.empty());
    EXPECT_FALSE(p->peak_owner.empty());
  }
  const std::string md = tools::diff_markdown(d, 5);
  EXPECT_NE(md.find("(--attention flash)"), std::string::npos) << md;
  EXPECT_NE(md.find("| core/softmax | "), std::string::npos) << md;
  EXPECT_NE(md.find(" more"), std::string::npos) << "more than 5 ops change; the rest is summed:\n" << md;
  engine::json::Value j = engine::json::parse_json(tools::diff_json(d), "diff json");
  EXPECT_EQ(engine::json::integer_member(j, "delta_bytes", INT64_MIN, INT64_MAX, "diff json"), delta);
}

TEST(BenchDiff, LayerRecomputationMovesActivationsOut) {
  models::ModelConfig a = tiny_bert(), b = tiny_bert();
  b.recompute = "layer";
  const tools::PeakDiff d = tools::diff_peaks(a, b, 2);
  const tools::DiffRow* act = row(d.by_category, "activation");
  ASSERT_NE(act, nullptr);
  EXPECT_LT(act->b, act->a / 2) << "recomputing each layer keeps only the layers' inputs";
  EXPECT_EQ(sum_of_deltas(d.by_category), int64_t(d.b.peak) - int64_t(d.a.peak));
  // Parameters and optimizer state do not depend on recomputation.
  for (const char* c : {"param", "optimizer"}) {
    const tools::DiffRow* r = row(d.by_category, c);
    ASSERT_NE(r, nullptr) << c;
    EXPECT_EQ(r->delta(), 0) << c;
  }
}

TEST(BenchDiff, AConfigAgainstItselfDiffersNowhere) {
  const tools::PeakDiff d = tools::diff_peaks(tiny_bert(), tiny_bert(), 2);
  EXPECT_EQ(d.a.peak, d.b.peak);
  for (const auto* rows : {&d.by_category, &d.by_module, &d.by_op})
    for (const auto& r : *rows) EXPECT_EQ(r.delta(), 0) << r.name;
  EXPECT_NE(tools::diff_markdown(d).find("(the same config)"), std::string::npos);
}

TEST(BenchDiff, ProgramSplitsTheConfigsWritesItsFilesAndRefusesBadInput) {
  testutil::TempDir dir;
  const std::string bench = testutil::program("engine_bench");
  auto [code, out] = testutil::shell(bench +
                                     " diff --model bert_base --size tiny --seq 64 --batch 2 -- --recompute "
                                     "layer --out " +
                                     dir.path.string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("## Peak of bert_base: A → B (--recompute layer)"), std::string::npos) << out;
  const std::string stem = "diff_bert_base_tiny_seq64_batch2_vs_tiny_recompute-layer_seq64_batch2";
  EXPECT_TRUE(std::filesystem::exists(dir.file(stem + ".md"))) << out;
  engine::json::Value j = engine::json::parse_json(testutil::read_text(dir.file(stem + ".json")), "diff json");
  EXPECT_LT(engine::json::integer_member(j, "delta_bytes", INT64_MIN, INT64_MAX, "diff json"), 0);
  struct Bad {
    std::string args, message;
  };
  for (const Bad& bad : std::vector<Bad>{
           {"diff --model bert_base --size tiny", "give two configs, A -- B"},
           {"diff --model bert_base --size tiny -- --attention fast", "--attention"},
           {"diff --model nosuch -- --seq 64", "unknown model 'nosuch'"},
           {"diff --model bert_base --size tiny -- --steps 0", "--steps and --rows must be at least 1"},
       }) {
    auto [bad_code, bad_out] = testutil::shell(bench + " " + bad.args + " --out " + dir.path.string());
    EXPECT_EQ(bad_code, 2) << bad.args << "\n" << bad_out;
    EXPECT_NE(bad_out.find(bad.message), std::string::npos) << bad.args << "\n" << bad_out;
  }
}
