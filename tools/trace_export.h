// trace_export.h: a ledger's allocation history in the formats that existing viewers open.
//
// * Chrome trace JSON (chrome://tracing, ui.perfetto.dev): one counter track per ledger category
//   ("memory: activation", in MiB) and one for the total, slices per phase (thread "phase") and nested
//   slices per module scope and op (thread "module": encoder > layer.3 > attention > softmax), and an
//   instant event at the peak. The time axis is the allocation event number, not wall time: it is the
//   same on every device (meta included), so two runs' traces line up event for event.
// * PyTorch's memory_viz snapshot (what torch.cuda.memory._snapshot() returns, pickled): one segment
//   (the arena) with its blocks at the end of the run, and device_traces with alloc / free_requested /
//   free_completed events. Each block's frames name its owner (module path, op) and its category and
//   phase, so pytorch.org/memory_viz shows them where it would show a Python stack.
// Both read Ledger::history() (every block since the last compaction): the whole run unless it was
// longer than the ledger's history limit.
#pragma once
#include <string>

#include "engine/ledger.h"
#include "tools/pickle.h"

namespace tools {

// `process` names the trace's one process (e.g. "bert_base seq 128 x 32 on meta").
std::string chrome_trace_json(const engine::Ledger& ledger, const std::string& process, int module_depth = 4);

// The snapshot as a Python value: {"segments": [...], "device_traces": [[...]]}, and its pickle bytes.
PyValue memory_viz_snapshot(const engine::Ledger& ledger);
std::string memory_viz_pickle(const engine::Ledger& ledger);

}  // namespace tools
