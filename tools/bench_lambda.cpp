// bench_lambda.cpp: running every model on every card of the 2020 study (the reports: bench_lambda_report.cpp).
#include "tools/bench_lambda.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "engine/format.h"
#include "engine/io.h"
#include "engine/json.h"
#include "models/registry.h"
#include "tools/bench_scale.h"
#include "tools/fork_pool.h"
#include "tools/gpu_profiles.h"
#include "tools/svg_plot.h"

namespace tools {

using engine::str;

namespace {

bool registered(const std::string& name) {
  for (const auto& e : models::registry())
    if (e.name == name) return true;
  return false;
}

// The study's batch units in the engine's words (Model::item_unit()).
std::string short_unit(const std::string& study_unit) {
  if (study_unit == "sequences") return "seq";
  if (study_unit == "images") return "img";
  if (study_unit == "tokens") return "tok";
  return study_unit;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Running

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

models::ModelConfig row_config(const LambdaRow& row, const LambdaOptions& o, int64_t seq) {
  models::ModelConfig config;
  config.name = row.model;
  config.seq = seq;
  config.precision = o.precision;
  config.attention = row.attention;
  return config;
}

// Items per second of steps 2..n at `batch` on a fresh cuda arena of `capacity` bytes.
double cuda_throughput(models::ModelConfig config, int64_t batch, size_t capacity, int steps) {
  (counts_tokens(config) ? config.tokens : config.batch) = batch;
  auto device = engine::Device::create(engine::DeviceType::cuda, capacity);
  engine::DeviceGuard guard(device);
  std::unique_ptr<models::Model> model = models::create_model(config);
  model->train_step(1);
  device->synchronize();
  auto t0 = std::chrono::steady_clock::now();
  int64_t items = 0;
  for (int step = 2; step <= std::max(2, steps); step++) items += model->train_step(step).items;
  device->synchronize();
  return double(items) / seconds_since(t0);
}

// The max batch of `row.model` in one card's arena (meta): engine_train --find-max-batch's own search
// (tools/max_batch.h), so the two programs give one answer.
MaxBatchResult search_card(const LambdaRow& row, const LambdaOptions& o, int64_t seq, size_t capacity) {
  MaxBatchOptions mo;
  mo.steps = o.steps;
  return find_max_batch(row_config(row, o, seq), engine::DeviceType::meta, capacity, mo);
}

// On the GPU: items/s at each card's max batch, in an arena of that card's size.
void measure_throughput(LambdaRow& row, const LambdaOptions& o, int64_t seq, int64_t& done, int64_t total) {
  models::ModelConfig config = row_config(row, o, seq);
  for (LambdaCell& c : row.cells) {
    if (c.max_batch == 0) {
      done++;
      continue;
    }
    if (o.on_progress)
      o.on_progress(done++, total, str(row.model, ": throughput at batch ", c.max_batch, " in ", c.gpu, "'s memory"));
    try {
      c.throughput = cuda_throughput(config, c.max_batch, c.capacity, o.throughput_steps);
    } catch (const std::exception& e) {
      std::string what = e.what();
      c.error = what.substr(0, what.find('\n'));
    }
  }
}

// One card's search as text for the trip from a child process: status, unit, probes, seconds, max batch,
// first failure, binding term; tab-separated.
struct CardSearch {
  std::string status = "ok", unit, binding;
  int probes = 0;
  double seconds = 0;
  int64_t max_batch = 0, first_fail = 0;
};

std::string encode_search(const CardSearch& c) {
  std::string status = c.status;
  for (char& ch : status)
    if (ch == '\t' || ch == '\n') ch = ' ';
  return str(status, "\t", c.unit, "\t", c.probes, "\t", c.seconds, "\t", c.max_batch, "\t", c.first_fail, "\t",
             c.binding);
}

CardSearch decode_search(const std::string& text, const std::string& model) {
  std::vector<std::string> f;
  std::istringstream is(text);
  for (std::string field; std::getline(is, field, '\t');) f.push_back(field);
  if (!text.empty() && text.back() == '\t') f.push_back("");
  ENGINE_CHECK(f.size() == 7, "engine_bench lambda: a garbled result for ", model);
  CardSearch c;
  c.status = f[0];
  c.unit = f[1];
  c.probes = int(std::stol(f[2]));
  c.seconds = std::stod(f[3]);
  c.max_batch = std::stoll(f[4]);
  c.first_fail = std::stoll(f[5]);
  c.binding = f[6];
  return c;
}

}  // namespace

LambdaTable run_lambda(const LambdaOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  Study2020 study = o.study_path.empty() ? builtin_study2020() : read_study2020(o.study_path);
  LambdaTable t;
  t.gpus = study.gpus;
  t.device = engine::device_type_name(o.device);
  t.precision = o.precision;
  t.attention = o.attention;
  for (const auto& g : t.gpus) find_gpu_profile(g);  // every card of the study must have a profile
  for (const auto& m : o.models) {
    bool known = registered(m) || study.find(m);
    std::string valid;
    for (const auto& n : models::model_names()) valid += (valid.empty() ? "" : ", ") + n;
    for (const auto& r : study.rows) valid += (registered(r.model) ? "" : ", " + r.model);
    ENGINE_CHECK(known, "engine_bench lambda: unknown model '", m, "': valid models are ", valid);
  }
  auto wanted = [&](const std::string& name) {  // --models takes registry and study names
    return o.models.empty() || (!name.empty() && std::find(o.models.begin(), o.models.end(), name) != o.models.end());
  };

  // Rows: the study's models in its order, then registered models the study did not have.
  std::vector<std::pair<LambdaRow, int64_t>> rows;
  for (const auto& sr : study.rows) {
    LambdaRow row;
    row.study = sr.model;
    int64_t seq = 0;
    row.model = registered(sr.model) ? sr.model : "";  // a study model not in the table: the same name, if any
    for (const auto& sm : study_models())
      if (sr.model == sm.study) row.model = sm.registry, seq = sm.seq;
    if (!wanted(row.model) && !wanted(row.study)) continue;
    rows.push_back({row, seq});
  }
  for (const auto& e : models::registry()) {
    bool in_study = false;
    for (const auto& r : rows) in_study |= r.first.model == e.name;
    for (const auto& sm : study_models()) in_study |= e.name == sm.registry;
    if (in_study || !wanted(e.name)) continue;
    LambdaRow row;
    row.model = e.name;
    rows.push_back({row, 0});
  }
  std::vector<size_t> to_search;
  for (size_t i = 0; i < rows.size(); i++) {
    auto& [row, seq] = rows[i];
    const Study2020Row* sr = row.study.empty() ? nullptr : study.find(row.study);
    for (size_t g = 0; g < t.gpus.size(); g++) {
      LambdaCell c;
      c.gpu = t.gpus[g];
      c.capacity = gpu_arena_capacity(find_gpu_profile(c.gpu));
      if (sr) c.batch_2020 = sr->batch[g], c.throughput_2020 = sr->throughput[g];
      row.cells.push_back(c);
    }
    if (sr) row.unit = short_unit(sr->batch_unit);
    row.config = seq ? str("seq ", seq) : "default";
    row.attention = models::model_takes(row.model, models::kFlash) ? o.attention : "naive";  // where it applies
    if (row.model.empty() || !registered(row.model)) row.status = "not yet implemented", row.model.clear();
    else row.status = "ok", to_search.push_back(i);
  }
  // One search per (model, distinct card memory), `jobs` processes at a time; each result comes back as text.
  std::vector<std::pair<size_t, size_t>> jobs;  // (row, capacity)
  for (size_t i : to_search) {
    std::vector<size_t> capacities;
    for (const auto& c : rows[i].first.cells) capacities.push_back(c.capacity);
    std::sort(capacities.begin(), capacities.end());
    capacities.erase(std::unique(capacities.begin(), capacities.end()), capacities.end());
    for (size_t cap : capacities) jobs.push_back({i, cap});
  }
  int64_t done = 0, total = int64_t(jobs.size());
  if (o.device == engine::DeviceType::cuda) total += int64_t(to_search.size() * t.gpus.size());
  run_forked(
      jobs.size(), o.jobs,
      [&](size_t k) {
        auto& [row, seq] = rows[jobs[k].first];
        auto m0 = std::chrono::steady_clock::now();
        CardSearch c;
        try {
          MaxBatchResult r = search_card(row, o, seq, jobs[k].second);
          c.unit = r.unit;
          c.probes = int(r.probes.size());
          c.max_batch = r.largest_fit;
          c.first_fail = r.first_fail;
          if (r.first_fail) c.binding = engine::category_name(r.binding);
        } catch (const std::exception& e) {
          std::string what = e.what();
          c.status = "error: " + what.substr(0, what.find('\n'));
        }
        c.seconds = seconds_since(m0);
        return encode_search(c);
      },
      [&](size_t k, const std::string& result) {
        LambdaRow& row = rows[jobs[k].first].first;
        CardSearch c = decode_search(result, row.model);
        if (c.status != "ok" && row.status == "ok") row.status = c.status;
        if (!c.unit.empty()) row.unit = c.unit;
        row.probes += c.probes;
        row.seconds += c.seconds;
        for (LambdaCell& cell : row.cells)
          if (cell.capacity == jobs[k].second)
            cell.max_batch = c.max_batch, cell.first_fail = c.first_fail, cell.binding = c.binding;
        if (o.on_progress)
          o.on_progress(++done, total,
                        str(row.model, " searched in ", engine::format_bytes(jobs[k].second), ": ", c.status));
      });
  for (auto& [row, seq] : rows) {
    if (o.device == engine::DeviceType::cuda && row.status == "ok") measure_throughput(row, o, seq, done, total);
    t.probes += row.probes;
    t.rows.push_back(row);
  }
  t.seconds = seconds_since(t0);
  return t;
}

}  // namespace tools
