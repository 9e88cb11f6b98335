// max_batch.cpp: probes on fresh devices, the exponential + bisection search, and the report.
#include "tools/max_batch.h"

#include <algorithm>
#include <map>

#include "engine/format.h"
#include "engine/rng.h"
#include "models/registry.h"

namespace tools {

using engine::Category;
using engine::format_bytes;

namespace {

// What the search needs to know of a model before probing it: whether it counts tokens, and its default
// batch. Asked of the model itself, built once per (model, size, task) on a meta device (milliseconds).
struct ModelTraits {
  bool tokens = false;
  int64_t default_batch = 1;
  int64_t min_batch = 1;
  int64_t max_seq = 0, min_seq = 1;
};

const ModelTraits* model_traits(const models::ModelConfig& config) {
  // The unit belongs to the model; its default and smallest batch may change with its size and task, its longest
  // sequence with its positions (--positions) and the tokens it generates.
  static std::map<std::string, ModelTraits> by_model;
  const std::string key = engine::str(config.name, "|", config.size, "|", config.task, "|", config.dims.positions, "|",
                                      config.generate, "|", config.seq);
  auto it = by_model.find(key);
  if (it != by_model.end()) return &it->second;
  models::ModelConfig c;
  c.name = config.name;
  c.size = config.size;
  c.task = config.task;
  c.dims.positions = config.dims.positions;
  c.generate = config.generate;
  c.inference = config.inference;
  c.seq = config.seq;
  const engine::Generator saved_generator = engine::generator();
  ModelTraits t;
  try {
    engine::DeviceGuard guard(engine::Device::create(engine::DeviceType::meta, size_t(1) << 40));
    std::unique_ptr<models::Model> model = models::create_model(c);
    t.tokens = std::string(model->item_unit()) == "tok";
    t.default_batch = std::max<int64_t>(1, model->batch_size());
    t.min_batch = std::max<int64_t>(1, model->min_batch());
    t.max_seq = model->max_seq();
    t.min_seq = std::max<int64_t>(1, model->min_seq());
  } catch (const std::exception&) {  // a bad config: the first probe reports it, with its context
    engine::generator() = saved_generator;
    return nullptr;
  }
  engine::generator() = saved_generator;
  return &(by_model[key] = t);
}

// The config's model's trait `field`, or `fallback` when the config does not build (the first probe reports it).
template <typename T>
T trait(const models::ModelConfig& config, T ModelTraits::*field, T fallback) {
  const ModelTraits* t = model_traits(config);
  return t ? t->*field : fallback;
}

}  // namespace

bool counts_tokens(const models::ModelConfig& config) { return trait(config, &ModelTraits::tokens, false); }

int64_t first_probe(const models::ModelConfig& config) {
  const ModelTraits* t = model_traits(config);
  return t ? (t->tokens ? t->default_batch : t->min_batch) : 1;
}

int64_t min_batch(const models::ModelConfig& config) { return trait(config, &ModelTraits::min_batch, int64_t(1)); }
int64_t default_batch(const models::ModelConfig& config) {
  return trait(config, &ModelTraits::default_batch, int64_t(1));
}
int64_t max_seq(const models::ModelConfig& config) { return trait(config, &ModelTraits::max_seq, int64_t(0)); }
int64_t min_seq(const models::ModelConfig& config) { return trait(config, &ModelTraits::min_seq, int64_t(1)); }

void check_seq_search(const models::ModelConfig& config) {
  ENGINE_CHECK(models::model_takes(config.name, models::kSeq), "--find-max-seq: ", config.name,
               " has no sequence length (the models of one: ", models::models_taking(models::kSeq),
               "); --find-max-batch searches its batch");
}

namespace {

// The field of the config that the search sets (see max_batch.h): tokens for a model whose unit is "tok".
int64_t& batch_knob(models::ModelConfig& config) { return counts_tokens(config) ? config.tokens : config.batch; }

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// After a training probe: every trainable parameter of every optimizer has its state, or the model's
// probe_schedule() missed a step that trains it and the probe would have ended before the steady state.
void check_steady_state(models::Model& model, const std::vector<int64_t>& schedule) {
  for (ops::Optimizer* opt : model.optimizers()) {
    std::vector<std::string> missing = opt->params_without_state();
    if (missing.empty()) continue;
    std::string steps;
    for (int64_t s : schedule) steps += (steps.empty() ? "" : ", ") + std::to_string(s);
    throw engine::Error(engine::str(
        "after the probe's steps (", steps, ") ", missing.size(), " trainable parameter", missing.size() > 1 ? "s" : "",
        " of the ", opt->name(), " optimizer still ", missing.size() > 1 ? "have" : "has", " no state (first: ",
        missing[0], "): the model's probe_schedule() must include a step that trains every parameter, or the "
        "probe ends before the steady state"));
  }
}

}  // namespace

MaxBatchProbe probe_batch(const models::ModelConfig& config, engine::DeviceType type, size_t capacity, int64_t batch,
                          int steps, bool inference, bool whole_epoch, SearchAxis axis) {
  ENGINE_CHECK(batch >= 1 && steps >= 1, "max batch: a probe needs batch >= 1 and steps >= 1, got batch ", batch,
               " and ", steps, " steps");
  models::ModelConfig c = config;
  (axis == SearchAxis::seq ? c.seq : batch_knob(c)) = batch;
  c.inference = c.inference || inference;  // an eval-only model keeps no training state (Model::set_precision)
  MaxBatchProbe probe;
  probe.batch = batch;
  auto device = engine::Device::create(type, capacity);
  {
    engine::DeviceGuard guard(device);
    std::unique_ptr<models::Model> model;
    std::string worst;  // the batch whose step set the peak so far (whole_epoch)
    int64_t worst_step = 0;
    try {
      model = models::create_model(c);
      probe.unit = model->item_unit();
      probe.schedule = model->probe_schedule();
      ENGINE_CHECK(!probe.schedule.empty(), "max batch: ", config.name, "'s probe schedule is empty");
      while (int64_t(probe.schedule.size()) < steps) probe.schedule.push_back(probe.schedule.back() + 1);
      // Each step in turn (the schedule, then with whole_epoch every batch of an epoch); probe.worst_step is the
      // step running, named if it runs out of memory; the step that last raised the peak is the worst batch.
      size_t peak = 0;
      auto run = [&](int64_t step) {
        probe.worst_step = step;
        if (inference)
          model->eval_step(step);
        else
          model->train_step(step);
        if (whole_epoch && device->ledger().peak_bytes() > peak) {
          peak = device->ledger().peak_bytes();
          worst = model->describe_batch(step);
          worst_step = step;
        }
      };
      for (int64_t step : probe.schedule) run(step);
      if (!inference) check_steady_state(*model, probe.schedule);
      if (whole_epoch) {
        const std::vector<int64_t> epoch = model->epoch_steps();
        probe.epoch_batches = int64_t(epoch.size());
        for (int64_t step : epoch) run(step);
      }
      probe.worst_step = worst_step;
      probe.worst_batch = worst;
      probe.fits = true;
    } catch (const engine::OutOfMemory& e) {
      probe.failure = first_line(e.what());
      if (model && probe.worst_step > 0) probe.worst_batch = model->describe_batch(probe.worst_step);
    } catch (const std::exception& e) {  // not a memory verdict: a bug or a bad config, say where
      throw engine::Error(engine::str(
          axis == SearchAxis::seq ? "longest sequence: the probe at seq " : "max batch: the probe at batch ", batch,
          " failed: ", e.what()));
    }
  }  // the model is gone; the ledger keeps the counters
  const engine::Ledger& ledger = device->ledger();
  probe.peak = ledger.peak_bytes();
  for (int k = 0; k < engine::kNumCategories; k++) probe.breakdown[size_t(k)] = ledger.peak_breakdown(Category(k));
  return probe;
}

namespace {

// The probe of `batch` in a result, or null when none ran at it.
const MaxBatchProbe* probe_at(const MaxBatchResult& r, int64_t batch) {
  for (const auto& p : r.probes)
    if (p.batch == batch) return &p;
  return nullptr;
}

// Fills a result's unit, failure line and binding term from its probes, largest_fit and first_fail.
void finish_max_batch(MaxBatchResult& r) {
  r.unit.clear();
  for (const auto& p : r.probes)
    if (r.unit.empty()) r.unit = p.unit;
  if (r.unit.empty()) r.unit = "items";  // no probe got as far as building the model

  if (r.first_fail > 0) {
    const MaxBatchProbe* fail = probe_at(r, r.first_fail);
    const MaxBatchProbe* fit = probe_at(r, r.largest_fit);  // null when nothing fits: growth from zero
    r.failure = fail->failure;
    long double best = -1e30L;
    for (int k = 0; k < engine::kNumCategories; k++) {
      size_t before = fit ? fit->breakdown[size_t(k)] : 0, after = fail->breakdown[size_t(k)];
      long double growth = (long double)after - (long double)before;
      if (growth > best) {
        best = growth;
        r.binding = Category(k);
        r.binding_fit_bytes = before;
        r.binding_fail_bytes = after;
      }
    }
  }
}

}  // namespace

MaxBatchResult find_max_batch(const models::ModelConfig& asked, engine::DeviceType type, size_t capacity,
                              const MaxBatchOptions& options) {
  ENGINE_CHECK(options.steps >= 1 && options.limit >= 1, "max batch: steps and limit must be at least 1");
  models::ModelConfig config = asked;  // the model the probes build: eval-only under options.inference
  config.inference = config.inference || options.inference;
  // Every probe's model reseeds the engine's generator; the caller's stream continues as it was.
  const engine::Generator saved_generator = engine::generator();
  MaxBatchResult r;
  const bool seq = options.axis == SearchAxis::seq;
  if (seq) check_seq_search(config);
  const int64_t bound = seq ? max_seq(config) : 0;
  r.limit = bound > 0 ? std::min(options.limit, bound) : options.limit;
  auto run = [&](int64_t batch) {
    r.probes.push_back(probe_batch(config, type, capacity, batch, options.steps, options.inference, options.whole_epoch,
                                   options.axis));
    const MaxBatchProbe& p = r.probes.back();
    if (p.fits)
      r.largest_fit = std::max(r.largest_fit, batch);
    else if (r.first_fail == 0 || batch < r.first_fail)
      r.first_fail = batch;
    if (options.on_probe) options.on_probe(p, r.largest_fit, r.first_fail);
  };
  // Exponential phase: 1, 2, 4, ... (the last one clamped to the limit) until a probe fails; token budgets
  // start at the model's default (a budget shorter than a sentence makes no batch at all), sequences at 8 tokens.
  const int64_t first = seq ? std::max<int64_t>(8, min_seq(config)) : first_probe(config);
  for (int64_t b = std::min(first, r.limit); r.first_fail == 0 && r.largest_fit < r.limit; b = std::min(2 * b, r.limit))
    run(b);
  // Bisection phase: largest_fit fits, first_fail does not; nothing below the model's smallest batch is tried.
  const int64_t below = (seq ? min_seq(config) : min_batch(config)) - 1;
  auto lo = [&] { return std::max(r.largest_fit, below); };
  while (r.first_fail > 0 && r.first_fail - lo() > 1) run(lo() + (r.first_fail - lo()) / 2);
  engine::generator() = saved_generator;
  finish_max_batch(r);
  return r;
}

MicroBatchResult find_micro_batch(const models::ModelConfig& config, engine::DeviceType type, size_t capacity,
                                  int64_t global, const MaxBatchOptions& options) {
  ENGINE_CHECK(global >= 1, "--global-batch must be at least 1, got ", global);
  ENGINE_CHECK(config.accumulate == 1, "--global-batch chooses the micro-batch count itself: drop --accumulate");
  ENGINE_CHECK(!options.inference, "--global-batch is for training (gradient accumulation), not --inference");
  const engine::Generator saved_generator = engine::generator();
  MicroBatchResult r;
  r.global = global;
  r.whole = probe_batch(config, type, capacity, global, options.steps);
  if (r.whole.fits) {
    r.micro = global;
    r.accumulate = 1;
  } else if (global > 1) {
    models::ModelConfig micro = config;
    micro.accumulate = 2;
    MaxBatchOptions o = options;
    o.limit = global / 2;  // the largest proper divisor
    r.search = find_max_batch(micro, type, capacity, o);
    for (int64_t b = std::min(r.search.largest_fit, global / 2); b >= min_batch(config) && r.micro == 0; b--)
      if (global % b == 0) r.micro = b;
    if (r.micro > 0) {
      r.accumulate = global / r.micro;
      micro.accumulate = r.accumulate;
      r.check = probe_batch(micro, type, capacity, r.micro, options.steps);
      ENGINE_CHECK(r.check.fits, "max batch: ", r.accumulate, " micro-batches of ", r.micro,
                   " do not fit although 2 did; the accumulation's memory should not depend on the count (",
                   r.check.failure, ")");
    }
  }
  engine::generator() = saved_generator;
  return r;
}

std::string describe_micro_batch(const MicroBatchResult& r, size_t capacity, const MaxBatchOptions& options) {
  const std::string unit = r.whole.unit.empty() ? "items" : r.whole.unit;
  std::string o;
  if (r.accumulate == 1)
    return engine::str("global batch ", r.global, " ", unit, ": fits in one step (peak ", format_bytes(r.whole.peak),
                       ", arena ", format_bytes(capacity), "); no accumulation needed\n");
  o += engine::str("global batch ", r.global, " ", unit, ": one step does not fit (", r.whole.failure, ")\n");
  if (r.micro == 0) {
    o += engine::str("no micro-batch fits: not even ", r.search.first_fail > 0 ? r.search.first_fail : 1, " ", unit,
                     " with accumulation (arena ", format_bytes(capacity), ")\n");
  } else {
    o += engine::str("largest micro-batch: ", r.micro, " ", unit, " x ", r.accumulate, " = ", r.global,
                     unit == "tok" ? " (--tokens " : " (--batch ", r.micro, " --accumulate ", r.accumulate, "), peak ",
                     format_bytes(r.check.peak), " of ", format_bytes(capacity), "\n");
    if (r.search.largest_fit > r.micro)
      o += engine::str("(micro-batches up to ", r.search.largest_fit, " fit; ", r.micro,
                       " is the largest that divides ", r.global, ")\n");
  }
  if (!r.search.probes.empty())
    o += "\nthe search for the micro-batch, under accumulation:\n" + describe_max_batch(r.search, capacity, options);
  return o;
}

bool batches_vary(const models::ModelConfig& config) {
  auto device = engine::Device::create(engine::DeviceType::meta, size_t(1) << 40);
  engine::DeviceGuard guard(device);
  return !models::create_model(config)->epoch_steps().empty();
}

std::string describe_max_batch(const MaxBatchResult& r, size_t capacity, const MaxBatchOptions& options) {
  std::string o;
  size_t steps = size_t(options.steps);  // the model's schedule when it is longer (Model::probe_schedule)
  for (const MaxBatchProbe& p : r.probes) steps = std::max(steps, p.schedule.size());
  std::string what = engine::str(steps, options.inference ? " eval" : " training", " step", steps > 1 ? "s" : "",
                                 " per probe");
  // The searched value's words: a batch of r.unit (seq, img, tok), or a sequence of tokens.
  const bool seq = options.axis == SearchAxis::seq;
  const std::string noun = seq ? "seq" : "batch", unit = seq ? "tokens" : r.unit;
  const int64_t limit = r.limit ? r.limit : options.limit;
  const bool positions = seq && limit < options.limit;  // the model's learned positions bound the search
  if (r.first_fail == 0) {
    o += engine::str(seq ? "longest sequence" : "max batch", ": every ", noun, " up to ",
                     positions ? "the model's " : "the search limit ", limit, " ", positions ? "positions" : unit,
                     " fits (arena ", format_bytes(capacity), ", ", what, ")\n");
  } else if (r.largest_fit == 0) {
    o += engine::str(seq ? "longest sequence" : "max batch", ": not even a ", noun, " of ", r.first_fail, " ", unit,
                     " fits (arena ", format_bytes(capacity), ", ", what, ")\n");
  } else {
    o += engine::str(seq ? "longest sequence" : "max batch", ": ", r.largest_fit, " ", unit, " fit, ", r.first_fail,
                     " do not (arena ", format_bytes(capacity), ", ", what, ", ", r.probes.size(), " probes",
                     positions ? engine::str("; the model has ", limit, " positions") : "", ")\n");
  }
  if (r.first_fail > 0) {
    if (r.largest_fit > 0)
      o += engine::str("binding term: ", engine::category_name(r.binding),
                       " grew most: ", format_bytes(r.binding_fit_bytes), " at the peak of ", noun, " ", r.largest_fit,
                       " -> ", format_bytes(r.binding_fail_bytes), " at ", noun, " ", r.first_fail,
                       " before it failed\n");
    else
      o += engine::str("binding term: ", engine::category_name(r.binding),
                       " is the largest: ", format_bytes(r.binding_fail_bytes), " at ", noun, " ", r.first_fail,
                       " before it failed\n");
    o += engine::str("at ", noun, " ", r.first_fail, ": ", r.failure, "\n");
  }
  if (options.whole_epoch) {
    const MaxBatchProbe* fit = probe_at(r, r.largest_fit);
    const MaxBatchProbe* fail = probe_at(r, r.first_fail);
    const int64_t batches = fit ? fit->epoch_batches : fail ? fail->epoch_batches : 0;
    o += engine::str("whole epoch: each probe replayed every batch of one epoch after its schedule (", batches,
                     " batches at ", r.largest_fit, " ", r.unit, ")\n");
    if (fit && !fit->worst_batch.empty())
      o += engine::str("the worst batch at ", r.largest_fit, " ", r.unit, " (it set the peak, step ", fit->worst_step,
                       "): ", fit->worst_batch, "\n");
    if (fail && !fail->worst_batch.empty())
      o += engine::str("at ", r.first_fail, " ", r.unit, " the first batch that does not fit (step ", fail->worst_step,
                       "): ", fail->worst_batch, "\n");
  }
  // The probes, by batch: what each peak was made of.
  std::vector<MaxBatchProbe> sorted = r.probes;
  std::sort(sorted.begin(), sorted.end(),
            [](const MaxBatchProbe& a, const MaxBatchProbe& b) { return a.batch < b.batch; });
  o += "\n| " + noun + " | fits | peak |";
  for (int k = 0; k < engine::kNumCategories; k++) o += std::string(" ") + engine::category_name(Category(k)) + " |";
  o += "\n|---:|:---|---:|";
  for (int k = 0; k < engine::kNumCategories; k++) o += "---:|";
  o += "\n";
  for (const auto& p : sorted) {
    o += engine::str("| ", p.batch, " | ", p.fits ? "yes" : "no", " | ", format_bytes(p.peak), " |");
    for (int k = 0; k < engine::kNumCategories; k++) o += " " + format_bytes(p.breakdown[size_t(k)]) + " |";
    o += "\n";
  }
  return o;
}

}  // namespace tools
