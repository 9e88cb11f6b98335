// engine_bench: many configs at once: the 2020 study reproduced, memory-scaling sweeps, traces.
//
//   engine_bench lambda [--device meta|cuda] [--out DIR]          every model x every card of lambda2020.csv
//   engine_bench scale --model bert_base --seq 128:512            memory vs sequence length, fitted laws
//   engine_bench scale --model bert_base --batch 1:64 --seq 128   memory vs batch size
//   engine_bench scale --model bert_base --world-size 1:64 --zero 0,1,2   one rank's memory vs world size
//   engine_bench trace --model bert_base --seq 128 --batch 8      Chrome trace + PyTorch memory_viz snapshot
//   engine_bench diff --model bert_base --seq 512 -- --attention flash   where two configs' peaks differ
//
// Each writes markdown (also printed), CSV, JSON and SVG plots into --out (lambda, scale) or a trace JSON
// and a memory_viz pickle (trace), or the difference of two peaks by category, module and op (diff). The library
// parts live in tools/bench_*.h, tools/svg_plot.h and
// tools/trace_export.h. Errors (unknown model, bad range, out of memory in a trace) are one clear message
// and a non-zero exit status (2; 3 for out of memory).
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/device.h"
#include "engine/format.h"
#include "engine/io.h"
#include "models/registry.h"
#include "tools/bench_diff.h"
#include "tools/bench_lambda.h"
#include "tools/bench_scale.h"
#include "tools/config_flags.h"
#include "tools/explain.h"
#include "tools/flags.h"
#include "tools/fork_pool.h"
#include "tools/gpu_profiles.h"
#include "tools/progress.h"
#include "tools/trace_export.h"

namespace {

using engine::str;

const char* kUsage =
    "usage: engine_bench lambda|scale|trace [flags]   (engine_bench <command> --help for its flags)\n"
    "  lambda  max batch of every registered model on every card of the 2020 study, beside the study's figures\n"
    "  scale   memory per category against sequence length or batch size, with fitted laws and plots\n"
    "  trace   one model's allocation timeline as a Chrome trace and a PyTorch memory_viz snapshot\n"
    "  diff    two configs (A -- B, B starting from A's flags): their peaks on meta and the difference by category,\n"
    "          module and op\n";

std::string joined_model_names() {
  std::string s;
  for (const auto& n : models::model_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string write(const std::string& dir, const std::string& name, const std::string& content) {
  std::filesystem::create_directories(dir);
  std::string path = (std::filesystem::path(dir) / name).string();
  engine::write_file_atomic(path, content);
  return path;
}

// The part of an output's file name that says which config wrote it, so that runs of two configs into one
// --out folder keep both: "" for the defaults, else "_<value>" for each setting that differs from its
// default, in a fixed order (e.g. "_large_bf16_flash_recompute-layer", "_batch8").
std::string config_suffix(const models::ModelConfig& c, const std::string& fixed = "") {
  std::string dims;  // "layers24_hidden1024" (engine_train's spelling of the flags, without dashes)
  for (const auto& [flag, value] : tools::dims_settings(c))
    if (!value.empty()) dims += (dims.empty() ? "" : "_") + flag + value;
  std::string s;
  for (const std::string& part :
       {c.size, c.task, dims, c.precision == "fp32" ? "" : c.precision, c.attention == "naive" ? "" : c.attention,
        c.recompute == "none" ? "" : "recompute-" + c.recompute, c.optimizer,
        !c.inference     ? ""
        : c.generate > 0 ? "generate" + std::to_string(c.generate)
                         : "inference",
        fixed})
    if (!part.empty()) s += "_" + part;
  for (char& ch : s)
    if (ch == ',' || ch == ' ' || ch == '/') ch = '-';
  return s;
}

// The seq, batch and tokens a config gives ("seq128_batch8"; "" when it keeps the model's): the `fixed` part of
// config_suffix for the commands that run one config.
std::string shape_suffix(const models::ModelConfig& c) {
  std::string s;
  for (auto [k, v] : {std::pair<const char*, int64_t>{"seq", c.seq}, {"batch", c.batch}, {"tokens", c.tokens}})
    if (v > 0) s += (s.empty() ? "" : "_") + std::string(k) + std::to_string(v);
  return s;
}

// --out: a folder that exists (made here) and can be written, checked before any work starts.
std::string output_dir(const tools::Flags& f) {
  const std::string dir = f.str("out");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ENGINE_CHECK(!ec && std::filesystem::is_directory(dir) && access(dir.c_str(), W_OK) == 0, "--out ", dir,
               ": cannot create or write this folder", ec ? " (" + ec.message() + ")" : std::string(),
               "; give a writable folder");
  return dir;
}

void add_model_flags(tools::Flags& f) {
  f.add_string("model", "", "model: " + joined_model_names());
  f.add_string("size", "", "model size (the model's default when empty)");
  f.add_string("task", "", "task of a multi-task model");
  f.add_string("backbone", "", "backbone variant of a vision model (maskrcnn: r50, r101)");
  f.add_choice("attention", "naive", {"naive", "flash"}, "attention algorithm");
  f.add_choice("precision", "fp32", {"fp32", "tf32", "bf16", "fp16"}, "numeric precision");
  f.add_choice("recompute", "none", {"none", "attention", "layer", "cell"},
               "activation checkpointing (the models say which modes they have: cell is NASNet's)");
  f.add_int("steps", 2, "training steps per run (two: the optimizer state exists in the second)");
  tools::add_shape_flags(f);
}

models::ModelConfig model_config(const tools::Flags& f) {
  ENGINE_CHECK(!f.str("model").empty(), "--model is required; valid models: ", joined_model_names());
  models::ModelConfig c;
  c.name = f.str("model");
  c.size = f.str("size");
  c.task = f.str("task");
  c.backbone = f.str("backbone");
  c.attention = f.str("attention");
  c.precision = f.str("precision");
  c.recompute = f.str("recompute");
  bool known = false;
  for (const auto& n : models::model_names()) known |= n == c.name;
  ENGINE_CHECK(known, "unknown model '", c.name, "': valid models are ", joined_model_names());
  tools::read_shape_flags(f, c);
  return c;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (!s.empty() && start <= s.size()) {
    size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------

int lambda(int argc, char** argv) {
  tools::Flags f("engine_bench lambda", "The 2020 GPU study: max batch of every registered model on every card of "
                                        "lambda2020.csv (found on meta), beside the study's figure; with --device cuda "
                                        "also the training throughput at that batch.");
  f.add_choice("device", "meta", {"meta", "cuda"}, "meta: batches only; cuda: also throughput on this GPU");
  f.add_string("study", "", "a table in lambda2020.csv's format (default: the built-in tools/data/lambda2020.csv)");
  f.add_string("out", "bench_out", "directory for lambda.md, .csv, .json and .svg");
  f.add_string("models", "", "only these models (registry or study names), comma-separated (default: all)");
  f.add_choice("attention", "naive", {"naive", "flash"}, "attention algorithm");
  f.add_choice("precision", "fp32", {"fp32", "tf32", "bf16", "fp16"}, "numeric precision");
  f.add_int("steps", 2, "training steps per max-batch probe");
  f.add_int("throughput-steps", 4, "cuda: training steps per throughput run (the first is not timed)");
  f.add_int("jobs", tools::available_cpus(), "searches run in this many processes at once");
  if (!f.parse(argc, argv)) return 0;
  tools::LambdaOptions o;
  o.study_path = f.str("study");
  o.device = engine::device_type_from_name(f.str("device"));
  o.precision = f.str("precision");
  o.attention = f.str("attention");
  o.models = split_commas(f.str("models"));
  o.steps = int(f.integer("steps"));
  o.throughput_steps = int(f.integer("throughput-steps"));
  o.jobs = int(f.integer("jobs"));
  ENGINE_CHECK(o.steps >= 1 && o.throughput_steps >= 2, "--steps must be >= 1 and --throughput-steps >= 2");
  std::unique_ptr<tools::ProgressBar> bar;  // its total is known once the rows are
  o.on_progress = [&](int64_t done, int64_t total, const std::string& what) {
    if (!bar) bar = std::make_unique<tools::ProgressBar>("lambda", total);
    bar->update(done, what);
  };
  const std::string dir = output_dir(f);
  models::ModelConfig tag;  // the settings lambda varies
  tag.precision = o.precision;
  tag.attention = o.attention;
  const std::string stem = "lambda" + config_suffix(tag) + (o.device == engine::DeviceType::cuda ? "_cuda" : "");
  tools::LambdaTable t = tools::run_lambda(o);
  if (bar) bar->clear();
  std::string md = tools::lambda_markdown(t);
  std::printf("%s\n", md.c_str());
  std::printf("wrote %s, %s, %s, %s\n", write(dir, stem + ".md", md).c_str(),
              write(dir, stem + ".csv", tools::lambda_csv(t)).c_str(),
              write(dir, stem + ".json", tools::lambda_json(t)).c_str(),
              write(dir, stem + ".svg", tools::lambda_svg(t)).c_str());
  return 0;
}

// A sweep's markdown (also printed), CSV, JSON and both plots, as DIR/STEM.*.
void write_scale_reports(const std::string& dir, const std::string& stem, const tools::ScaleResult& r) {
  const std::string md = tools::scale_markdown(r);
  std::printf("%s\n", md.c_str());
  std::printf("wrote %s, %s, %s, %s, %s\n", write(dir, stem + ".md", md).c_str(),
              write(dir, stem + ".csv", tools::scale_csv(r)).c_str(),
              write(dir, stem + ".json", tools::scale_json(r)).c_str(),
              write(dir, stem + "_stacked.svg", tools::scale_stacked_svg(r)).c_str(),
              write(dir, stem + "_fit.svg", tools::scale_fit_svg(r)).c_str());
}

// engine_bench scale --world-size RANGE [--zero 0,1,2,3]: one sweep per stage, one rank of each world on meta.
int scale_world(const tools::Flags& f, const std::string& world) {
  ENGINE_CHECK(f.str("device") == "meta",
               "--world-size: one rank of a world is predicted on the meta device "
               "(cpu ranks train with engine_train --nproc N)");
  std::vector<int> stages;
  std::stringstream list(f.str("zero"));
  for (std::string z; std::getline(list, z, ',');) {
    ENGINE_CHECK(z == "0" || z == "1" || z == "2" || z == "3", "--zero ", f.str("zero"),
                 ": a list of the stages 0, 1, 2 and 3 (e.g. 0,1,2,3)");
    stages.push_back(std::stoi(z));
  }
  ENGINE_CHECK(!stages.empty(), "--zero: give at least one stage (0, 1, 2 or 3)");
  const std::string dir = output_dir(f);
  for (int zero : stages) {
    tools::ScaleOptions o;
    o.config = model_config(f);
    o.config.zero = zero;
    if (!f.str("seq").empty()) o.config.seq = std::stoll(f.str("seq"));
    if (!f.str("batch").empty()) o.config.batch = std::stoll(f.str("batch"));
    o.steps = int(f.integer("steps"));
    o.axis = tools::ScaleAxis::world;
    o.points = tools::parse_points(world, "world-size");
    o.capacity = f.given("memory") ? engine::parse_bytes(f.str("memory")) : size_t(1) << 40;
    const std::string stem =
        "scale_" + o.config.name + "_world_zero" + std::to_string(zero) + config_suffix(o.config, "");
    tools::ProgressBar bar("scale " + o.config.name + " ZeRO-" + std::to_string(zero), int64_t(o.points.size()));
    o.on_point = [&](size_t done, size_t, const std::string& note) { bar.update(int64_t(done), note); };
    tools::ScaleResult r = tools::run_scale(o);
    bar.clear();
    write_scale_reports(dir, stem, r);
  }
  return 0;
}

int scale(int argc, char** argv) {
  tools::Flags f("engine_bench scale",
                 "Memory per category against sequence length (--seq RANGE), batch size "
                 "(--batch RANGE) or, for one rank of a data-parallel world, world size "
                 "(--world-size RANGE, with --zero), fitted laws, the limit per GPU, plots.\n"
                 "RANGE: A:B (half-octave steps), A:B:STEP or A,B,C.");
  add_model_flags(f);
  f.add_string("seq", "", "a RANGE to sweep, or one sequence length (default: the model's)");
  f.add_string("batch", "", "a RANGE to sweep, or one batch size (sequences, images or tokens)");
  f.add_string("world-size", "", "a RANGE of world sizes: one rank's memory under data parallel (meta only)");
  f.add_string("zero", "0", "with --world-size: the ZeRO stages, one sweep each (e.g. 0,1,2,3)");
  f.add_choice("device", "meta", {"meta", "cpu", "cuda"}, "where to run each point");
  f.add_string("memory", "", "arena capacity per point (default: 1 TiB on meta; cuda: free memory less a reserve)");
  f.add_string("out", "bench_out", "directory for the reports and plots");
  f.add_bool("inference", "eval steps (forward only, no training state) instead of training steps");
  f.add_int("generate", 0,
            "with --inference, for transformer_lm: tokens decoded after each --seq-token prompt "
            "(the KV cache then appears as its own category)");
  if (!f.parse(argc, argv)) return 0;
  auto is_range = [](const std::string& s) { return s.find_first_of(":,") != std::string::npos; };
  const std::string seq = f.str("seq"), batch = f.str("batch"), world = f.str("world-size");
  const int ranges = int(is_range(seq)) + int(is_range(batch)) + int(!world.empty());
  ENGINE_CHECK(ranges == 1, ranges > 1 ? "give one range to sweep: --seq, --batch or --world-size, not several"
                                       : "give a range to sweep: --seq A:B, --batch A:B or --world-size A:B");
  if (!world.empty()) return scale_world(f, world);
  tools::ScaleOptions o;
  o.config = model_config(f);
  o.config.inference = o.inference = f.on("inference");
  o.config.generate = f.integer("generate");
  ENGINE_CHECK(o.config.generate >= 0, "--generate must be positive");
  o.steps = int(f.integer("steps"));
  o.axis = is_range(seq) ? tools::ScaleAxis::seq : tools::ScaleAxis::batch;
  o.points = tools::parse_points(is_range(seq) ? seq : batch, is_range(seq) ? "seq" : "batch");
  const std::string fixed = is_range(seq) ? batch : seq;
  if (!fixed.empty()) {  // the other dimension, held fixed
    char* end = nullptr;
    long long v = std::strtoll(fixed.c_str(), &end, 10);
    ENGINE_CHECK(*end == 0 && v >= 1, "--", is_range(seq) ? "batch" : "seq", " ", fixed,
                 ": expected one positive integer (the value held fixed while the other flag's range is swept)");
    (is_range(seq) ? o.config.batch : o.config.seq) = v;
  }
  o.device = engine::device_type_from_name(f.str("device"));
  o.capacity = f.given("memory") ? engine::parse_bytes(f.str("memory"))
               : o.device == engine::DeviceType::meta ? size_t(1) << 40
               : o.device == engine::DeviceType::cuda ? 0 : engine::kDefaultCpuCapacity;
  const std::string dir = output_dir(f);
  const std::string stem = "scale_" + o.config.name + "_" + (is_range(seq) ? "seq" : "batch") +
                           config_suffix(o.config, fixed.empty() ? "" : (is_range(seq) ? "batch" : "seq") + fixed);
  tools::ProgressBar bar("scale " + o.config.name, int64_t(o.points.size()));
  o.on_point = [&](size_t done, size_t, const std::string& note) { bar.update(int64_t(done), note); };
  tools::ScaleResult r = tools::run_scale(o);
  bar.clear();
  write_scale_reports(dir, stem, r);
  return 0;
}

int trace(int argc, char** argv) {
  tools::Flags f("engine_bench trace", "One model's allocation timeline: a Chrome trace (counter track per category, "
                                       "phase and module slices; open in ui.perfetto.dev) and a PyTorch memory_viz "
                                       "snapshot (open in pytorch.org/memory_viz).");
  add_model_flags(f);
  f.add_int("seq", 0, "sequence length (0: the model's default)");
  f.add_int("batch", 0, "batch size (0: the model's default)");
  f.add_int("tokens", 0, "batch in tokens, for translation models (0: the model's default)");
  f.add_choice("device", "meta", {"meta", "cpu", "cuda"}, "where to run");
  f.add_string("memory", "", "arena capacity (default: 1 TiB on meta)");
  f.add_string("out", "bench_out",
               "directory for trace_<model>[_<config>].json and memory_viz_<model>[_<config>].pickle");
  if (!f.parse(argc, argv)) return 0;
  models::ModelConfig c = model_config(f);
  c.seq = f.integer("seq");
  c.batch = f.integer("batch");
  c.tokens = f.integer("tokens");
  ENGINE_CHECK(c.seq >= 0 && c.batch >= 0 && c.tokens >= 0 && f.integer("steps") >= 1,
               "--seq, --batch and --tokens must be positive and --steps at least 1");
  engine::DeviceType type = engine::device_type_from_name(f.str("device"));
  size_t capacity = f.given("memory") ? engine::parse_bytes(f.str("memory"))
                    : type == engine::DeviceType::meta ? size_t(1) << 40
                    : type == engine::DeviceType::cuda ? 0 : engine::kDefaultCpuCapacity;
  const std::string dir = output_dir(f);
  const std::string suffix = config_suffix(c, shape_suffix(c));  // seq, batch or tokens given: in the names too
  auto device = engine::Device::create(type, capacity);
  device->ledger().set_detail(true);  // the timeline's phases of frees
  const bool timed = type != engine::DeviceType::meta;  // cpu and cuda stamp every event: a second timeline in time
  if (timed) device->set_event_clock(true);
  engine::DeviceGuard guard(device);
  auto model = models::create_model(c);
  const int64_t first_step_seq = device->ledger().sequence();
  for (int64_t step = 1; step <= f.integer("steps"); step++) model->train_step(step);
  // Exported with the model alive: the snapshot's segment then shows its parameters and optimizer state.
  const engine::Ledger& l = device->ledger();
  std::printf("%s\n\n%s\n", model->summary().c_str(), l.peak_table_markdown(model->memory_report_depth()).c_str());
  std::string process = str(c.name, " on ", device->name(), ", ", f.integer("steps"), " training steps");
  std::printf("wrote %s (ui.perfetto.dev), %s (pytorch.org/memory_viz), %s (the memory timeline)\n",
              write(dir, "trace_" + c.name + suffix + ".json", tools::chrome_trace_json(l, process)).c_str(),
              write(dir, "memory_viz_" + c.name + suffix + ".pickle", tools::memory_viz_pickle(l)).c_str(),
              write(dir, "timeline_" + c.name + suffix + ".svg",
                    tools::memory_timeline_svg(l, first_step_seq, str(process, ": live bytes by category")))
                  .c_str());
  if (timed)
    std::printf("wrote %s (the memory timeline in the device's time)\n",
                write(dir, "timeline_" + c.name + suffix + "_time.svg",
                      tools::memory_timeline_svg(l, first_step_seq, str(process, ": live bytes by category"),
                                                 device->event_times()))
                    .c_str());
  return 0;
}

// engine_bench diff A -- B: B's flags are A's followed by those after "--" (a flag given again wins), so
// "--model bert_base --seq 512 -- --attention flash" compares naive and flash attention at seq 512.
int diff(int argc, char** argv) {
  auto make_flags = [] {
    auto f = std::make_unique<tools::Flags>(
        "engine_bench diff", "Two configs' peaks on meta and where they differ, by category, module and layer type "
                             "/ op: engine_bench diff A-flags -- B-flags (B starts from A's flags; --steps, --rows "
                             "and --out apply to both).");
    add_model_flags(*f);
    f->add_int("seq", 0, "sequence length (0: the model's default)");
    f->add_int("batch", 0, "batch size (0: the model's default)");
    f->add_int("tokens", 0, "batch in tokens, for translation models (0: the model's default)");
    f->add_int("seed", 1, "random seed (the data a step sees: sequence lengths, boxes)");
    f->add_int("rows", 12, "changed rows per table (the rest are summed into one line)");
    f->add_string("out", "bench_out", "directory for diff_<model>_<A>_vs_<B>.md and .json");
    return f;
  };
  int sep = -1;
  for (int i = 1; i < argc; i++)
    if (std::string(argv[i]) == "--") {
      sep = i;
      break;
    }
  std::vector<char*> a_args(argv, argv + (sep < 0 ? argc : sep)), b_args = a_args;
  if (sep >= 0) b_args.insert(b_args.end(), argv + sep + 1, argv + argc);
  auto fa = make_flags();
  if (!fa->parse(int(a_args.size()), a_args.data())) return 0;
  ENGINE_CHECK(sep >= 0, "engine_bench diff: give two configs, A -- B (B starts from A's flags), e.g. engine_bench "
                         "diff --model bert_base --seq 512 -- --attention flash");
  auto fb = make_flags();
  if (!fb->parse(int(b_args.size()), b_args.data())) return 0;
  auto config = [](const tools::Flags& f) {
    models::ModelConfig c = model_config(f);
    c.seq = f.integer("seq");
    c.batch = f.integer("batch");
    c.tokens = f.integer("tokens");
    c.seed = uint64_t(f.integer("seed"));
    ENGINE_CHECK(c.seq >= 0 && c.batch >= 0 && c.tokens >= 0, "--seq, --batch and --tokens must be positive");
    return c;
  };
  const models::ModelConfig a = config(*fa), b = config(*fb);
  ENGINE_CHECK(fb->integer("steps") >= 1 && fb->integer("rows") >= 1, "--steps and --rows must be at least 1");
  const std::string dir = output_dir(*fb);
  const std::string stem =
      "diff_" + a.name + config_suffix(a, shape_suffix(a)) + "_vs" + config_suffix(b, shape_suffix(b));
  tools::PeakDiff d = tools::diff_peaks(a, b, int(fb->integer("steps")));
  const std::string md = tools::diff_markdown(d, size_t(fb->integer("rows")));
  std::printf("%s", md.c_str());
  std::printf("wrote %s, %s\n", write(dir, stem + ".md", md).c_str(),
              write(dir, stem + ".json", tools::diff_json(d)).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  return tools::run_main("engine_bench", [&] {
    // The command's flags parse from argv[1] on (Flags skips its first element, here the command).
    if (command == "lambda") return lambda(argc - 1, argv + 1);
    if (command == "scale") return scale(argc - 1, argv + 1);
    if (command == "trace") return trace(argc - 1, argv + 1);
    if (command == "diff") return diff(argc - 1, argv + 1);
    std::fprintf(stderr, "engine_bench: unknown command '%s'\n%s", command.c_str(), kUsage);
    return 2;
  });
}
