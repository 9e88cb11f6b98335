// engine_bench_trace_test.cpp: the exports that existing viewers open: the Chrome trace (it parses, has a
// counter track per category whose last values are the ledger's live bytes, and phase and module slices
// that nest), the pickle writer (known bytes; python3 loads every kind of value), the memory_viz
// snapshot (python3's pickle loads it; it has the keys pytorch.org/memory_viz reads, its blocks tile the
// segment, and replaying its trace gives the blocks alive at the end), and the fork pool.
#include <gtest/gtest.h>

#include <map>

#include "engine/device.h"
#include "engine/json.h"
#include "models/registry.h"
#include "tests/tools/bench_test_util.h"
#include "tools/fork_pool.h"
#include "tools/pickle.h"
#include "tools/trace_export.h"

namespace {

using engine::json::Value;

// Two training steps of a tiny transformer_lm on a fresh meta device; the model is kept alive.
struct TinyRun {
  std::shared_ptr<engine::Device> device = engine::Device::create(engine::DeviceType::meta, size_t(1) << 30);
  std::unique_ptr<models::Model> model;
  TinyRun() {
    engine::DeviceGuard guard(device);
    models::ModelConfig c;
    c.name = "transformer_lm";
    c.size = "tiny";
    c.batch = 2;
    c.seq = 16;
    model = models::create_model(c);
    model->train_step(1);
    model->train_step(2);
  }
};

}  // namespace

TEST(BenchTrace, ChromeTraceHasACounterTrackPerCategoryAndNestedSlices) {
  TinyRun run;
  const engine::Ledger& l = run.device->ledger();
  std::string text = tools::chrome_trace_json(l, "tiny \"lm\"");
  Value trace = engine::json::parse_json(text, "trace");
  const Value& events = trace.at("traceEvents", "trace");
  std::map<std::string, double> last_counter;
  std::vector<const Value*> module_slices, phase_slices;
  bool named = false;
  for (const Value& e : events.items) {
    std::string ph = e.at("ph", "event").text, name = e.at("name", "event").text;
    if (ph == "C") last_counter[name] = e.at("args", "counter").at("MiB", "counter").number;
    if (ph == "X" && e.at("tid", "slice").number == 2) module_slices.push_back(&e);
    if (ph == "X" && e.at("tid", "slice").number == 1) phase_slices.push_back(&e);
    if (ph == "M" && name == "process_name") named = e.at("args", "meta").at("name", "meta").text == "tiny \"lm\"";
  }
  EXPECT_TRUE(named);
  // A track per category used, ending at the live bytes; and one for the total.
  for (int k = 0; k < engine::kNumCategories; k++) {
    engine::Category c = engine::Category(k);
    if (l.peak_bytes(c) == 0) continue;
    std::string track = std::string("memory: ") + engine::category_name(c);
    ASSERT_TRUE(last_counter.count(track)) << track;
    EXPECT_NEAR(last_counter[track], double(l.live_bytes(c)) / (1 << 20), 1e-3) << track;
  }
  EXPECT_NEAR(last_counter["memory: total"], double(l.live_bytes()) / (1 << 20), 1e-3);
  // Phases of a training step, in order.
  std::vector<std::string> phases;
  for (const Value* s : phase_slices) phases.push_back(s->at("name", "slice").text);
  ASSERT_GE(phases.size(), 4u);
  EXPECT_NE(std::find(phases.begin(), phases.end(), "backward"), phases.end());
  EXPECT_NE(std::find(phases.begin(), phases.end(), "optimizer"), phases.end());
  // Module slices: every slice lies inside any slice it overlaps whose path is a prefix of its own.
  ASSERT_FALSE(module_slices.empty());
  size_t nested = 0;
  for (const Value* a : module_slices)
    for (const Value* b : module_slices) {
      std::string pa = a->at("args", "s").at("path", "s").text, pb = b->at("args", "s").at("path", "s").text;
      if (pa.size() <= pb.size() || pa.compare(0, pb.size() + 1, pb + ".") != 0) continue;
      double a0 = a->at("ts", "s").number, a1 = a0 + a->at("dur", "s").number;
      double b0 = b->at("ts", "s").number, b1 = b0 + b->at("dur", "s").number;
      if (a1 <= b0 || b1 <= a0) continue;  // no overlap
      EXPECT_TRUE(b0 <= a0 && a1 <= b1) << pa << " [" << a0 << ", " << a1 << ") escapes " << pb << " [" << b0 << ", "
                                        << b1 << ")";
      nested++;
    }
  EXPECT_GT(nested, 0u) << "a layer's ops nest inside the layer";
}

TEST(BenchTrace, PickleWriterBytesAndPythonRoundTrip) {
  tools::PyValue d = tools::PyValue::dict();
  d.set("a", 1);
  EXPECT_EQ(tools::pickle_dumps(d), std::string("\x80\x02}(X\x01\x00\x00\x00" "aK\x01u.", 14));
  EXPECT_EQ(tools::pickle_dumps(tools::PyValue::list()), std::string("\x80\x02].", 4));
  EXPECT_THROW(tools::PyValue::list().set("x", 1), engine::Error);
  if (!testutil::have_python3()) GTEST_SKIP() << "python3 not found: the python round trip is not checked";
  tools::PyValue v = tools::PyValue::dict();
  tools::PyValue l = tools::PyValue::list();
  l.push(tools::PyValue()).push(true).push(false).push(0).push(255).push(256).push(-1).push(int64_t(-2147483648LL));
  l.push(int64_t(1) << 40).push(int64_t(-(int64_t(1) << 40))).push(1.5).push(-2.25e-300).push("héllo").push("");
  v.set("values", l).set("nested", tools::PyValue::dict().set("empty", tools::PyValue::dict()));
  testutil::TempDir dir;
  testutil::write_text(dir.file("v.pickle"), tools::pickle_dumps(v));
  auto [code, out] = testutil::python(
      dir,
      "import pickle, sys\n"
      "v = pickle.load(open(sys.argv[1], 'rb'))\n"
      "want = [None, True, False, 0, 255, 256, -1, -2147483648, 2**40, -2**40, 1.5, -2.25e-300, 'héllo', '']\n"
      "assert v['values'] == want, v['values']\n"
      "assert [type(x) for x in v['values']] == [type(x) for x in want]\n"
      "assert v['nested'] == {'empty': {}}, v['nested']\n"
      "print('ok')\n",
      dir.file("v.pickle"));
  EXPECT_EQ(code, 0) << out;
}

TEST(BenchTrace, MemoryVizSnapshotLoadsInPythonWithTheViewersKeys) {
  TinyRun run;
  const engine::Ledger& l = run.device->ledger();
  tools::PyValue snapshot = tools::memory_viz_snapshot(l);
  ASSERT_EQ(snapshot.members.size(), 2u);
  EXPECT_EQ(snapshot.members[0].first, "segments");
  EXPECT_EQ(snapshot.members[1].first, "device_traces");
  if (!testutil::have_python3()) GTEST_SKIP() << "python3 not found: the snapshot is not loaded";
  testutil::TempDir dir;
  testutil::write_text(dir.file("s.pickle"), tools::memory_viz_pickle(l));
  // What pytorch.org/memory_viz (torch/utils/viz/MemoryViz.js) reads: segments[].{device, address,
  // total_size, stream, blocks[].{size, requested_size, state, frames}} with the blocks tiling the segment
  // (it places each at the running sum), device_traces[device][].{action, addr, size, stream, frames}, a
  // free_requested directly followed by its free_completed, frames as {filename, line, name}.
  const std::string check = R"(
import pickle, sys
s = pickle.load(open(sys.argv[1], 'rb'))
assert set(s) == {'segments', 'device_traces'}, s.keys()
assert len(s['segments']) == 1 and len(s['device_traces']) == 1
seg = s['segments'][0]
for k in ('device', 'address', 'total_size', 'stream', 'blocks', 'allocated_size', 'active_size', 'segment_type'):
    assert k in seg, k
assert seg['device'] == 0
assert sum(b['size'] for b in seg['blocks']) == seg['total_size'], 'blocks must tile the segment'
def frames_ok(fs):
    return isinstance(fs, list) and all(set(f) == {'filename', 'line', 'name'} for f in fs)
active = {}
addr = seg['address']
for b in seg['blocks']:
    assert set(b) >= {'size', 'requested_size', 'state', 'frames'}, b.keys()
    assert b['state'] in ('active_allocated', 'inactive'), b['state']
    assert frames_ok(b['frames'])
    if b['state'] == 'active_allocated':
        assert b['requested_size'] <= b['size']
        active[addr] = b['size']
    addr += b['size']
trace = s['device_traces'][0]
assert trace[0]['action'] == 'segment_alloc' and trace[0]['size'] == seg['total_size']
live = {}
for i, e in enumerate(trace[1:], 1):
    assert set(e) >= {'action', 'addr', 'size', 'stream', 'frames'}, e.keys()
    assert frames_ok(e['frames'])
    assert seg['address'] <= e['addr'] and e['addr'] + e['size'] <= seg['address'] + seg['total_size']
    if e['action'] == 'alloc':
        assert e['addr'] not in live, 'two live blocks at one address'
        live[e['addr']] = e['size']
    elif e['action'] == 'free_requested':
        nxt = trace[i + 1]
        assert nxt['action'] == 'free_completed' and nxt['addr'] == e['addr'], nxt
    elif e['action'] == 'free_completed':
        assert live.pop(e['addr']) == e['size']
    else:
        raise AssertionError(e['action'])
assert live == active, 'replaying the trace must give the blocks alive at the end'
assert any(f['name'] == 'phase optimizer' for e in trace[1:] for f in e['frames'])
print('ok', len(trace), len(active))
)";
  auto [code, out] = testutil::python(dir, check, dir.file("s.pickle"));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("ok "), std::string::npos) << out;
  EXPECT_GT(l.live_blocks().size(), 0u) << "the model is alive: parameters and optimizer state";
}

TEST(ForkPool, RunsWorkInChildProcessesAndReportsFailures) {
  std::vector<std::string> results(5);
  int done = 0;
  tools::run_forked(
      5, 2,
      [](size_t i) { return std::string(i * 30000, char('a' + i)) + std::to_string(getpid()); },  // > a pipe's buffer
      [&](size_t i, const std::string& r) {
        results[i] = r;
        done++;
      });
  EXPECT_EQ(done, 5);
  for (size_t i = 0; i < 5; i++) {
    EXPECT_EQ(results[i].substr(0, i * 30000), std::string(i * 30000, char('a' + i)));
    EXPECT_NE(results[i].substr(i * 30000), std::to_string(getpid())) << "ran in a child";
  }
  try {
    tools::run_forked(3, 2, [](size_t i) -> std::string {
      if (i == 1) throw engine::Error("item one is bad");
      return "fine";
    }, [](size_t, const std::string&) {});
    FAIL() << "a failing item must be reported";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("item one is bad"), std::string::npos) << e.what();
  }
  std::vector<size_t> order;
  tools::run_forked(
      3, 1, [](size_t i) { return std::to_string(i); }, [&](size_t i, const std::string&) { order.push_back(i); });
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2})) << "jobs 1: here, in order";
  EXPECT_GE(tools::available_cpus(), 1);
}
