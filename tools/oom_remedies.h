// oom_remedies.h: what to change when a config does not fit, ranked by its exact saving.
//
// When a training run runs out of memory (engine_train, any device), each lever the model accepts is tried on
// meta: every other --recompute mode, --attention flash, --precision bf16 (from fp32 / tf32), all the effective
// ones together, a smaller batch, a shorter sequence at the same batch (a model of one sequence length: the longest
// that fits, tools/max_batch.h's SearchAxis::seq), and the same global batch in micro-batches (--batch b
// --accumulate K: the largest b that divides it, tools::find_micro_batch; its "largest batch" is the largest
// micro-batch that fits under accumulation, a divisor or not). For each: the peak at the config's own batch (a meta
// run without a capacity limit: the exact bytes), the saving against the config's peak, whether it fits the arena (a
// probe in the arena's capacity, so fragmentation counts), and the largest batch that fits with it
// (tools/max_batch.h's search). A lever the model does not have (its constructor refuses it) or that changes nothing
// is left out.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/model.h"

namespace tools {

struct Remedy {
  std::string lever;  // the flags that change ("--recompute layer", "--batch 12")
  models::ModelConfig config;
  size_t peak = 0;        // at the config's batch (the smaller batch's or micro-batch's own for those levers)
  bool fits = false;      // in the arena's capacity
  int64_t max_batch = 0;  // the largest batch that fits with the lever (0: not even the smallest)
};

struct RemedyReport {
  size_t capacity = 0;
  size_t peak = 0;               // the failing config's peak without a limit
  std::string unit;              // "seq", "img", "tok"
  std::vector<Remedy> remedies;  // largest saving first; the smaller batch last
};

// `steps` training steps per measurement (at least the model's probe schedule). on_progress(done, total, what)
// is called as the measurements run.
RemedyReport oom_remedies(const models::ModelConfig& config, size_t capacity, int steps,
                          const std::function<void(int, int, const std::string&)>& on_progress = nullptr);

// A table, one line per remedy: lever, peak, saving, fits, largest batch, and the command to paste
// (`command_tail`: the run's device and arena flags, e.g. "--device cuda" or "--device meta --gpu titanrtx").
std::string remedies_markdown(const RemedyReport& r, const std::string& command_tail);

}  // namespace tools
