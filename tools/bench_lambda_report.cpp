// bench_lambda_report.cpp: engine_bench lambda's four reports (markdown, CSV, JSON, SVG) of a LambdaTable.
#include <algorithm>
#include <sstream>

#include "engine/format.h"
#include "engine/json.h"
#include "models/registry.h"
#include "tools/bench_lambda.h"
#include "tools/bench_scale.h"
#include "tools/gpu_profiles.h"
#include "tools/svg_plot.h"

namespace tools {

using engine::str;

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
     << t.attention << " attention"
     << (t.attention == "naive" ? "" : " where a model has it: " + models::models_taking(models::kFlash))
     << "; batch in sequences, images or tokens; 0: not even one fits; ≥: the search limit fit).\n\n";
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
        std::string ours = !c.error.empty()   ? "error"
                           : c.throughput < 0 ? "–"
                                              : "**" + engine::format_fixed(c.throughput, 1) + "**";
        os << " " << ours << " / " << figure(c.throughput_2020) << " |";
      }
      os << "\n";
    }
    for (const auto& r : t.rows)
      for (const auto& c : r.cells)
        if (!c.error.empty()) os << "\n- " << r.model << " on " << c.gpu << ": " << c.error;
  }
  os << "\n"
     << t.rows.size() << " models, " << t.probes
     << " probes (each on a fresh arena, running the model's probe schedule: Model::probe_schedule), "
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
         << r.attention << '\n';
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
        os << ",\"max_batch\":" << c.max_batch << ",\"first_fail\":" << c.first_fail
           << ",\"binding\":" << quote(c.binding);
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
