// ledger_test.cpp: counters per category, the invariant, the peak snapshot (also after compaction), and
// the exports.
#include <gtest/gtest.h>

#include "engine/device.h"
#include "engine/ledger.h"
#include "engine/tensor.h"

using engine::Category;
using engine::Ledger;
using engine::Phase;

TEST(Ledger, CountsPerCategoryAndPeak) {
  Ledger l;
  int64_t a = l.on_alloc(0, 1000, 1024, Category::param, "m/a", Phase::setup);
  int64_t b = l.on_alloc(1024, 512, 512, Category::temp, "m/b", Phase::forward);
  l.check();
  EXPECT_EQ(l.live_bytes(), 1536u);
  EXPECT_EQ(l.live_bytes(Category::param), 1024u);
  l.retag(b, Category::activation);
  EXPECT_EQ(l.live_bytes(Category::temp), 0u);
  EXPECT_EQ(l.live_bytes(Category::activation), 512u);
  l.check();
  int64_t c = l.on_alloc(1536, 2048, 2048, Category::temp, "m/c", Phase::forward);  // peak: 3584
  l.on_free(c);
  l.on_free(b);
  int64_t d = l.on_alloc(1024, 256, 256, Category::grad, "m/d", Phase::backward);
  l.check();
  EXPECT_EQ(l.peak_bytes(), 3584u);
  EXPECT_EQ(l.peak_breakdown(Category::temp), 2048u);
  EXPECT_EQ(l.peak_breakdown(Category::activation), 512u);
  EXPECT_EQ(l.peak_breakdown(Category::param), 1024u);
  EXPECT_EQ(l.peak_bytes(Category::grad), 256u);
  auto snap = l.peak_snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_EQ(snap[0].owner, "m/a");
  EXPECT_EQ(snap[1].owner, "m/b");
  EXPECT_EQ(snap[2].owner, "m/c");
  (void)a;
  (void)d;
}

TEST(Ledger, SnapshotSurvivesCompaction) {
  Ledger full, compacted;
  compacted.set_history_limit(4);
  for (Ledger* l : {&full, &compacted}) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 10; i++)
      ids.push_back(l->on_alloc(size_t(i) * 256, 256, 256, Category::temp, "x", Phase::forward));
    for (int64_t id : ids) l->on_free(id);  // compaction happens during these frees
    for (int i = 0; i < 3; i++) l->on_alloc(size_t(i) * 256, 256, 256, Category::grad, "y", Phase::backward);
  }
  EXPECT_EQ(full.peak_snapshot().size(), 10u);
  EXPECT_EQ(compacted.peak_snapshot().size(), 10u);
  EXPECT_EQ(full.peak_bytes(), compacted.peak_bytes());
}

TEST(Ledger, ResetPeakStartsFromTheLiveState) {
  Ledger l;
  int64_t a = l.on_alloc(0, 256, 256, Category::param, "p", Phase::setup);
  int64_t b = l.on_alloc(256, 4096, 4096, Category::temp, "t", Phase::forward);
  l.on_free(b);
  l.reset_peak();
  EXPECT_EQ(l.peak_bytes(), 256u);
  EXPECT_EQ(l.peak_snapshot().size(), 1u);
  l.on_alloc(256, 512, 512, Category::temp, "u", Phase::forward);
  EXPECT_EQ(l.peak_bytes(), 768u);
  EXPECT_EQ(l.peak_snapshot().size(), 2u);
  (void)a;
}

TEST(Ledger, TensorsTagTheirBlocks) {
  auto dev = engine::Device::create(engine::DeviceType::meta, size_t(1) << 30);
  engine::DeviceGuard g(dev);
  {
    engine::MemoryScope s1("encoder");
    engine::MemoryScope s2("layer");
    engine::MemoryScope s3("3");
    engine::OpScope op("matmul");
    engine::PhaseScope ph(Phase::forward);
    engine::Tensor t = engine::Tensor::empty({10, 10});
    auto live = dev->ledger().live_blocks();
    ASSERT_EQ(live.size(), 1u);
    EXPECT_EQ(live[0].owner, "encoder.layer.3/matmul");
    EXPECT_EQ(live[0].phase, Phase::forward);
    EXPECT_EQ(live[0].requested, 400u);
    EXPECT_EQ(live[0].rounded, 512u);
    {
      engine::CategoryScope cs(Category::optimizer);
      engine::Tensor u = engine::Tensor::empty({1});
      EXPECT_EQ(dev->ledger().live_bytes(Category::optimizer), 256u);
    }
  }
  // Storage went back to the allocator when the last reference dropped.
  EXPECT_EQ(dev->ledger().live_bytes(), 0u);
  EXPECT_EQ(dev->allocator().allocated(), 0u);
}

TEST(Ledger, ExportsNameEveryCategoryAndPhase) {
  Ledger l;
  int64_t a = l.on_alloc(0, 256, 256, Category::param, "enc.layer.0.attn/matmul", Phase::setup);
  int64_t b = l.on_alloc(256, 256, 256, Category::activation, "enc.layer.1.attn/softmax", Phase::forward);
  l.on_free(b);
  std::string csv = l.events_csv();
  EXPECT_NE(csv.find("free"), std::string::npos);
  std::string md = l.peak_table_markdown(2);
  EXPECT_NE(md.find("| param |"), std::string::npos) << md;
  EXPECT_NE(md.find("| enc.layer |"), std::string::npos) << md;
  EXPECT_NE(md.find("| attn/softmax |"), std::string::npos) << md;
  (void)a;
}
