// explain_test.cpp: engine_train --explain's table and the memory timeline (tools/explain.h) against the ledger:
// every allocation of a step listed once, the running live bytes equal to the ledger's at the end and at the peak,
// the reasons autograd recorded (what a backward saves), and a well-formed SVG whose peak is the ledger's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "engine/device.h"
#include "graph/autograd.h"
#include "models/registry.h"
#include "ops/batch_norm.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/reduce.h"
#include "tools/explain.h"

using engine::Category;
using engine::DeviceType;

TEST(Explain, EveryAllocationOfAStepOnceAndTheLiveBytesAddUp) {
  auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
  device->ledger().set_detail(true);
  engine::DeviceGuard guard(device);
  models::ModelConfig c;
  c.name = "transformer_lm";
  c.batch = 2;
  c.seq = 8;
  auto model = models::create_model(c);
  model->train_step(1);
  const int64_t from = device->ledger().sequence();
  const size_t live_before = device->ledger().live_bytes();
  const int64_t allocs_before = device->ledger().alloc_count();
  device->ledger().reset_peak();
  model->train_step(2);
  const std::vector<engine::BlockInfo> history = device->ledger().history();
  const std::vector<tools::ExplainRow> rows = tools::explain_rows(history, from, live_before);
  ASSERT_FALSE(rows.empty());
  std::set<int64_t> allocated, freed;
  size_t peak = live_before;
  for (const tools::ExplainRow& r : rows) {
    EXPECT_TRUE((r.alloc ? allocated : freed).insert(r.block->id).second) << "block " << r.block->id << " twice";
    EXPECT_FALSE(r.block->what.empty() && r.block->category != Category::workspace) << r.block->owner;
    peak = std::max(peak, r.live_after);
  }
  EXPECT_EQ(int64_t(allocated.size()), device->ledger().alloc_count() - allocs_before);
  EXPECT_EQ(rows.back().live_after, device->ledger().live_bytes());
  EXPECT_EQ(peak, device->ledger().peak_bytes()) << "the step's peak is the ledger's";
  const std::string md = tools::explain_markdown(device->ledger(), from, live_before, "step 2");
  size_t table_rows = 0;  // lines "| <n> | ...": one per event
  for (size_t at = md.find("\n| 1 | "); at != std::string::npos && at + 1 < md.size(); at = md.find("\n| ", at + 1))
    if (std::isdigit(static_cast<unsigned char>(md[at + 3]))) table_rows++;
  EXPECT_EQ(table_rows, rows.size()) << "one table line per event";
  EXPECT_NE(md.find(std::to_string(rows.size()) + " events (" + std::to_string(allocated.size()) + " allocations)"),
            std::string::npos)
      << md.substr(md.size() > 2000 ? md.size() - 2000 : 0);
  EXPECT_NE(md.find("saved by softmax for its backward"), std::string::npos);
  EXPECT_NE(md.find("the gradient of h.0.fc1.weight"), std::string::npos);
  EXPECT_NE(md.find("optimizer state of h.0.fc1.weight"), std::string::npos);
}

TEST(Explain, TheReasonIsWhatTheBackwardRuleSaved) {
  auto device = engine::Device::create(DeviceType::cpu, size_t(1) << 24);
  device->ledger().set_detail(true);
  engine::DeviceGuard guard(device);
  engine::Tensor x = ops::rand({64}, -1, 1).set_requires_grad(true);
  engine::Tensor y = ops::exp(x);       // exp's backward needs its output
  engine::Tensor z = ops::mul(y, 3.0);  // a scale's backward needs nothing
  const int64_t y_id = y.storage()->block.id, z_id = z.storage()->block.id;
  graph::backward(ops::sum(z));
  std::string y_reason, z_reason;
  for (const engine::BlockInfo& b : device->ledger().history()) {
    if (b.id == y_id) y_reason = tools::explain_why(b);
    if (b.id == z_id) z_reason = tools::explain_why(b);
  }
  EXPECT_NE(y_reason.find("saved by exp for its backward"), std::string::npos) << y_reason;
  EXPECT_NE(z_reason.find("a temporary"), std::string::npos) << z_reason;
}

// The scratch an op allocates for its GPU kernels (ops/op.h's new_workspace) says what it holds, on meta as on the
// GPU: a true-fp32 3x3 convolution of 64 channels (Winograd's workspace in each pass), a batch norm (its statistics'
// and gradients' partial sums).
TEST(Explain, AnOpsWorkspaceSaysWhatItHolds) {
  auto device = engine::Device::create(DeviceType::meta, size_t(1) << 30);
  device->ledger().set_detail(true);
  engine::DeviceGuard guard(device);
  const int64_t from = device->ledger().sequence();
  engine::Tensor x = ops::rand({2, 8, 8, 64}).set_requires_grad(true);
  engine::Tensor w = ops::rand({64, 3, 3, 64}).set_requires_grad(true);
  ops::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  engine::Tensor y = ops::conv2d(x, w, engine::Tensor(), p);
  engine::Tensor gamma = ops::ones({64}).set_requires_grad(true), beta = ops::zeros({64}).set_requires_grad(true);
  graph::backward(ops::sum(ops::batch_norm(y, gamma, beta, engine::Tensor(), engine::Tensor(), true, 0.1, 1e-5)));
  int winograd = 0, batch_norm = 0;
  for (const engine::BlockInfo& b : device->ledger().history()) {
    if (b.alloc_seq <= from) continue;
    const std::string why = tools::explain_why(b);
    const bool w =
        why.find("the GPU kernel's workspace: Winograd's transformed filters and tiles") != std::string::npos;
    const bool n = why.find("the GPU kernel's workspace: the statistics' means and M2s") != std::string::npos;
    if (w || n) {  // scratch: in the workspace category, and gone before the op's output is used
      EXPECT_EQ(b.category, Category::workspace) << why;
      EXPECT_NE(why.find(": freed when its op returns"), std::string::npos) << why;
      EXPECT_GE(b.free_seq, 0) << why;
      EXPECT_EQ(b.free_phase, b.phase) << why;
    }
    winograd += w;
    batch_norm += n;
  }
  EXPECT_EQ(winograd, 3) << "forward, data and weight gradient";
  EXPECT_EQ(batch_norm, 1);
}

TEST(Explain, TheTimelineIsWellFormedAndMarksTheLedgersPeak) {
  auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
  device->ledger().set_detail(true);
  engine::DeviceGuard guard(device);
  models::ModelConfig c;
  c.name = "bert_base";
  c.size = "tiny";
  auto model = models::create_model(c);
  const int64_t from = device->ledger().sequence();
  for (int64_t step = 1; step <= 2; step++) model->train_step(step);
  const std::string svg = tools::memory_timeline_svg(device->ledger(), from, "bert tiny");
  ASSERT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '<'), std::count(svg.begin(), svg.end(), '>'));
  EXPECT_NE(svg.find("(" + std::to_string(device->ledger().peak_bytes()) + " B)"), std::string::npos)
      << "the marked peak is the ledger's";
  for (const char* phase : {">forward<", ">backward<", ">optimizer<"}) EXPECT_NE(svg.find(phase), std::string::npos);
  for (const char* category : {">param<", ">grad<", ">optimizer<", ">activation<"})
    EXPECT_NE(svg.find(category), std::string::npos);
}

// The time axis: on cpu every allocation and free is stamped (the host clock; cuda's CUDA events are checked by
// ExplainCuda), in order and never backwards; meta refuses the clock.
TEST(Explain, TheTimelineInTimeStampsEveryEvent) {
  auto device = engine::Device::create(DeviceType::cpu, size_t(1) << 30);
  device->ledger().set_detail(true);
  engine::DeviceGuard guard(device);
  models::ModelConfig c;
  c.name = "transformer_lm";
  c.batch = 2;
  c.seq = 8;
  auto model = models::create_model(c);
  model->train_step(1);
  const int64_t from = device->ledger().sequence();
  const int64_t allocs_before = device->ledger().alloc_count();
  device->ledger().reset_peak();
  device->set_event_clock(true);
  model->train_step(2);
  const std::vector<std::pair<int64_t, double>> times = device->event_times();
  const int64_t allocs = device->ledger().alloc_count() - allocs_before;
  // Every allocation and free of the step stamped once; the step frees what it allocates bar what stays live.
  int64_t events = 0;
  for (const engine::BlockInfo& b : device->ledger().history()) events += (b.alloc_seq > from) + (b.free_seq > from);
  EXPECT_EQ(int64_t(times.size()), events);
  EXPECT_GE(int64_t(times.size()), allocs);
  for (size_t i = 1; i < times.size(); i++) {
    EXPECT_GT(times[i].first, times[i - 1].first);
    EXPECT_GE(times[i].second, times[i - 1].second);
  }
  const std::string svg = tools::memory_timeline_svg(device->ledger(), from, "lm on cpu", times);
  EXPECT_NE(svg.find("time on the device (ms; "), std::string::npos);
  EXPECT_NE(svg.find("(" + std::to_string(device->ledger().peak_bytes()) + " B)"), std::string::npos);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '<'), std::count(svg.begin(), svg.end(), '>'));
  auto meta = engine::Device::create(DeviceType::meta, size_t(1) << 30);
  try {
    meta->set_event_clock(true);
    ADD_FAILURE() << "meta has no time";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("allocation order"), std::string::npos) << e.what();
  }
}

// engine/README.md's exercises 2 and 3: BERT-Base at seq 512, batch 8, on meta.
TEST(Explain, TheExercisesAnswersHold) {
  auto peak_of = [](const char* attention, std::vector<engine::BlockInfo>* at_peak) {
    auto device = engine::Device::create(DeviceType::meta, size_t(1) << 40);
    device->ledger().set_detail(true);
    engine::DeviceGuard guard(device);
    models::ModelConfig c;
    c.name = "bert_base";
    c.seq = 512;
    c.batch = 8;
    c.attention = attention;
    auto model = models::create_model(c);
    for (int64_t step = 1; step <= 2; step++) model->train_step(step);
    if (at_peak) *at_peak = device->ledger().peak_snapshot();
    return device->ledger().peak_bytes();
  };
  std::vector<engine::BlockInfo> live;
  const size_t naive = peak_of("naive", &live), flash = peak_of("flash", nullptr);
  size_t largest = 0;
  for (const engine::BlockInfo& b : live)
    if (b.category == Category::activation) largest = std::max(largest, b.rounded);
  EXPECT_EQ(largest, size_t(8) * 12 * 512 * 512 * 4);
  int softmax = 0, dropout = 0;
  for (const engine::BlockInfo& b : live)
    if (b.category == Category::activation && b.rounded == largest) {
      const bool s = b.owner.find("/softmax") != std::string::npos, d = b.owner.find("/dropout") != std::string::npos;
      EXPECT_TRUE(s || d) << b.owner;
      softmax += s;
      dropout += d;
      if (s) {
        EXPECT_NE(b.reason.find("saved by softmax"), std::string::npos) << b.reason;
      }
      if (d) {
        EXPECT_NE(b.reason.find("saved by matmul"), std::string::npos) << b.reason;
      }
    }
  EXPECT_EQ(softmax, 12);
  EXPECT_EQ(dropout, 12);
  EXPECT_EQ(naive, 6393903104u);
  EXPECT_EQ(flash, 4018092032u);
}
