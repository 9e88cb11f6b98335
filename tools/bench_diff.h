// bench_diff.h: where two configs' peaks differ (engine_bench diff A -- B).
//
// Each config trains `steps` steps on a fresh meta device (exact allocations, no arithmetic); the blocks alive at
// its peak are grouped three ways, by category, by module and by layer type / op (the groupings of the peak
// tables, engine/ledger.h), and every group's bytes in A are set beside its bytes in B. A block at the peak is in
// exactly one group of each grouping and the peak is the sum of the blocks alive at it, so each table's
// differences add up to the difference of the two peaks, byte for byte. The moment of each peak is the
// allocation that set it (Ledger::peak_groups): its step, phase and owner (module path / op).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/model.h"

namespace tools {

struct PeakAccount {
  models::ModelConfig config;
  size_t peak = 0;  // live bytes at the peak (rounded, as the arena hands them out)
  int64_t peak_step = 0;
  std::string peak_phase, peak_owner;  // of the allocation that set the peak
  int module_depth = 0;                // where by_module cut the paths
  std::map<std::string, size_t> by_category, by_module, by_op;
};

// `steps` training steps of `config` on a fresh meta device; the module grouping cuts paths at `module_depth`
// dots (0: the model's own memory_report_depth()).
PeakAccount account_peak(const models::ModelConfig& config, int steps, int module_depth = 0);

struct DiffRow {
  std::string name;
  size_t a = 0, b = 0;
  int64_t delta() const { return int64_t(b) - int64_t(a); }
};

struct PeakDiff {
  PeakAccount a, b;
  int steps = 0;
  // Every group of either side, largest |delta| first (groups with no change last); each table's deltas sum to
  // b.peak - a.peak.
  std::vector<DiffRow> by_category, by_module, by_op;
};

// Both configs measured, the module depth being A's model's (the same for B, so that their paths compare).
PeakDiff diff_peaks(const models::ModelConfig& a, const models::ModelConfig& b, int steps);

// The config flags in which b differs from a ("--attention flash --seq 256"), for titles and file names.
std::string config_difference(const models::ModelConfig& a, const models::ModelConfig& b);

// A headline (the change of the peak, the two moments, the largest changes by op) and the three tables, at most
// `max_rows` changed rows each, the rest summed into one line so that every table still adds up.
std::string diff_markdown(const PeakDiff& d, size_t max_rows = 12);
std::string diff_json(const PeakDiff& d);

}  // namespace tools
