// engine_train: train (or run) one registered model and report where its memory goes.
//
//   engine_train --model transformer_lm --size small --device meta --memory 24GB
//
// Prints a header (model, parameters, device, arena capacity), one line per step in a fixed format, and at
// the end the live memory at the peak by category, by module and by layer type. Errors (unknown model or
// flag, impossible shape, out of memory) are reported as one clear message and a non-zero exit status.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "engine/device.h"
#include "engine/format.h"
#include "engine/io.h"
#include "models/registry.h"
#include "tools/flags.h"

namespace {

using engine::format_bytes;
using engine::format_fixed;

std::string joined_model_names() {
  std::string s;
  for (const auto& n : models::model_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

size_t default_capacity(engine::DeviceType type) {
  if (type == engine::DeviceType::cpu) {  // physical memory: an arena larger than RAM would only swap or die
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : engine::kDefaultCpuCapacity;
  }
  return size_t(1) << 40;  // meta without --memory: 1 TiB, i.e. "measure the peak, nothing is refused"
}

int run(int argc, char** argv) {
  tools::Flags flags("engine_train", "Train a model of the engine and report its memory, byte for byte.\n"
                                     "models: " + joined_model_names());
  flags.add_string("model", "", "model to run (required): " + joined_model_names());
  flags.add_string("size", "", "model size (the model's default when empty)");
  flags.add_int("seq", 0, "sequence length (0: the model's default)");
  flags.add_int("batch", 0, "batch size in sequences or images (0: the model's default)");
  flags.add_int("steps", 10, "training steps to run");
  flags.add_choice("device", "cpu", {"cpu", "meta", "cuda"}, "where to run; meta allocates but computes nothing");
  flags.add_string("memory", "", "arena capacity, e.g. 24GB (default: physical memory on cpu, 1 TiB on meta)");
  flags.add_choice("attention", "naive", {"naive", "flash"}, "attention algorithm");
  flags.add_choice("recompute", "none", {"none", "layer"}, "activation checkpointing");
  flags.add_int("seed", 1, "random seed (weights, data, dropout)");
  flags.add_string("trace", "", "write the allocation timeline as Chrome trace JSON (opens in Perfetto)");
  flags.add_string("report", "", "write the run's header, step lines and memory tables as markdown");
  if (!flags.parse(argc, argv)) return 0;
  ENGINE_CHECK(!flags.str("model").empty(), "engine_train: --model is required; valid models: ", joined_model_names());
  ENGINE_CHECK(flags.integer("steps") >= 1, "engine_train: --steps must be at least 1");
  ENGINE_CHECK(flags.integer("batch") >= 0 && flags.integer("seq") >= 0, "engine_train: --batch and --seq must be positive");

  engine::DeviceType type = engine::device_type_from_name(flags.str("device"));
  size_t capacity = flags.str("memory").empty() ? default_capacity(type) : engine::parse_bytes(flags.str("memory"));
  auto device = engine::Device::create(type, capacity);
  engine::DeviceGuard guard(device);

  models::ModelConfig config;
  config.name = flags.str("model");
  config.size = flags.str("size");
  config.seq = flags.integer("seq");
  config.batch = flags.integer("batch");
  config.attention = flags.str("attention");
  config.recompute = flags.str("recompute");
  config.seed = uint64_t(flags.integer("seed"));
  std::unique_ptr<models::Model> model = models::create_model(config);

  std::string out;
  auto say = [&out](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    out += line + "\n";
  };
  const engine::Ledger& ledger = device->ledger();
  say(model->summary());
  say(engine::str("parameters ", model->module().num_parameters(), " (", format_bytes(ledger.live_bytes(engine::Category::param)),
                  ") | device ", device->name(), " | arena ", format_bytes(device->capacity()),
                  type == engine::DeviceType::meta ? " | meta: shapes and allocations only, no arithmetic" : ""));

  int64_t steps = flags.integer("steps");
  for (int64_t step = 1; step <= steps; step++) {
    auto t0 = std::chrono::steady_clock::now();
    models::StepResult r = model->train_step(step);
    device->synchronize();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ledger.check();
    std::string loss = type == engine::DeviceType::meta ? "-" : format_fixed(r.loss, 4);
    say(engine::str("step ", step, "/", steps, " | loss ", loss, " | ", format_fixed(ms, 1), " ms | ",
                    format_fixed(double(r.items) / (ms / 1000.0), 1), " ", model->item_unit(), "/s | peak ",
                    format_bytes(ledger.peak_bytes())));
  }
  say("");
  say("## Memory at the peak");
  say(ledger.peak_table_markdown());
  if (!flags.str("report").empty()) engine::write_file_atomic(flags.str("report"), out);
  if (!flags.str("trace").empty()) engine::write_file_atomic(flags.str("trace"), ledger.chrome_trace_json());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const engine::OutOfMemory& e) {
    std::fprintf(stderr, "engine_train: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_train: %s\n", e.what());
    return 2;
  }
}
