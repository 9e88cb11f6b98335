// bench_lambda.cpp: reading lambda2020.csv, running every model on every card, and the four reports.
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

// ---------------------------------------------------------------------------------------------------
// The study's models and their registry names: the one place where the two name spaces meet.

const std::vector<StudyModel>& study_models() {
  static const std::vector<StudyModel> table = {
      //  lambda2020.csv     registry           seq (0: default)
      {"nasnet_large", "nasnet_large", 0},
      {"deeplabv3", "deeplabv3", 0},
      {"yolov3", "yolov3", 0},
      {"pix2pixhd", "pix2pixhd", 0},
      {"stylegan", "stylegan", 0},
      {"maskrcnn", "maskrcnn", 0},
      {"transformer_big", "transformer_big", 0},
      {"convs2s", "convs2s", 0},
      {"unsupmt", "unsupmt", 0},
      {"bert_base", "bert_base", 128},   // pretraining phase 1 length
      {"bert_squad", "bert_squad", 384},  // run_squad's max_seq_length
      {"mtdnn", "mtdnn", 512},
  };
  return table;
}

// ---------------------------------------------------------------------------------------------------
// lambda2020.csv

namespace {

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream is(line);
  while (std::getline(is, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

double number_at(const std::string& s, const std::string& path, int line, const std::string& column) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  ENGINE_CHECK(!s.empty() && *end == 0, path, ":", line, ": column '", column, "' should be a number, got '", s, "'");
  return v;
}

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

const Study2020Row* Study2020::find(const std::string& model) const {
  for (const auto& r : rows)
    if (r.model == model) return &r;
  return nullptr;
}

Study2020 read_study2020(const std::string& path) {
  std::string text;
  try {
    text = engine::read_file(path, "study table", 64 * engine::kMiB);
  } catch (const engine::Error& e) {
    throw engine::Error(engine::str("cannot read the 2020 study's table '", path, "': ", e.what(),
                                    " (give a lambda2020.csv-style file with --study, or leave --study out for the "
                                    "built-in table)"));
  }
  return parse_study2020(text, path);
}

extern const char kStudy2020Csv[];  // generated from tools/data/lambda2020.csv by the Makefile

Study2020 builtin_study2020() { return parse_study2020(kStudy2020Csv, "tools/data/lambda2020.csv (built in)"); }

Study2020 parse_study2020(const std::string& text, const std::string& path) {
  std::istringstream f(text);
  Study2020 s;
  std::vector<std::string> header;
  size_t first_gpu = 0, throughput_unit = 0;
  std::string line;
  for (int n = 1; std::getline(f, line); n++) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cells = split_csv(line);
    if (header.empty()) {
      header = cells;
      auto at = [&](const char* name) {
        auto it = std::find(header.begin(), header.end(), name);
        ENGINE_CHECK(it != header.end(), path, ":", n, ": the header has no column '", name, "'");
        return size_t(it - header.begin());
      };
      ENGINE_CHECK(at("model") == 0, path, ":", n, ": the first column must be 'model'");
      first_gpu = at("batch_unit") + 1;
      throughput_unit = at("throughput_unit");
      s.gpus.assign(header.begin() + long(first_gpu), header.begin() + long(throughput_unit));
      ENGINE_CHECK(!s.gpus.empty() && header.size() == throughput_unit + 1 + s.gpus.size(), path, ":", n,
                   ": expected a batch column and a t_ column per card");
      continue;
    }
    ENGINE_CHECK(cells.size() == header.size(), path, ":", n, ": ", cells.size(), " columns, the header has ",
                 header.size());
    Study2020Row r;
    r.model = cells[0];
    r.task = cells[1];
    r.dataset = cells[2];
    r.input = cells[3];
    r.batch_unit = cells[first_gpu - 1];
    r.throughput_unit = cells[throughput_unit];
    for (size_t g = 0; g < s.gpus.size(); g++) {
      r.batch.push_back(number_at(cells[first_gpu + g], path, n, header[first_gpu + g]));
      r.throughput.push_back(number_at(cells[throughput_unit + 1 + g], path, n, header[throughput_unit + 1 + g]));
    }
    s.rows.push_back(std::move(r));
  }
  ENGINE_CHECK(!s.rows.empty(), path, ": no model rows");
  return s;
}

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
  config.attention = o.attention;
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
    if (o.on_progress) o.on_progress(done++, total, str(row.model, ": throughput at batch ", c.max_batch, " in ", c.gpu, "'s memory"));
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
          o.on_progress(++done, total, str(row.model, " searched in ", engine::format_bytes(jobs[k].second), ": ", c.status));
      });
  for (auto& [row, seq] : rows) {
    if (o.device == engine::DeviceType::cuda && row.status == "ok") measure_throughput(row, o, seq, done, total);
    t.probes += row.probes;
    t.rows.push_back(row);
  }
  t.seconds = seconds_since(t0);
  return t;
}

// ---------------------------------------------------------------------------------------------------
// Reports

namespace {

// A figure of the study as the study wrote it (16000, 7.3), or a dash where it has none.
std::string figure(double v) {
  if (v < 0) return "–";
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string gpu_heading(const std::string& g) {
  const GpuProfile& p = find_gpu_profile(g);
  return str(g, " ", engine::format_fixed(double(p.memory_mib) / 1024.0, 0), " GiB");
}

}  // namespace

std::string lambda_markdown(const LambdaTable& t) {
  std::ostringstream os;
  os << "Max batch per card: **this engine** / the 2020 study (device " << t.device << ", " << t.precision << ", "
     << t.attention << " attention; batch in sequences, images or tokens; 0: not even one fits; ≥: the search "
        "limit fit).\n\n";
  os << "| model | unit | config |";
  for (const auto& g : t.gpus) os << " " << gpu_heading(g) << " |";
  os << "\n|---|---|---|";
  for (size_t g = 0; g < t.gpus.size(); g++) os << "---:|";
  os << "\n";
  for (const auto& r : t.rows) {
    os << "| " << (r.model.empty() ? r.study : r.model) << " | " << r.unit << " | "
       << (r.status == "ok" ? r.config : r.status) << " |";
    for (const auto& c : r.cells) {
      std::string ours = r.status != "ok" ? "–" : str("**", c.first_fail == 0 ? "≥" : "", c.max_batch, "**");
      os << " " << ours << " / " << figure(c.batch_2020) << " |";
    }
    os << "\n";
  }
  bool cuda = t.device == "cuda";
  if (cuda) {
    os << "\nTraining throughput at that batch (items/s: sequences, images or target tokens): **this engine on this "
          "GPU, in an arena of the card's size** / the 2020 study on the card itself.\n\n| model | unit |";
    for (const auto& g : t.gpus) os << " " << g << " |";
    os << "\n|---|---|";
    for (size_t g = 0; g < t.gpus.size(); g++) os << "---:|";
    os << "\n";
    for (const auto& r : t.rows) {
      os << "| " << (r.model.empty() ? r.study : r.model) << " | " << r.unit << "/s |";
      for (const auto& c : r.cells) {
        std::string ours = !c.error.empty() ? "error" : c.throughput < 0 ? "–" : "**" + engine::format_fixed(c.throughput, 1) + "**";
        os << " " << ours << " / " << figure(c.throughput_2020) << " |";
      }
      os << "\n";
    }
    for (const auto& r : t.rows)
      for (const auto& c : r.cells)
        if (!c.error.empty()) os << "\n- " << r.model << " on " << c.gpu << ": " << c.error;
  }
  os << "\n" << t.rows.size() << " models, " << t.probes << " probes (each on a fresh arena, running the model's probe schedule: Model::probe_schedule), "
     << engine::format_fixed(t.seconds, 2) << " s.\n";
  return os.str();
}

std::string lambda_csv(const LambdaTable& t) {
  std::ostringstream os;
  os << "model,study_model,status,unit,config,gpu,arena_bytes,max_batch,first_fail,binding,batch_2020,"
        "throughput,throughput_2020,device,precision,attention\n";
  for (const auto& r : t.rows)
    for (const auto& c : r.cells)
      os << r.model << ',' << r.study << ",\"" << r.status << "\"," << r.unit << ',' << r.config << ',' << c.gpu << ','
         << c.capacity << ',' << (r.status == "ok" ? std::to_string(c.max_batch) : "") << ','
         << (r.status == "ok" ? std::to_string(c.first_fail) : "") << ',' << c.binding << ','
         << (c.batch_2020 < 0 ? "" : figure(c.batch_2020)) << ','
         << (c.throughput < 0 ? "" : engine::format_fixed(c.throughput, 2)) << ','
         << (c.throughput_2020 < 0 ? "" : figure(c.throughput_2020)) << ',' << t.device << ',' << t.precision << ','
         << t.attention << '\n';
  return os.str();
}

std::string lambda_json(const LambdaTable& t) {
  using engine::json::quote;
  std::ostringstream os;
  os << "{\"device\":" << quote(t.device) << ",\"precision\":" << quote(t.precision) << ",\"attention\":"
     << quote(t.attention) << ",\"seconds\":" << engine::format_fixed(t.seconds, 3) << ",\"probes\":" << t.probes
     << ",\"gpus\":[";
  for (size_t g = 0; g < t.gpus.size(); g++)
    os << (g ? "," : "") << "{\"name\":" << quote(t.gpus[g]) << ",\"arena_bytes\":"
       << gpu_arena_capacity(find_gpu_profile(t.gpus[g])) << "}";
  os << "],\"models\":[";
  for (size_t i = 0; i < t.rows.size(); i++) {
    const LambdaRow& r = t.rows[i];
    os << (i ? ",\n" : "\n") << "{\"model\":" << quote(r.model) << ",\"study_model\":" << quote(r.study)
       << ",\"status\":" << quote(r.status) << ",\"unit\":" << quote(r.unit) << ",\"config\":" << quote(r.config)
       << ",\"probes\":" << r.probes << ",\"seconds\":" << engine::format_fixed(r.seconds, 3) << ",\"cells\":[";
    for (size_t g = 0; g < r.cells.size(); g++) {
      const LambdaCell& c = r.cells[g];
      os << (g ? "," : "") << "{\"gpu\":" << quote(c.gpu);
      if (r.status == "ok")
        os << ",\"max_batch\":" << c.max_batch << ",\"first_fail\":" << c.first_fail << ",\"binding\":" << quote(c.binding);
      if (c.batch_2020 >= 0) os << ",\"batch_2020\":" << c.batch_2020;
      if (c.throughput >= 0) os << ",\"throughput\":" << engine::format_fixed(c.throughput, 3);
      if (c.throughput_2020 >= 0) os << ",\"throughput_2020\":" << c.throughput_2020;
      if (!c.error.empty()) os << ",\"error\":" << quote(c.error);
      os << "}";
    }
    os << "]}";
  }
  os << "\n]}\n";
  return os.str();
}

std::string lambda_svg(const LambdaTable& t) {
  std::vector<SvgChart> panels;
  for (const auto& r : t.rows) {
    SvgChart c;
    c.title = (r.model.empty() ? r.study : r.model) +
              (r.status == "ok" ? "" : r.status.rfind("error", 0) == 0 ? " (error)" : " (" + r.status + ")");
    c.x.label = "card memory (GiB)";
    c.y.label = "max batch (" + unit_word(r.unit) + ")";
    // The cards by memory; cards of equal memory share a point.
    std::vector<std::pair<double, size_t>> order;
    for (size_t g = 0; g < r.cells.size(); g++)
      order.push_back({double(find_gpu_profile(r.cells[g].gpu).memory_mib) / 1024.0, g});
    std::sort(order.begin(), order.end());
    SvgSeries ours{"this engine (" + t.device + ")", {}, {}, "#4e79a7", false, true};
    SvgSeries study{"2020 study", {}, {}, "#f28e2c", true, true};
    for (const auto& [gib, g] : order) {
      const LambdaCell& cell = r.cells[g];
      if (r.status == "ok") ours.x.push_back(gib), ours.y.push_back(double(cell.max_batch));
      if (cell.batch_2020 >= 0) study.x.push_back(gib), study.y.push_back(cell.batch_2020);
    }
    if (!ours.x.empty()) c.series.push_back(ours);
    if (!study.x.empty()) c.series.push_back(study);
    if (!c.series.empty()) panels.push_back(c);
  }
  ENGINE_CHECK(!panels.empty(), "engine_bench lambda: nothing to plot");
  return svg_grid(str("Max batch against card memory: this engine (", t.device, ", ", t.precision,
                      ") vs the 2020 study"),
                  panels, 4, 340, 270);
}

}  // namespace tools
