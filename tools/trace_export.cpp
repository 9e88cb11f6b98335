// trace_export.cpp: the Chrome trace and the memory_viz snapshot of a ledger (see trace_export.h).
#include "tools/trace_export.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <sstream>

#include "engine/json.h"

namespace tools {

using engine::BlockInfo;

namespace {

using Event = engine::LedgerEvent;

std::string scope_of(const std::string& owner) { return owner.substr(0, owner.find('/')); }
std::string op_of(const std::string& owner) {
  size_t slash = owner.find('/');
  return slash == std::string::npos ? "" : owner.substr(slash + 1);
}

// "encoder.layer.3.attention/softmax" -> {"encoder", "layer.3", "attention", "softmax"}: a layer index
// stays with its container's name; at most `depth` scope levels, then the op.
std::vector<std::string> owner_levels(const std::string& owner, int depth) {
  std::vector<std::string> levels;
  std::string scope = scope_of(owner);
  size_t start = 0;
  while (!scope.empty() && start <= scope.size()) {
    size_t dot = scope.find('.', start);
    std::string piece = scope.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !piece.empty() && std::all_of(piece.begin(), piece.end(), ::isdigit);
    if (digits && !levels.empty()) levels.back() += "." + piece;
    else if (!piece.empty()) levels.push_back(piece);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (int(levels.size()) > depth) levels.resize(size_t(depth));
  std::string op = op_of(owner);
  if (!op.empty()) levels.push_back(op);
  return levels;
}

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", double(bytes) / double(1 << 20));
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Chrome trace

std::string chrome_trace_json(const engine::Ledger& ledger, const std::string& process, int module_depth) {
  std::vector<BlockInfo> blocks = ledger.history();
  std::vector<Event> ev = engine::events_in_order(blocks);
  std::ostringstream os;
  os << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"time_axis\":\"allocation event number (1 event = 1 us)\"},"
        "\"traceEvents\":[\n";
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":" << engine::json::quote(process)
     << "}},\n";
  os << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"phase\"}},\n";
  os << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,\"args\":{\"name\":\"module\"}}";
  const int64_t end = ev.empty() ? 1 : ev.back().seq + 1;
  auto slice = [&](const std::string& name, int tid, int64_t ts, int64_t stop, const std::string& args) {
    os << ",\n{\"name\":" << engine::json::quote(name) << ",\"ph\":\"X\",\"pid\":1,\"tid\":" << tid << ",\"ts\":" << ts
       << ",\"dur\":" << std::max<int64_t>(stop - ts, 1) << (args.empty() ? "" : ",\"args\":" + args) << "}";
  };

  // Counter tracks, one per category and one for the total; the peak as an instant event.
  std::array<size_t, engine::kNumCategories> cur{};
  size_t total = 0, peak = 0;
  int64_t peak_seq = 0;
  for (const Event& e : ev) {
    int c = int(e.block->category);
    if (e.alloc) cur[size_t(c)] += e.block->rounded, total += e.block->rounded;
    else cur[size_t(c)] -= e.block->rounded, total -= e.block->rounded;
    if (total > peak) peak = total, peak_seq = e.seq;
    os << ",\n{\"name\":\"memory: " << engine::category_name(engine::Category(c)) << "\",\"ph\":\"C\",\"pid\":1,\"ts\":"
       << e.seq << ",\"args\":{\"MiB\":" << mib(cur[size_t(c)]) << "}}";
    os << ",\n{\"name\":\"memory: total\",\"ph\":\"C\",\"pid\":1,\"ts\":" << e.seq
       << ",\"args\":{\"MiB\":" << mib(total) << "}}";
  }
  if (!ev.empty())
    os << ",\n{\"name\":\"peak " << mib(peak)
       << " MiB\",\"ph\":\"i\",\"s\":\"g\",\"pid\":1,\"tid\":1,\"ts\":" << peak_seq << "}";

  // Slices from the allocations: the phase each was made in, and its owner's scopes and op, nested.
  std::vector<const Event*> allocs;
  for (const Event& e : ev)
    if (e.alloc) allocs.push_back(&e);
  for (size_t i = 0; i < allocs.size();) {
    size_t j = i;
    while (j < allocs.size() && allocs[j]->block->phase == allocs[i]->block->phase) j++;
    slice(engine::phase_name(allocs[i]->block->phase), 1, allocs[i]->seq, j < allocs.size() ? allocs[j]->seq : end, "");
    i = j;
  }
  std::vector<std::vector<std::string>> levels;
  size_t max_levels = 0;
  for (const Event* e : allocs) {
    levels.push_back(owner_levels(e->block->owner, module_depth));
    max_levels = std::max(max_levels, levels.back().size());
  }
  // A run at depth d: consecutive allocations whose first d + 1 levels agree. A run at depth d + 1 then
  // always lies inside one at depth d, so the viewer draws them nested.
  for (size_t d = 0; d < max_levels; d++) {
    auto key = [&](size_t i) {
      if (levels[i].size() <= d) return std::string();
      std::string k;
      for (size_t l = 0; l <= d; l++) k += (l ? "." : "") + levels[i][l];
      return k;
    };
    for (size_t i = 0; i < allocs.size();) {
      std::string k = key(i);
      size_t j = i + 1;
      while (j < allocs.size() && key(j) == k) j++;
      if (!k.empty())
        slice(levels[i][d], 2, allocs[i]->seq, j < allocs.size() ? allocs[j]->seq : end,
              "{\"path\":" + engine::json::quote(k) + "}");
      i = j;
    }
  }
  os << "\n]}\n";
  return os.str();
}

// ---------------------------------------------------------------------------------------------------
// memory_viz snapshot

namespace {

constexpr int64_t kArenaAddress = 0x7f0000000000;  // offsets shown as addresses in one plausible range

PyValue frames_of(const BlockInfo& b) {
  std::string scope = scope_of(b.owner), op = op_of(b.owner);
  PyValue owner = PyValue::dict(), tags = PyValue::dict();
  owner.set("filename", scope.empty() ? std::string("(no module)") : scope)
      .set("line", 0)
      .set("name", op.empty() ? std::string("(no op)") : op);
  tags.set("filename", std::string("category ") + engine::category_name(b.category))
      .set("line", 0)
      .set("name", std::string("phase ") + engine::phase_name(b.phase));
  PyValue frames = PyValue::list();
  frames.push(owner).push(tags);
  return frames;
}

PyValue trace_entry(const char* action, int64_t addr, size_t size, int64_t time, PyValue frames) {
  PyValue e = PyValue::dict();
  e.set("action", action)
      .set("addr", addr)
      .set("size", size)
      .set("stream", 0)
      .set("time_us", time)
      .set("frames", std::move(frames));
  return e;
}

}  // namespace

PyValue memory_viz_snapshot(const engine::Ledger& ledger) {
  std::vector<BlockInfo> blocks = ledger.history();
  std::vector<Event> ev = engine::events_in_order(blocks);
  size_t arena_end = ledger.high_water();
  for (const auto& b : blocks) arena_end = std::max(arena_end, b.offset + b.rounded);

  PyValue trace = PyValue::list();
  trace.push(trace_entry("segment_alloc", kArenaAddress, arena_end, 0, PyValue::list()));
  for (const Event& e : ev) {
    const BlockInfo& b = *e.block;
    int64_t addr = kArenaAddress + int64_t(b.offset);
    if (e.alloc) {
      trace.push(trace_entry("alloc", addr, b.rounded, e.seq, frames_of(b)));
    } else {  // the viewer merges a free_requested followed by its free_completed into one 'free'
      trace.push(trace_entry("free_requested", addr, b.rounded, e.seq, frames_of(b)));
      trace.push(trace_entry("free_completed", addr, b.rounded, e.seq, frames_of(b)));
    }
  }

  // The arena at the end: live blocks by offset, the gaps between them as inactive blocks (the viewer
  // places each block at the running sum of the sizes before it, so the list must tile the segment).
  std::vector<BlockInfo> live = ledger.live_blocks();
  std::sort(live.begin(), live.end(), [](const BlockInfo& a, const BlockInfo& b) { return a.offset < b.offset; });
  PyValue seg_blocks = PyValue::list();
  size_t at = 0, allocated = 0, requested = 0;
  auto gap = [&](size_t until) {
    if (until <= at) return;
    PyValue free_block = PyValue::dict();
    free_block.set("size", until - at).set("requested_size", size_t(0)).set("state", "inactive").set("frames",
                                                                                                    PyValue::list());
    seg_blocks.push(std::move(free_block));
    at = until;
  };
  for (const BlockInfo& b : live) {
    gap(b.offset);
    PyValue block = PyValue::dict();
    block.set("size", b.rounded).set("requested_size", b.requested).set("state", "active_allocated").set("frames",
                                                                                                         frames_of(b));
    seg_blocks.push(std::move(block));
    at = b.offset + b.rounded;
    allocated += b.rounded;
    requested += b.requested;
  }
  gap(arena_end);
  PyValue segment = PyValue::dict();
  segment.set("device", 0)
      .set("address", kArenaAddress)
      .set("total_size", arena_end)
      .set("allocated_size", allocated)
      .set("active_size", allocated)
      .set("requested_size", requested)
      .set("stream", 0)
      .set("segment_type", "large")
      .set("frames", PyValue::list())
      .set("blocks", std::move(seg_blocks));
  PyValue segments = PyValue::list(), traces = PyValue::list();
  segments.push(std::move(segment));
  traces.push(std::move(trace));
  PyValue snapshot = PyValue::dict();
  snapshot.set("segments", std::move(segments)).set("device_traces", std::move(traces));
  return snapshot;
}

std::string memory_viz_pickle(const engine::Ledger& ledger) { return pickle_dumps(memory_viz_snapshot(ledger)); }

}  // namespace tools
