// oom_remedies_test.cpp: the out-of-memory report's remedies (tools/oom_remedies.h). Every line is re-run here:
// its peak is the peak of that config run on its own, its fit verdict is a probe's in the same arena, its largest
// batch fits and one more does not; a lever the model lacks is not offered; engine_train's report names the step,
// and its commands, pasted, train where it says they fit and run out of memory where it says they do not.
#include <gtest/gtest.h>

#include <regex>

#include "tests/tools/bench_test_util.h"
#include "tools/max_batch.h"
#include "tools/oom_remedies.h"

namespace {

constexpr size_t kUnbounded = size_t(1) << 40;

models::ModelConfig tiny_bert() {
  models::ModelConfig c;
  c.name = "bert_base";
  c.size = "tiny";
  c.seq = 128;
  c.batch = 32;
  return c;
}

}  // namespace

TEST(OomRemedies, EveryLineHoldsWhenRunOnItsOwn) {
  const models::ModelConfig c = tiny_bert();
  const size_t peak = tools::probe_batch(c, engine::DeviceType::meta, kUnbounded, 32, 2).peak;
  const size_t capacity = peak * 6 / 10;
  ASSERT_FALSE(tools::probe_batch(c, engine::DeviceType::meta, capacity, 32, 2).fits);
  const tools::RemedyReport r = tools::oom_remedies(c, capacity, 2);
  EXPECT_EQ(r.peak, peak);
  EXPECT_EQ(r.unit, "seq");
  // recompute attention / layer, flash, bf16, together, a smaller batch, a shorter sequence, micro-batches of the
  // same global batch
  ASSERT_GE(r.remedies.size(), 4u);
  auto is = [&](size_t i, const char* flag) {
    return i < r.remedies.size() && r.remedies[i].lever.rfind(flag, 0) == 0;
  };
  bool shorter = false;
  bool any_fits = false;
  for (size_t i = 0; i < r.remedies.size(); i++) {
    const tools::Remedy& m = r.remedies[i];
    SCOPED_TRACE(m.lever);
    const int64_t batch = m.config.batch;
    EXPECT_EQ(tools::probe_batch(m.config, engine::DeviceType::meta, kUnbounded, batch, 2).peak, m.peak);
    EXPECT_EQ(tools::probe_batch(m.config, engine::DeviceType::meta, capacity, batch, 2).fits, m.fits);
    ASSERT_GT(m.max_batch, 0);
    EXPECT_TRUE(tools::probe_batch(m.config, engine::DeviceType::meta, capacity, m.max_batch, 2).fits);
    EXPECT_FALSE(tools::probe_batch(m.config, engine::DeviceType::meta, capacity, m.max_batch + 1, 2).fits);
    EXPECT_LT(m.peak, r.peak) << "every remedy saves something";
    any_fits |= m.fits;
    EXPECT_EQ(m.lever.find("--recompute cell"), std::string::npos) << "BERT has no cell recomputation";
    if (m.lever.find("--accumulate") != std::string::npos) {
      EXPECT_EQ(i + 1, r.remedies.size()) << "the micro-batches come last";
      EXPECT_EQ(batch * m.config.accumulate, 32) << "the same global batch";
      EXPECT_TRUE(m.fits);
    } else if (is(i, "--batch")) {
      EXPECT_GE(i + 3, r.remedies.size()) << "the smaller batch comes after the levers";
      EXPECT_LT(batch, 32);
      EXPECT_TRUE(m.fits);
    } else if (is(i, "--seq")) {  // the longest sequence that fits at the batch: one token more does not
      shorter = true;
      EXPECT_TRUE(is(i - 1, "--batch") || is(i + 1, "--batch") || i + 2 >= r.remedies.size());
      EXPECT_EQ(batch, 32);
      EXPECT_LT(m.config.seq, 128);
      EXPECT_TRUE(m.fits);
      models::ModelConfig longer = m.config;
      longer.seq++;
      EXPECT_FALSE(tools::probe_batch(longer, engine::DeviceType::meta, capacity, 32, 2).fits);
    } else if (!is(i + 1, "--batch") && !is(i + 1, "--seq") && !is(i + 1, "--accumulate") &&
               i + 1 < r.remedies.size()) {
      EXPECT_LE(m.peak, r.remedies[i + 1].peak) << "largest saving first";
    }
  }
  EXPECT_TRUE(any_fits);
  EXPECT_TRUE(shorter) << "a shorter sequence at the same batch";
  const std::string md = tools::remedies_markdown(r, "--device meta --memory 1GB");
  EXPECT_NE(md.find("| --recompute layer | "), std::string::npos) << md;
  EXPECT_NE(md.find("`engine_train --model bert_base --size tiny --seq 128 --batch 32 --recompute layer --device "
                    "meta --memory 1GB`"),
            std::string::npos)
      << md;
}

TEST(OomRemedies, EngineTrainNamesTheStepAndItsCommandsTrain) {
  const models::ModelConfig c = tiny_bert();
  const size_t peak = tools::probe_batch(c, engine::DeviceType::meta, kUnbounded, 32, 2).peak;
  const std::string memory = std::to_string(peak * 6 / 10);
  auto [code, out] = testutil::shell(testutil::program("engine_train") +
                                     " --model bert_base --size tiny --seq 128 --batch 32 --device meta --steps 2 "
                                     "--memory " +
                                     memory);
  ASSERT_EQ(code, 3) << out;
  EXPECT_NE(out.find("in training step 1"), std::string::npos) << out;
  EXPECT_NE(out.find("What would fit, measured on meta"), std::string::npos) << out;
  // Every line's command, pasted as the user would: those that say "yes" train, those that say "no" run out of
  // memory.
  std::regex line(R"(\| (yes|no) \| \d+ \| `engine_train ([^`]*)` \|)");
  int fits = 0, fails = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it) {
    const bool yes = (*it)[1].str() == "yes";
    auto [status, run_out] = testutil::shell(testutil::program("engine_train") + " " + (*it)[2].str() + " --steps 2");
    EXPECT_EQ(status, yes ? 0 : 3) << (*it)[2].str() << "\n" << run_out;
    (yes ? fits : fails)++;
  }
  EXPECT_GE(fits, 3) << out;  // the levers together, a smaller batch, a shorter sequence
  EXPECT_GE(fails, 1) << out;
}
