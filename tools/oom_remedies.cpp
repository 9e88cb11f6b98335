// oom_remedies.cpp: each lever measured on meta against the arena's capacity.
#include "tools/oom_remedies.h"

#include <algorithm>

#include "engine/device.h"
#include "engine/format.h"
#include "models/registry.h"
#include "tools/config_flags.h"
#include "tools/max_batch.h"

namespace tools {

using engine::format_bytes;
using engine::str;

namespace {

constexpr size_t kUnbounded = size_t(1) << 40;  // meta without a limit: the exact peak, nothing refused

// The batch the config runs (its own when it names none), in the model's unit.
int64_t batch_of(const models::ModelConfig& c) {
  const int64_t given = counts_tokens(c) ? c.tokens : c.batch;
  return given > 0 ? given : default_batch(c);
}

models::ModelConfig with_batch(models::ModelConfig c, int64_t batch) {
  (counts_tokens(c) ? c.tokens : c.batch) = batch;
  return c;
}

// The unbounded peak of `c`, or 0 when the model refuses the config (a lever it does not have).
size_t peak_or_zero(const models::ModelConfig& c, int steps) {
  try {
    return probe_batch(c, engine::DeviceType::meta, kUnbounded, batch_of(c), steps).peak;
  } catch (const engine::OutOfMemory&) {
    throw;
  } catch (const engine::Error&) {
    return 0;
  }
}

struct Lever {
  std::string flags;
  std::function<void(models::ModelConfig&)> apply;
};

}  // namespace

RemedyReport oom_remedies(const models::ModelConfig& config, size_t capacity, int steps,
                          const std::function<void(int, int, const std::string&)>& on_progress) {
  RemedyReport r;
  r.capacity = capacity;
  const MaxBatchProbe base = probe_batch(config, engine::DeviceType::meta, kUnbounded, batch_of(config), steps);
  r.unit = base.unit;
  r.peak = base.peak;
  std::vector<Lever> levers;
  for (const char* mode : {"attention", "layer", "cell"})
    if (config.recompute != mode)
      levers.push_back({str("--recompute ", mode), [mode](models::ModelConfig& c) { c.recompute = mode; }});
  if (config.attention != "flash" && models::model_takes(config.name, models::kFlash))
    levers.push_back({"--attention flash", [](models::ModelConfig& c) { c.attention = "flash"; }});
  if (config.precision == "fp32" || config.precision == "tf32")
    levers.push_back({"--precision bf16", [](models::ModelConfig& c) { c.precision = "bf16"; }});
  const bool sequences = models::model_takes(config.name, models::kSeq);
  const int total = int(levers.size()) + 3 + (sequences ? 1 : 0);
  int done = 0;
  auto progress = [&](const std::string& what) {
    if (on_progress) on_progress(done++, total, what);
  };
  auto measure = [&](const std::string& flags, const models::ModelConfig& c, size_t peak) {
    Remedy m;
    m.lever = flags;
    m.config = c;
    m.peak = peak;
    m.fits = probe_batch(c, engine::DeviceType::meta, capacity, batch_of(c), steps).fits;
    MaxBatchOptions o;
    o.steps = steps;
    m.max_batch = find_max_batch(c, engine::DeviceType::meta, capacity, o).largest_fit;
    return m;
  };
  // Each lever alone; the effective ones (a saving) are kept, and the best recompute mode joins the others in
  // a combination.
  std::vector<const Lever*> effective;
  const Lever* best_recompute = nullptr;
  size_t best_recompute_peak = 0;
  for (const Lever& l : levers) {
    progress(l.flags);
    models::ModelConfig c = config;
    l.apply(c);
    const size_t peak = peak_or_zero(c, steps);
    if (peak == 0 || peak >= r.peak) continue;
    r.remedies.push_back(measure(l.flags, c, peak));
    if (l.flags.rfind("--recompute", 0) == 0) {
      if (!best_recompute || peak < best_recompute_peak) best_recompute = &l, best_recompute_peak = peak;
    } else {
      effective.push_back(&l);
    }
  }
  if (best_recompute) effective.insert(effective.begin(), best_recompute);
  progress("the levers together");
  if (effective.size() > 1) {
    models::ModelConfig c = config;
    std::string flags;
    for (const Lever* l : effective) {
      l->apply(c);
      flags += (flags.empty() ? "" : " ") + l->flags;
    }
    const size_t peak = peak_or_zero(c, steps);
    if (peak > 0) r.remedies.push_back(measure(flags, c, peak));
  }
  std::stable_sort(r.remedies.begin(), r.remedies.end(),
                   [](const Remedy& a, const Remedy& b) { return a.peak < b.peak; });
  // A smaller batch, no lever: the largest that fits.
  progress("a smaller batch");
  MaxBatchOptions o;
  o.steps = steps;
  const int64_t fit = find_max_batch(config, engine::DeviceType::meta, capacity, o).largest_fit;
  if (fit > 0 && fit < batch_of(config)) {
    const models::ModelConfig c = with_batch(config, fit);
    Remedy m;
    m.lever = str(counts_tokens(config) ? "--tokens " : "--batch ", fit);
    m.config = c;
    m.peak = peak_or_zero(c, steps);
    m.fits = true;
    m.max_batch = fit;
    r.remedies.push_back(m);
  }
  // A shorter sequence at the same batch, no lever: the longest that fits (a model of one sequence length).
  if (sequences) {
    progress("a shorter sequence");
    MaxBatchOptions longest = o;
    longest.axis = SearchAxis::seq;
    models::ModelConfig at_batch = with_batch(config, batch_of(config));
    at_batch.seq = 0;
    const int64_t seq = find_max_batch(at_batch, engine::DeviceType::meta, capacity, longest).largest_fit;
    if (seq > 0 && (config.seq == 0 || seq < config.seq)) {
      Remedy m;
      m.lever = str("--seq ", seq);
      m.config = at_batch;
      m.config.seq = seq;
      m.peak = peak_or_zero(m.config, steps);
      m.fits = true;
      m.max_batch = find_max_batch(m.config, engine::DeviceType::meta, capacity, o).largest_fit;
      r.remedies.push_back(m);
    }
  }
  // The same global batch in micro-batches (gradient accumulation), for a model that can accumulate.
  progress("micro-batches");
  models::ModelConfig whole = config;
  whole.accumulate = 1;
  const int64_t global = batch_of(config) * config.accumulate;
  MicroBatchResult micro;
  try {
    micro = find_micro_batch(whole, engine::DeviceType::meta, capacity, global, o);
  } catch (const engine::OutOfMemory&) {
    throw;
  } catch (const engine::Error&) {  // the model cannot accumulate: no such lever
  }
  if (micro.micro > 0 && micro.accumulate > 1 && micro.accumulate != config.accumulate) {
    models::ModelConfig c = with_batch(whole, micro.micro);
    c.accumulate = micro.accumulate;
    Remedy m;
    m.lever = str(counts_tokens(config) ? "--tokens " : "--batch ", micro.micro, " --accumulate ", micro.accumulate,
                  " (the global batch of ", global, ")");
    m.config = c;
    m.peak = micro.check.peak;
    m.fits = true;
    m.max_batch = micro.search.largest_fit;  // the largest micro-batch under accumulation (any count from two)
    r.remedies.push_back(m);
  }
  progress("done");
  return r;
}

std::string remedies_markdown(const RemedyReport& r, const std::string& command_tail) {
  std::string s = str("What would fit, measured on meta against this arena (", format_bytes(r.capacity),
                      "): this config's peak is ", format_bytes(r.peak),
                      r.peak > r.capacity ? " (" + format_bytes(r.peak - r.capacity) + " over)" : std::string(), ".\n");
  if (r.remedies.empty()) return s + "No lever of this model lowers its peak; give more --memory.\n";
  s += "| change | peak | saving | fits | largest batch that fits (" + r.unit +
       ") | command |\n"
       "|---|---:|---:|:-:|---:|---|\n";
  for (const Remedy& m : r.remedies) {
    const std::string saving = m.peak <= r.peak ? format_bytes(r.peak - m.peak) : "-" + format_bytes(m.peak - r.peak);
    s +=
        str("| ", m.lever, " | ", format_bytes(m.peak), " | ", saving, " | ", m.fits ? "yes" : "no", " | ", m.max_batch,
            " | `engine_train ", config_flags(m.config), command_tail.empty() ? "" : " ", command_tail, "` |\n");
  }
  return s;
}

}  // namespace tools
