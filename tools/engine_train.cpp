// engine_train: train (or run) one registered model and report where its memory goes.
//
//   engine_train --model transformer_lm --size small --device meta --gpu rtx2080ti
//   engine_train --model transformer_lm --size small --device meta --gpu rtx2080ti --find-max-batch
//   engine_train --model bert_base --device meta --gpu rtx2080ti --batch 8 --find-max-seq
//   engine_train --model transformer_lm --steps 5 --save run.safetensors   (then --load run.safetensors)
//
// Prints a header (model, parameters, device, arena capacity), one line per step in a fixed format, and at
// the end the live memory at the peak by category, by module and by layer type. --find-max-batch instead
// searches the largest batch that fits, --find-max-seq the longest sequence at the batch (tools/max_batch.h);
// --save/--load write and resume checkpoints (tools/checkpoint.h). Errors (unknown model or flag, impossible shape,
// out of memory) are reported as one clear message and a non-zero exit status (3 for out of memory); a training
// step that runs out of memory adds the step and what would fit, each lever measured on meta
// (tools/oom_remedies.h).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/context.h"
#include "engine/counters.h"
#include "engine/device.h"
#include "engine/dist.h"
#include "engine/format.h"
#include "engine/io.h"
#include "engine/json.h"
#include "engine/safetensors.h"
#include "models/registry.h"
#include "ops/profile.h"
#include "tools/checkpoint.h"
#include "tools/config_flags.h"
#include "tools/explain.h"
#include "tools/flags.h"
#include "tools/gpu_profiles.h"
#include "tools/max_batch.h"
#include "tools/oom_remedies.h"
#include "tools/progress.h"
#include "tools/trace_export.h"
#include "tools/world.h"

namespace {

using engine::format_bytes;
using engine::format_fixed;
using engine::str;

std::string joined_model_names() {
  std::string s;
  for (const auto& n : models::model_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

size_t default_capacity(engine::DeviceType type, std::string* note) {
  if (type == engine::DeviceType::cpu) {  // an arena larger than the memory it may use would only swap or die
    std::string why;
    const size_t limit = engine::cpu_memory_limit(&why);
    *note = " (" + why + ")";
    return limit;
  }
  if (type == engine::DeviceType::cuda) return 0;  // the device's free memory less a library reserve
  return size_t(1) << 40;  // meta without --memory: 1 TiB, i.e. "measure the peak, nothing is refused"
}

// Arena capacity: --memory, a --gpu profile's memory less its reserve, or the device's default.
size_t arena_capacity(const tools::Flags& flags, engine::DeviceType type, std::string* note) {
  ENGINE_CHECK(!(flags.given("gpu") && flags.given("memory")), "engine_train: give --gpu or --memory, not both "
               "(--gpu ", flags.str("gpu"), " already sets the arena to that card's memory less its reserve)");
  if (flags.given("gpu")) {
    const tools::GpuProfile& gpu = tools::find_gpu_profile(flags.str("gpu"));
    *note = engine::str(" (gpu ", gpu.name, ": ", gpu.memory_mib, " MiB less a ", gpu.reserve_mib, " MiB reserve)");
    return tools::gpu_arena_capacity(gpu);
  }
  return flags.given("memory") ? engine::parse_bytes(flags.str("memory")) : default_capacity(type, note);
}

// The last step's kernel time by op, beside the op's counted FLOPs and bytes (engine/counters.h).
// cuda: also the GPU's idle time before each op's kernels (ops/profile.h), the largest waits named.
std::string profile_table(const std::vector<ops::KernelTime>& times, double step_ms, bool cuda) {
  double total = 0, idle = 0;
  for (const auto& t : times) total += t.ms, idle += t.idle_ms;
  std::string s = engine::str("## Time by op (last step: ", format_fixed(step_ms, 1), " ms wall, ",
                              format_fixed(total, 1), " ms in kernels");
  if (cuda) {
    std::vector<ops::KernelTime> waits = times;
    std::sort(waits.begin(), waits.end(), [](const auto& a, const auto& b) { return a.idle_ms > b.idle_ms; });
    s += engine::str(", ", format_fixed(idle, 1), " ms with the GPU idle between them; the longest waits before ");
    for (size_t i = 0; i < std::min<size_t>(4, waits.size()); i++)
      s += engine::str(i ? ", " : "", waits[i].op, " ", format_fixed(waits[i].idle_ms, 2), " ms");
  }
  s += cuda ? ")\n\n| op | kernels | ms | share of step | TFLOP/s | GB/s | GPU idle before (ms) |\n"
              "|---|---:|---:|---:|---:|---:|---:|\n"
            : ")\n\n| op | kernels | ms | share of step | TFLOP/s | GB/s |\n|---|---:|---:|---:|---:|---:|\n";
  for (const auto& t : times) {
    auto it = engine::counters().by_op.find(t.op);
    const double flops = it == engine::counters().by_op.end() ? 0 : it->second.flops;
    const double bytes = it == engine::counters().by_op.end() ? 0 : it->second.bytes;
    const double sec = t.ms / 1e3;
    s += engine::str("| ", t.op, " | ", t.kernels, " | ", format_fixed(t.ms, 2), " | ",
                     format_fixed(100 * t.ms / step_ms, 1), "% | ",
                     flops > 0 && sec > 0 ? format_fixed(flops / sec / 1e12, 1) : std::string("-"), " | ",
                     bytes > 0 && sec > 0 ? format_fixed(bytes / sec / 1e9, 0) : std::string("-"), " |",
                     cuda ? " " + format_fixed(t.idle_ms, 2) + " |\n" : std::string("\n"));
  }
  return s;
}

// The last step's largest (module, op) times: which layer's forward or backward costs the most, beside that
// layer's counted FLOPs (engine::Counters::by_module_op).
std::string module_time_table(const std::vector<ops::KernelTime>& by_module, double step_ms, int64_t rows) {
  const size_t shown = rows > 0 ? std::min(size_t(rows), by_module.size()) : by_module.size();
  std::string s = engine::str("## Time by module (the ", shown, " largest of ", by_module.size(),
                              " module and op pairs)\n\n| module | op | kernels | ms | share of step | TFLOP/s |\n"
                              "|---|---|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < shown; i++) {
    const ops::KernelTime& t = by_module[i];
    auto it = engine::counters().by_module_op.find(t.module + "/" + t.op);
    const double flops = it == engine::counters().by_module_op.end() ? 0 : it->second.flops;
    const double sec = t.ms / 1e3;
    s += engine::str("| ", t.module.empty() ? std::string("(top level)") : t.module, " | ", t.op, " | ", t.kernels,
                     " | ", format_fixed(t.ms, 2), " | ", format_fixed(100 * t.ms / step_ms, 1), "% | ",
                     flops > 0 && sec > 0 ? format_fixed(flops / sec / 1e12, 1) : std::string("-"), " |\n");
  }
  return s;
}

// Why a run stopped on a non-finite loss: the step, every loss term, the first parameter the update left
// non-finite, what was not written, and what to try.
std::string non_finite_report(int64_t step, const models::StepResult& r, models::Model& model, const std::string& save,
                              const std::string& export_hf) {
  std::string terms;
  for (const auto& [name, v] : r.losses) terms += engine::str(terms.empty() ? "" : ", ", name, " ", v);
  const std::string param = models::first_non_finite_parameter(model.module());
  return engine::str("step ", step, ": the loss is not finite (", terms, "); training stopped",
                     save.empty() && export_hf.empty() ? "" : ", and nothing was saved (--save / --export-hf)", ". ",
                     param.empty() ? std::string("Every parameter is still finite")
                                   : "The first parameter the update made non-finite: " + param,
                     ". Try a lower learning rate, --precision fp32 (or fp16, whose loss scaling skips such steps), "
                     "or look for bad values in the data");
}

// --profile on meta: no kernel runs, so there is no time; the last step's counted work by op instead.
std::string work_table() {
  std::vector<std::pair<std::string, engine::OpCount>> ops(engine::counters().by_op.begin(),
                                                           engine::counters().by_op.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.flops > b.second.flops; });
  double flops = 0;
  for (const auto& [op, c] : ops) flops += c.flops;
  std::string s = engine::str(
      "## Work by op (last step; meta runs no kernels, so there is no time to show: run on cuda or "
      "cpu for times)\n\n| op | GFLOP | share | GB moved |\n|---|---:|---:|---:|\n");
  for (const auto& [op, c] : ops)
    s += engine::str("| ", op, " | ", format_fixed(c.flops / 1e9, 2), " | ",
                     flops > 0 ? format_fixed(100 * c.flops / flops, 1) + "%" : std::string("-"), " | ",
                     format_fixed(c.bytes / 1e9, 3), " |\n");
  return s;
}

// --find-max-batch, or --find-max-seq (axis seq: the longest sequence at the config's batch).
int find_max_batch(const models::ModelConfig& config, const tools::Flags& flags, engine::DeviceType type,
                   size_t capacity, const std::string& capacity_note, tools::SearchAxis axis) {
  const bool seq = axis == tools::SearchAxis::seq;
  const char* flag = seq ? "--find-max-seq" : "--find-max-batch";
  ENGINE_CHECK(type != engine::DeviceType::meta || flags.given("gpu") || flags.given("memory"), "engine_train ", flag,
               " on meta: give --gpu NAME or --memory SIZE (the default meta arena of 1 TiB never fills)");
  ENGINE_CHECK(
      !flags.given("save") && !flags.given("load") && !flags.given("export-hf") && !flags.given(seq ? "seq" : "batch"),
      "engine_train ", flag, " chooses the ", seq ? "sequence length" : "batch", " itself and trains nothing: drop ",
      seq ? "--seq" : "--batch", ", --save, --export-hf and --load");
  ENGINE_CHECK(!seq || !flags.given("global-batch"), "engine_train --find-max-seq runs at --batch (or the model's ",
               "batch); --global-batch is a question for --find-max-batch");
  if (seq) tools::check_seq_search(config);
  tools::MaxBatchOptions options;
  options.axis = axis;
  options.steps = int(std::max<int64_t>(2, flags.given("steps") ? flags.integer("steps") : 2));
  options.inference = flags.on("inference");
  // With --data, a model whose batches differ in shape answers for the worst batch of an epoch.
  options.whole_epoch = !config.data.empty() && tools::batches_vary(config);
  tools::ProgressBar bar(seq ? "longest sequence" : "max batch", 0);
  int probes = 0;
  options.on_probe = [&](const tools::MaxBatchProbe& p, int64_t fit, int64_t fail) {
    bar.update(++probes, engine::str(seq ? "seq " : "batch ", p.batch, p.fits ? " fits" : " does not fit", " | fits ",
                                     fit, fail ? engine::str(", fails ", fail) : std::string()));
  };
  const std::string at_batch =
      seq ? engine::str(" at batch ", config.batch ? config.batch : tools::default_batch(config)) : std::string();
  std::printf("%s of %s%s on %s, arena %s%s\n", seq ? "longest sequence" : "max batch", config.name.c_str(),
              at_batch.c_str(), engine::device_type_name(type), format_bytes(capacity).c_str(), capacity_note.c_str());
  if (flags.given("global-batch")) {
    const tools::MicroBatchResult r =
        tools::find_micro_batch(config, type, capacity, flags.integer("global-batch"), options);
    bar.clear();
    std::printf("%s", tools::describe_micro_batch(r, capacity, options).c_str());
    return 0;
  }
  tools::MaxBatchResult r = tools::find_max_batch(config, type, capacity, options);
  bar.clear();
  std::printf("%s", tools::describe_max_batch(r, capacity, options).c_str());
  return 0;
}

void add_flags(tools::Flags& flags) {
  flags.add_string("model", "", "model to run (required unless --load names it): " + joined_model_names());
  flags.add_string("size", "", "model size (the model's default when empty)");
  flags.add_int("seq", 0, "sequence length (0: the model's default)");
  flags.add_int("batch", 0, "batch size in sequences or images (0: the model's default)");
  flags.add_int("tokens", 0, "batch size in tokens, for translation models (0: the model's default)");
  flags.add_int("steps", 10, "steps to run (after --load: steps to run beyond the saved one)");
  flags.add_choice("device", "cpu", {"cpu", "meta", "cuda"}, "where to run; meta allocates but computes nothing");
  flags.add_string("memory", "",
                   "arena capacity, e.g. 24GB (default: on cpu the physical memory or the cgroup limit, less a tenth; "
                   "1 TiB on meta)");
  flags.add_string("gpu", "", "arena capacity of a named card (its memory less a context reserve): " +
                                  tools::gpu_profile_names());
  flags.add_choice("attention", "naive", {"naive", "flash"}, "attention algorithm");
  flags.add_choice("recompute", "none", {"none", "attention", "layer", "cell"},
                   "activation checkpointing (the models say which modes they have: cell is NASNet's)");
  flags.add_choice("precision", "fp32", {"fp32", "tf32", "bf16", "fp16"},
                   "fp32; tf32 GEMMs; bf16/fp16 mixed precision with f32 master weights (fp16: loss scaling)");
  tools::add_shape_flags(flags);
  flags.add_int("seed", 1, "random seed (weights, data, dropout)");
  flags.add_string("data", "", "data file (synthetic data when empty)");
  flags.add_string("task", "", "task of a multi-task model (the model's default when empty)");
  flags.add_string("backbone", "", "backbone variant of a vision model (maskrcnn: r50, r101; the model's when empty)");
  flags.add_string("batch-file", "",
                   "a safetensors file holding one batch (the names and dtypes of the model's own batches) that every "
                   "step reads instead of the model's data; the loss is then also printed to 10 digits (parity runs)");
  flags.add_bool("inference",
                 "run eval steps (forward only, no gradients, eval mode, no optimizer state) instead of "
                 "training");
  flags.add_int("generate", 0,
                "with --inference, for transformer_lm: decode this many tokens per step after the "
                "--seq-token prompts (a prefill, then one token per step, KV cache)");
  flags.add_int("prefill-tokens", 8192,
                "with --generate: prompt tokens per prefill pass, whole sequences (0: every prompt in one pass)");
  flags.add_bool("profile", "time every kernel (CUDA events on cuda) and print the last step's time by op, "
                            "with its achieved TFLOP/s and GB/s, then the largest times by module and op");
  flags.add_int("profile-rows", 30, "with --profile: how many of the largest (module, op) times to list (0: all)");
  flags.add_bool("explain",
                 "after the run, the last step's every allocation and free in order, each with its tensor, "
                 "category and why it exists and when it died, then the step's peak (small configs)");
  flags.add_bool("find-max-batch", "find the largest batch that fits the arena (2 steps per probe) and stop");
  flags.add_bool("find-max-seq",
                 "find the longest sequence that fits the arena at --batch (the model's batch when not given; models "
                 "of one sequence length: " +
                     models::models_taking(models::kSeq) + ") and stop");
  flags.add_int("accumulate", 1, "gradient accumulation: micro-batches of --batch per optimizer step");
  flags.add_int("r1-every", 1,
                "stylegan: the R1 penalty on every N-th D step only, weighted N (StyleGAN2's lazy regularization)");
  flags.add_int("global-batch", 0,
                "with --find-max-batch: the largest micro-batch for this global batch (the whole "
                "batch in one step if it fits, else micro-batches with --accumulate)");
  flags.add_string("save", "", "write a checkpoint (weights, optimizer state, step, RNG) after the last step");
  flags.add_string("load", "", "start from a checkpoint: an engine one resumes exactly; a Hugging Face one "
                               "gives the weights");
  flags.add_string("export-hf", "",
                   "after the last step, write DIR/model.safetensors (weights only) and DIR/config.json "
                   "for Hugging Face transformers (bert_base: BertForPreTraining, bert_squad: "
                   "BertForQuestionAnswering), loadable with from_pretrained(DIR)");
  flags.add_string("trace", "", "write the allocation timeline as Chrome trace JSON (opens in Perfetto)");
  flags.add_string("timeline", "",
                   "write the last step's memory timeline as SVG: live bytes by category, phases shaded, the peak "
                   "marked");
  flags.add_choice("timeline-axis", "events", {"events", "time"},
                   "the timeline's x axis: allocation order, or the device's time (cpu: the host clock; cuda: CUDA "
                   "events on the engine's stream; not on meta)");
  flags.add_string("report", "", "write the run's header, step lines and memory tables as markdown");
  tools::add_world_flags(flags);
  flags.add_string("json", "", "write the run as JSON: config, header, every step, the peak (its moment, by "
                               "category, module and op); tools/README.md shows an example");
}

models::ModelConfig config_of(const tools::Flags& flags) {
  ENGINE_CHECK(flags.integer("steps") >= 1, "engine_train: --steps must be at least 1");
  ENGINE_CHECK(flags.integer("profile-rows") >= 0, "engine_train: --profile-rows must be 0 (all) or more, got ",
               flags.integer("profile-rows"));
  ENGINE_CHECK(flags.integer("batch") >= 0 && flags.integer("seq") >= 0 && flags.integer("tokens") >= 0,
               "engine_train: --batch, --seq and --tokens must be positive");
  models::ModelConfig config;
  config.name = flags.str("model");
  config.size = flags.str("size");
  config.seq = flags.integer("seq");
  config.batch = flags.integer("batch");
  config.tokens = flags.integer("tokens");
  config.attention = flags.str("attention");
  config.recompute = flags.str("recompute");
  config.precision = flags.str("precision");
  config.data = flags.str("data");
  config.task = flags.str("task");
  config.backbone = flags.str("backbone");
  tools::read_shape_flags(flags, config);
  config.accumulate = flags.integer("accumulate");
  config.r1_every = flags.integer("r1-every");
  config.generate = flags.integer("generate");
  config.prefill_tokens = flags.integer("prefill-tokens");
  config.inference = flags.on("inference");
  ENGINE_CHECK(config.generate >= 0, "engine_train: --generate must be positive");
  ENGINE_CHECK(!flags.given("prefill-tokens") || config.generate > 0,
               "engine_train: --prefill-tokens sizes the prompt passes of --generate N (with --inference); without "
               "--generate there is no prefill");
  ENGINE_CHECK(!flags.given("global-batch") || flags.on("find-max-batch"),
               "engine_train: --global-batch is a question for --find-max-batch (to train with it, give --batch B "
               "--accumulate K with B x K = the global batch)");
  config.seed = uint64_t(flags.integer("seed"));
  return config;
}

// What the run prints, also kept for --report; a line clears the progress bar first.
class Transcript {
 public:
  Transcript(const char* what, int64_t steps) : bar_(what, steps) {}
  void say(const std::string& line) {
    bar_.clear();
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    text_ += line + "\n";
  }
  void progress(int64_t done, const std::string& note) { bar_.update(done, note); }
  const std::string& text() const { return text_; }

 private:
  tools::ProgressBar bar_;
  std::string text_;
};

// The line under the model's summary: parameters, precision, device, arena and where its size came from.
// "adamw", or one name per optimizer ("adam + adam" for a GAN's G and D).
std::string optimizer_names(models::Model& model) {
  std::string names;
  for (ops::Optimizer* o : model.optimizers()) names += (names.empty() ? "" : " + ") + std::string(o->name());
  return names;
}

std::string header_line(models::Model& model, const engine::Device& device, const std::string& capacity_note,
                        bool inference) {
  const bool meta = device.type() == engine::DeviceType::meta;
  return engine::str("parameters ", model.module().num_parameters(), " (",
                     format_bytes(device.ledger().live_bytes(engine::Category::param)), ") | precision ",
                     models::precision_name(model.precision()), " | optimizer ",
                     inference ? "none (inference)" : optimizer_names(model), " | device ", device.name(), " | arena ",
                     format_bytes(device.capacity()), capacity_note,
                     device.outside_arena() > 0 ? " | outside the arena: " + format_bytes(device.outside_arena()) +
                                                      " (CUDA context and libraries, before the arena)"
                                                : std::string(),
                     meta ? " | meta: shapes and allocations only, no arithmetic" : "",
                     inference ? " | inference: forward only, eval mode" : "");
}

// The whole device beside the arena. cuda: what cudaMemGetInfo counts now (after the run: the kernels' module
// images load on their first launch), split into what the device's creation measured before the arena, the arena
// (one cudaMalloc of its capacity) and what came since. meta with --gpu: the prediction for a card whose arena is
// sized to this run's high water: that high water plus the profile's reserve (tools/gpu_profiles.h).
std::string whole_device(engine::Device& device, const tools::Flags& flags) {
  if (device.type() == engine::DeviceType::cuda) {
    device.synchronize();
    const size_t used = device.device_memory_used(), before = device.outside_arena();
    std::string stages;
    for (const auto& [what, bytes] : device.outside_stages())
      stages += engine::str(stages.empty() ? "" : ", ", what, " ", format_bytes(bytes));
    const size_t since = used > before + device.capacity() ? used - before - device.capacity() : 0;
    return engine::str("## The whole device\nIn use now by cudaMemGetInfo: ", format_bytes(used), " (", used,
                       " B) = before the arena ", format_bytes(before), " (", stages, ") + the arena ",
                       format_bytes(device.capacity()), " + since the arena ", format_bytes(since), " (", since,
                       " B: kernel images loaded on first launch, libraries' lazy state). Outside the arena in all: ",
                       format_bytes(used - device.capacity()), " (", used - device.capacity(), " B).\n");
  }
  if (device.type() == engine::DeviceType::meta && flags.given("gpu")) {
    const tools::GpuProfile& gpu = tools::find_gpu_profile(flags.str("gpu"));
    const size_t outside = size_t(gpu.outside_mib) << 20, high = device.ledger().high_water();
    return engine::str("## The whole device, predicted\nOn ", gpu.name, ": cudaMemGetInfo would count ",
                       format_bytes(device.capacity() + outside), " in use (", device.capacity() + outside,
                       " B) = the arena's cudaMalloc ", format_bytes(device.capacity()), " + ", gpu.outside_mib,
                       " MiB outside it (context, cuBLASLt, kernels; tools/gpu_profiles.cpp says where measured). "
                       "An arena of just this run's high water, ",
                       format_bytes(high), " (", high, " B), would make it ", format_bytes(high + outside), ".\n");
  }
  return "";
}

// The GPU's dense peak in the model's precision, for MFU (0: not a known GPU): the step's model FLOPs (counted
// by every op, backward included) over its time, over this peak (fp32 CUDA cores, or TF32/BF16/FP16 tensor cores).
double peak_tflops_of(const engine::Device& device, const models::Model& model) {
  for (const auto& gpu : tools::gpu_profiles())
    if (!device.product().empty() && device.product() == gpu.product)
      return tools::gpu_peak_tflops(gpu, models::precision_name(model.precision()));
  return 0;
}

// One step line as numbers (NaN: not measured: meta's loss and speed, a generation step's loss).
struct StepRecord {
  int64_t step = 0;
  double loss = 0, ms = 0, items_per_second = 0;
  size_t peak_bytes = 0;
  std::string ranks_json;  // a data-parallel world's step over its ranks (ranks_json); "" for one process
};

struct RunOptions {
  int64_t first = 1, last = 1;
  int64_t* running = nullptr;  // set to each step as it starts (the step an out-of-memory report names)
  std::vector<StepRecord>* records = nullptr;  // each step's line, as numbers (--json)
  int64_t* step_start_seq = nullptr;  // the ledger's sequence number and live bytes as each step starts (--explain)
  size_t* step_start_live = nullptr;
  bool inference = false, profile = false, fixed_batch = false;
  std::string save, export_hf;  // named in a non-finite loss's report
};

// Steps first..last, one line each; the last step's kernel times (--profile) go into `times`. A non-finite
// loss stops training before anything is saved (an fp16 step skipped for overflow is reported instead).
double run_steps(models::Model& model, engine::Device& device, const RunOptions& o, Transcript& out,
                 std::vector<ops::KernelTime>& times, std::vector<ops::KernelTime>& module_times) {
  const bool meta = device.type() == engine::DeviceType::meta;
  const double peak_tflops = peak_tflops_of(device, model);
  ops::set_kernel_timing(o.profile);
  engine::counters().by_module = o.profile;
  double last_ms = 0;
  for (int64_t step = o.first; step <= o.last; step++) {
    engine::counters().reset();
    if (o.profile) ops::start_step_timing(device);  // drops the previous step's
    auto t0 = std::chrono::steady_clock::now();
    if (o.running) *o.running = step;
    if (o.step_start_seq) *o.step_start_seq = device.ledger().sequence();
    if (o.step_start_live) *o.step_start_live = device.ledger().live_bytes();
    const int64_t skipped_before = model.loss_scaler().skipped;
    const engine::dist::CommTotals comm_before = model.communication();
    models::StepResult r = o.inference ? model.eval_step(step) : model.train_step(step);
    device.synchronize();
    model.average_over_ranks(r);  // data parallel: the world's loss and items
    if (!o.inference && !meta && !std::isfinite(r.loss) && model.loss_scaler().skipped == skipped_before)
      throw engine::Error(non_finite_report(step, r, model, o.save, o.export_hf));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    last_ms = ms;
    if (o.profile) times = ops::take_kernel_times(&module_times);
    device.ledger().check();
    // "-": meta computes no values; a generation step (--inference of a translation model) computes no loss.
    const std::string loss = meta || !r.has_loss ? "-" : format_fixed(r.loss, 4);
    out.say(engine::str("step ", step, "/", o.last, " | loss ", loss, " | ", format_fixed(ms, 1), " ms | ",
                        meta ? std::string("-") : format_fixed(double(r.items) / (ms / 1000.0), 1), " ",
                        model.item_unit(), "/s | ",
                        peak_tflops > 0 ? format_fixed(100.0 * engine::counters().flops / (ms * 1e9) / peak_tflops, 1) +
                                              "% MFU | "
                                        : std::string(),
                        "peak ", format_bytes(device.ledger().peak_bytes())));
    if (o.fixed_batch && !meta) {
      char digits[64];
      std::snprintf(digits, sizeof digits, "%.10g", r.loss);
      out.say(engine::str("  loss ", digits));
    }
    for (const std::string& line : r.details) out.say("  " + line);
    std::string ranks;
    if (model.world_size() > 1) {
      const tools::WorldStep w = tools::world_step(model, comm_before, ms, device.ledger().peak_bytes());
      out.say("  " + tools::ranks_line(w, meta));
      ranks = tools::ranks_json(w, meta);
    }
    if (o.records)
      o.records->push_back({step, meta || !r.has_loss ? NAN : r.loss, ms,
                            meta ? NAN : double(r.items) / (ms / 1000.0), device.ledger().peak_bytes(), ranks});
    if (o.last - o.first >= 1) out.progress(step - o.first + 1, engine::str("step ", step));
  }
  return last_ms;
}

// The step in which the run's peak was reached: the first whose line shows the final peak (0: building the model).
int64_t step_of_peak(const std::vector<StepRecord>& records) {
  for (const StepRecord& r : records)
    if (r.peak_bytes == records.back().peak_bytes) return r.step;
  return 0;
}

// "in step 2, backward, at bert.encoder.layer.1.attention.self.core/softmax_backward's allocation".
std::string peak_moment(const engine::Ledger::PeakGroups& g, int64_t step) {
  if (g.moment.id < 0) return "before the first allocation";
  return str(step > 0 ? str("in step ", step) : std::string("while the model was built"), ", phase ",
             engine::phase_name(g.moment.phase), ", at the allocation of ",
             g.moment.owner.empty() ? std::string("(untagged)") : g.moment.owner);
}

// --json: the run as one JSON object (tools/README.md shows an example).
std::string run_json(const models::ModelConfig& config, models::Model& model, const engine::Device& device,
                     const std::string& capacity_note, const RunOptions& o, const std::vector<StepRecord>& records,
                     const engine::Ledger::PeakGroups& peak, int64_t peak_step) {
  using engine::json::quote;
  std::ostringstream os;
  // The config as given (0 and "": the model's default), and as the flags that reproduce it.
  os << "{\n \"model\": " << quote(config.name) << ",\n \"config\": {\"size\": " << quote(config.size)
     << ", \"task\": " << quote(config.task) << ", \"seq\": " << config.seq << ", \"batch\": " << config.batch
     << ", \"tokens\": " << config.tokens << ", \"precision\": " << quote(config.precision)
     << ", \"attention\": " << quote(config.attention) << ", \"recompute\": " << quote(config.recompute)
     << ", \"data\": " << quote(config.data) << ", \"seed\": " << config.seed
     << "},\n \"flags\": " << quote(tools::config_flags(config)) << ",\n \"summary\": " << quote(model.summary())
     << ",\n \"header\": " << quote(header_line(model, device, capacity_note, o.inference))
     << ",\n \"device\": " << quote(device.name()) << ",\n \"arena_bytes\": " << device.capacity()
     << ",\n \"parameters\": " << model.module().num_parameters() << ",\n \"unit\": " << quote(model.item_unit())
     << ",\n \"steps\": [";
  for (size_t i = 0; i < records.size(); i++) {
    const StepRecord& r = records[i];
    os << (i ? ",\n  " : "\n  ") << "{\"step\": " << r.step << ", \"loss\": " << engine::json::number(r.loss)
       << ", \"ms\": " << engine::json::number(r.ms)
       << ", \"items_per_second\": " << engine::json::number(r.items_per_second) << ", \"peak_bytes\": " << r.peak_bytes
       << (r.ranks_json.empty() ? "" : ", \"ranks\": " + r.ranks_json) << "}";
  }
  const engine::Ledger& l = device.ledger();
  os << "],\n \"peak\": {\"bytes\": " << l.peak_bytes() << ", \"step\": " << peak_step << ", \"phase\": "
     << quote(peak.moment.id < 0 ? "" : engine::phase_name(peak.moment.phase)) << ", \"owner\": "
     << quote(peak.moment.owner) << ", \"arena_high_water_bytes\": " << l.high_water();
  for (auto [name, groups] : {std::pair{"by_category", &peak.by_category}, std::pair{"by_module", &peak.by_module},
                              std::pair{"by_op", &peak.by_op}}) {
    os << ",\n  \"" << name << "\": {";
    size_t k = 0;
    for (const auto& [key, t] : *groups) os << (k++ ? ", " : "") << quote(key) << ": " << t.bytes;
    os << "}";
  }
  os << "},\n \"category_peaks\": {";  // each category's own peak over the run (they need not coincide)
  for (int k = 0, n = 0; k < engine::kNumCategories; k++)
    if (l.peak_bytes(engine::Category(k)) > 0)
      os << (n++ ? ", " : "") << quote(engine::category_name(engine::Category(k))) << ": "
         << l.peak_bytes(engine::Category(k));
  os << "},\n \"live_at_end\": {";  // what outlives the steps: parameters, optimizer state, buckets, caches
  for (int k = 0, n = 0; k < engine::kNumCategories; k++)
    if (l.live_bytes(engine::Category(k)) > 0)
      os << (n++ ? ", " : "") << quote(engine::category_name(engine::Category(k))) << ": "
         << l.live_bytes(engine::Category(k));
  os << "}\n}\n";
  return os.str();
}

int run(int argc, char** argv) {
  tools::Flags flags("engine_train", "Train a model of the engine and report its memory, byte for byte.\n"
                                     "models: " + joined_model_names() + "\ngpu profiles: " +
                                     tools::gpu_profile_names());
  add_flags(flags);
  if (!flags.parse(argc, argv)) return 0;
  if (tools::nproc_given(flags)) return tools::launch_nproc(flags, argc, argv);
  const tools::World world = tools::world_of(flags);
  models::ModelConfig config = config_of(flags);
  world.apply(config);  // on meta create_model predicts the rank; cpu ranks are connected below
  const std::string load = flags.str("load"), save = flags.str("save"), export_hf = flags.str("export-hf");
  std::string from_checkpoint;
  if (!load.empty())
    from_checkpoint =
        tools::fill_config_from_checkpoint(load, config, [&](const std::string& f) { return flags.given(f); });
  ENGINE_CHECK(!config.name.empty(), "engine_train: --model is required; valid models: ", joined_model_names());

  engine::DeviceType type = engine::device_type_from_name(flags.str("device"));
  std::string capacity_note;
  size_t capacity = arena_capacity(flags, type, &capacity_note);
  for (const char* find : {"find-max-batch", "find-max-seq"})
    ENGINE_CHECK(!(flags.on(find) && flags.given("batch-file")), "engine_train: --", find,
                 " varies the batch's shape; it cannot read a fixed --batch-file");
  ENGINE_CHECK(!(flags.on("find-max-batch") && flags.on("find-max-seq")),
               "engine_train: --find-max-batch and --find-max-seq are two questions: ask one (the other's value from ",
               "--batch or --seq)");
  if (flags.on("find-max-batch"))
    return find_max_batch(config, flags, type, capacity, capacity_note, tools::SearchAxis::batch);
  if (flags.on("find-max-seq"))
    return find_max_batch(config, flags, type, capacity, capacity_note, tools::SearchAxis::seq);

  // Output paths are checked now, not after the run (a checkpoint that cannot be written is a lost run).
  for (const char* flag : {"save", "trace", "timeline", "report", "json"})
    if (!flags.str(flag).empty()) engine::check_writable(world.rank_path(flags.str(flag)), std::string("--") + flag);
  const bool timed = flags.str("timeline-axis") == "time";
  ENGINE_CHECK(!timed || type != engine::DeviceType::meta,
               "engine_train: --timeline-axis time: the meta device computes nothing, so its events have no time; "
               "use --timeline-axis events on meta, or --device cpu or cuda");
  ENGINE_CHECK(!flags.given("timeline-axis") || !flags.str("timeline").empty(),
               "engine_train: --timeline-axis is the axis of --timeline FILE.svg: give --timeline too");

  // A rank joins its world before its device is made: NCCL's buffers first, then the arena sized to what is left.
  std::shared_ptr<engine::dist::Communicator> comm;
  if (world.world_size > 1 && type != engine::DeviceType::meta)  // (meta: create_model sets up the predicted rank)
    comm = engine::dist::connect(world.env, type);
  auto device = engine::Device::create(type, capacity);
  device->set_capacity_note(capacity_note);
  // --explain: every block's tensor, reason and free moment; --timeline: the phase of every free.
  if (flags.on("explain") || !flags.str("timeline").empty()) device->ledger().set_detail(true);
  if (timed) device->set_event_clock(true);
  engine::DeviceGuard guard(device);
  std::unique_ptr<models::Model> model = models::create_model(config);
  RunOptions o;
  o.inference = flags.on("inference");
  o.profile = flags.on("profile");
  o.save = save;
  o.export_hf = export_hf;
  if (!export_hf.empty()) tools::check_hf_exportable(*model, export_hf);
  tools::CheckpointLoad loaded;
  if (!load.empty()) loaded = tools::load_checkpoint(load, *model, !o.inference);
  if (comm) model->set_data_parallel(comm, size_t(world.bucket_mb) << 20, world.zero, world.bucket_view);
  const std::string batch_file = flags.str("batch-file");
  if (!batch_file.empty()) {
    ENGINE_CHECK(model->supports_fixed_batch(), "engine_train: --batch-file: ", config.name,
                 " reads several different batches per step; run it without --batch-file");
    engine::CategoryScope input(engine::Category::input);
    std::map<std::string, engine::Tensor> tensors = engine::load_safetensors(batch_file, device);
    model->set_fixed_batch(models::Batch(tensors.begin(), tensors.end()));
    o.fixed_batch = true;
  }

  Transcript out(o.inference ? "eval" : "training", flags.integer("steps"));
  out.say(model->summary());
  out.say(header_line(*model, *device, capacity_note, o.inference));
  if (world.world_size > 1) out.say(tools::data_parallel_line(*model));
  if (!from_checkpoint.empty())
    out.say("config from the checkpoint (the command line did not give these):" + from_checkpoint);
  if (!load.empty())
    out.say(loaded.engine_checkpoint
                ? engine::str("loaded ", load, ": ", loaded.weights, " weights",
                              loaded.optimizer_restored ? ", optimizer state" : "", ", resuming after step ",
                              loaded.step)
                : engine::str("loaded ", load, ": ", loaded.weights, " weights (no engine metadata: weights only)"));

  o.first = loaded.step + 1;
  o.last = loaded.step + flags.integer("steps");
  std::vector<ops::KernelTime> times, module_times;
  int64_t running = 0;
  std::vector<StepRecord> records;
  o.running = &running;
  o.records = &records;
  int64_t explain_seq = 0;
  size_t explain_live = 0;
  o.step_start_seq = &explain_seq;
  o.step_start_live = &explain_live;
  double last_ms = 0;
  try {
    last_ms = run_steps(*model, *device, o, out, times, module_times);
  } catch (const engine::OutOfMemory& e) {
    // Training from the model's own data: what would fit, each lever measured on meta (tools/oom_remedies.h).
    if (o.inference || o.fixed_batch) throw;
    model.reset();
    std::string tail = "--device " + flags.str("device");
    for (const char* f : {"gpu", "memory"})
      if (flags.given(f)) tail += str(" --", f, " ", flags.str(f));
    tools::ProgressBar bar("remedies", 0);
    const tools::RemedyReport r = tools::oom_remedies(
        config, capacity, 2, [&](int done, int, const std::string& what) { bar.update(done, "trying " + what); });
    bar.clear();
    throw engine::OutOfMemory(
        str(e.what(), "\n  in training step ", running, "\n\n", tools::remedies_markdown(r, tail)), e.requested,
        e.capacity);
  }
  if (o.profile) {
    out.say("");
    out.say(type == engine::DeviceType::meta ? work_table()
                                             : profile_table(times, last_ms, type == engine::DeviceType::cuda));
    if (type != engine::DeviceType::meta) {
      out.say("");
      out.say(module_time_table(module_times, last_ms, flags.integer("profile-rows")));
    }
  }
  out.say("");
  out.say("## Memory at the peak");
  const engine::Ledger::PeakGroups peak = device->ledger().peak_groups(model->memory_report_depth());
  const int64_t peak_step = step_of_peak(records);
  out.say(
      str("The peak, ", format_bytes(device->ledger().peak_bytes()), ", came ", peak_moment(peak, peak_step), ".\n"));
  out.say(device->ledger().peak_table_markdown(model->memory_report_depth()));
  const std::string whole = whole_device(*device, flags);
  if (!whole.empty()) out.say(whole);
  if (flags.on("explain"))
    out.say(tools::explain_markdown(device->ledger(), explain_seq, explain_live,
                                    str("Step ", o.last, " explained: every allocation and free in order")));
  if (!flags.str("report").empty()) engine::write_file_atomic(world.rank_path(flags.str("report")), out.text());
  if (!flags.str("timeline").empty())
    engine::write_file_atomic(
        world.rank_path(flags.str("timeline")),
        tools::memory_timeline_svg(
            device->ledger(), explain_seq,
            str(config.name, " on ", device->name(), ", step ", o.last, ": live bytes by category"),
            timed ? device->event_times() : std::vector<std::pair<int64_t, double>>{}));
  if (!flags.str("json").empty())
    engine::write_file_atomic(world.rank_path(flags.str("json")),
                              run_json(config, *model, *device, capacity_note, o, records, peak, peak_step));
  if (!flags.str("trace").empty())  // counter tracks per category, phase and module slices (tools/trace_export.h)
    engine::write_file_atomic(world.rank_path(flags.str("trace")),
                              tools::chrome_trace_json(device->ledger(), config.name));
  if (!save.empty()) {  // every rank: under ZeRO the state is assembled from all of them; rank 0 writes
    tools::save_checkpoint(save, *model, config, o.last);
    std::printf("saved %s after step %lld\n", save.c_str(), (long long)o.last);
  }
  if (!export_hf.empty()) {  // every rank: under ZeRO the masters are assembled from all of them; rank 0 writes
    tools::export_hf(export_hf, *model);
    if (world.env.rank == 0)
      std::printf("exported %s/model.safetensors and %s/config.json (Hugging Face transformers) after step %lld\n",
                  export_hf.c_str(), export_hf.c_str(), (long long)o.last);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tools::run_main("engine_train", [&] { return run(argc, argv); });
}
