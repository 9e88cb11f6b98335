// bench_scale_report.cpp: engine_bench scale's reports (markdown, CSV, JSON, the two SVG plots).
#include "tools/bench_scale.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "engine/format.h"
#include "engine/json.h"
#include "engine/rng.h"
#include "models/bert/encoder.h"
#include "models/registry.h"
#include "tools/gpu_profiles.h"
#include "tools/max_batch.h"
#include "tools/svg_plot.h"

namespace tools {

using engine::Category;
using engine::kNumCategories;
using engine::str;

// ---------------------------------------------------------------------------------------------------
// Reports

namespace {

// Coefficients: one decimal below 10^4, whole numbers with thousands separators above.
std::string num(double v) {
  if (std::isinf(v)) return "never";
  char buf[64];
  if (std::fabs(v) < 1e4) {
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.0f", std::fabs(v));
  std::string digits = buf, out;
  for (size_t i = 0; i < digits.size(); i++) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (v < 0 ? "-" : "") + out;
}

std::string gib(double bytes) { return engine::format_fixed(bytes / double(1 << 30), 2); }

const char* x_letter(const ScaleResult& r) {
  return r.options.axis == ScaleAxis::seq ? "L" : r.options.axis == ScaleAxis::batch ? "B" : "N";
}

std::string law_text(const ScaleResult& r, const PolyFit& f) {
  std::string x = x_letter(r);
  if (r.options.axis == ScaleAxis::world) return str(gib(f.coef[0]), " GiB + ", gib(f.coef[1]), " GiB / N");
  std::string s = str(gib(f.coef[0]), " GiB + ", num(f.coef[1]), " bytes·", x);
  if (f.degree == 2) s += str(" + ", num(f.coef[2]), " bytes·", x, "²");
  return s;
}

std::string config_text(const ScaleResult& r) {
  const auto& c = r.options.config;
  return str(r.fixed, ", ", c.precision, ", ", c.attention, " attention, recompute ", c.recompute, ", ",
             engine::device_type_name(r.options.device));
}

std::string x_label(const ScaleResult& r) {
  if (r.options.axis == ScaleAxis::world) return "world size N (ranks), one rank's memory";
  return r.options.axis == ScaleAxis::seq ? "sequence length L (tokens)" : "batch B (" + unit_word(r.unit) + ")";
}

// The table of the points, each category's bytes at the step's peak (the columns after "| x | fits | peak |").
void points_table(std::ostringstream& os, const ScaleResult& r) {
  std::vector<int> used;
  for (int k = 0; k < kNumCategories; k++) {
    bool any = false;
    for (const auto& p : r.points) any |= p.at_peak[size_t(k)] > 0;
    if (any) used.push_back(k), os << " " << engine::category_name(Category(k)) << " |";
  }
  os << "\n|---:|:---|---:|";
  for (size_t i = 0; i < used.size(); i++) os << "---:|";
  os << "\n";
  for (const auto& p : r.points) {
    os << "| " << p.x << " | " << (p.fits ? "yes" : "no") << " | " << gib(double(p.peak)) << " |";
    for (int k : used) os << " " << gib(double(p.at_peak[size_t(k)])) << " |";
    os << "\n";
  }
}

// The world axis's report: the points, the laws a + b / N, the smallest world per card.
std::string world_markdown(const ScaleResult& r) {
  std::ostringstream os;
  os << "## Memory of one rank of " << r.model << " against the world size (" << config_text(r) << ")\n\n"
     << r.summary << "\n\nLive bytes of rank 0 at its step's peak, by category (GiB; " << r.options.steps
     << " training steps per point; the meta device predicts the rank with no communication; N = 1 is one process, "
        "without data parallel's buckets):\n\n| N | fits | peak |";
  points_table(os, r);
  os << "\n### Fitted laws: bytes = a + b / N (least squares in 1 / N over the points that fit)\n\n"
        "| memory | a (GiB: what every rank holds whole) | b (GiB: what is sharded over the N ranks) | largest "
        "residual |\n|---|---:|---:|---:|\n";
  for (const auto& f : r.fits)
    os << "| " << f.name << " | " << gib(f.fit.coef[0]) << " | " << gib(f.fit.coef[1]) << " | "
       << engine::format_bytes(size_t(std::max(0.0, f.fit.max_residual))) << " |\n";
  os << "\n### Smallest world per GPU (the total law = the card's arena; not probed)\n\n| gpu | arena | smallest N "
        "|\n|---|---:|---:|\n";
  for (const auto& g : r.gpus)
    os << "| " << g.gpu << " | " << engine::format_bytes(g.capacity) << " | "
       << (g.max_x < 0 ? std::string("none (what every rank holds whole is larger)")
                       : str(int64_t(g.max_x), g.extrapolated ? " (extrapolated)" : ""))
       << " |\n";
  os << "\nextrapolated: beyond the largest N measured. A rank's memory falls as 1 / N only in the sharded states "
        "(ZeRO-1: the optimizer state and f32 masters; ZeRO-2: the gradients too; ZeRO-3: the parameters too, but "
        "for the root unit and the layers gathered at the moment); activations and the gradient buckets stay whole "
        "on every rank.\n";
  return os.str();
}

}  // namespace

std::string scale_markdown(const ScaleResult& r) {
  if (r.options.axis == ScaleAxis::world) return world_markdown(r);
  std::ostringstream os;
  const bool seq = r.options.axis == ScaleAxis::seq;
  const std::string x = x_letter(r);
  os << "## Memory scaling of " << r.model << " with " << (seq ? "sequence length" : "batch size") << " ("
     << config_text(r) << ")\n\n" << r.summary << "\n\n";
  os << "Live bytes at the step's peak, by category (GiB; " << r.options.steps
     << (r.options.inference ? (r.options.config.generate > 0 ? " decoding" : " eval") : " training")
     << " steps per point):\n\n| " << r.axis_name << " | fits | peak |";
  points_table(os, r);
  os << "\n### Fitted laws: bytes = a + b·" << x << (seq ? " + c·" + x + "²" : "") << " (least squares over the "
     << "points that fit)\n\n| memory | a (GiB) | b (bytes per "
     << (seq ? "token" : unit_word(r.unit).substr(0, unit_word(r.unit).size() - 1)) << ") |"
     << (seq ? " c (bytes per token²) |" : "") << " largest residual |\n|---|---:|---:|" << (seq ? "---:|" : "")
     << "---:|\n";
  for (const auto& f : r.fits) {
    os << "| " << f.name << " | " << gib(f.fit.coef[0]) << " | " << num(f.fit.coef[1]) << " |";
    if (seq) os << " " << num(f.fit.coef[2]) << " |";
    os << " " << engine::format_bytes(size_t(f.fit.max_residual)) << " |\n";
  }
  if (r.analytic.present) {
    os << "| analytic: the layers' saved activations (Korthikanti et al., restated in models/README.md) | – | "
       << num(r.analytic.b) << " |" << (seq ? " " + num(r.analytic.c) + " |" : "") << " |\n";
    os << "\nAnalytic law: " << r.analytic.derivation << ". Compare it with the row \"activation (own peak)\": "
       << (seq ? "c is what attention keeps per (query, key) pair for backward (naive: the probabilities [B, heads, L, "
                 "L]; flash: at most its dropout keep bits), the only quadratic term, so the fitted c should equal the "
                 "analytic one; b also counts what lies outside the layers (embeddings, heads, loss), so the fitted b "
                 "is larger than the layers' part.\n"
               : "b is the bytes one more sequence adds; the fitted b also counts what lies outside the layers "
                 "(embeddings, heads, loss).\n");
  }
  if (seq)
    os << "\nThe quadratic term overtakes the linear one (c·L² > b·L) at L = b / c = " << num(r.crossover)
       << " tokens for the total, " << num(r.activation_crossover) << " for the saved activations.\n";
  auto law = [](const GpuLimit& g) {
    std::string v = g.max_x < 0           ? "none (the fixed part alone is larger)"
                    : std::isinf(g.max_x) ? "unbounded"
                                          : str(int64_t(g.max_x));
    if (g.extrapolated && g.max_x >= 0 && !std::isinf(g.max_x)) v += " (extrapolated)";
    return v;
  };
  if (seq) {
    os << "\n### Longest sequence per GPU at " << r.fixed
       << "\n\n"
          "| gpu | arena | longest L (probed) | the law's estimate |\n|---|---:|---:|---:|\n";
    for (const auto& g : r.gpus)
      os << "| " << g.gpu << " | " << engine::format_bytes(g.capacity) << " | " << g.probed << " | " << law(g)
         << " |\n";
    os << "\nlongest L (probed): the longest sequence that trains in the card's arena at that batch, found on meta by "
          "the search of `engine_train --find-max-seq` (each probe a fresh arena), up to the model's learned positions "
          "(BERT's 512: a model with learned positions cannot run longer sequences at all). The law's estimate solves "
          "the fitted total law for the arena; extrapolated: beyond the longest L measured.\n";
  } else {
    os << "\n### Largest batch per GPU\n\n| gpu | arena | max batch (probed) | the law's estimate "
          "|\n|---|---:|---:|---:|\n";
    for (const auto& g : r.gpus)
      os << "| " << g.gpu << " | " << engine::format_bytes(g.capacity) << " | " << g.probed << " | " << law(g)
         << " |\n";
    os << "\nmax batch (probed): the largest batch that trains in the card's arena, found on meta by the search of "
          "`engine_train --find-max-batch` (each probe a fresh arena; meta predicts the GPU exactly): this is the max "
          "batch. The law's estimate solves the fitted total law for the arena; it can differ by a batch or two "
          "(fragmentation, rounding to 256 bytes, steps in the law); extrapolated: beyond the largest batch "
          "measured.\n";
  }
  return os.str();
}

std::string scale_csv(const ScaleResult& r) {
  std::ostringstream os;
  os << r.axis_name << ",fits,peak";
  for (int k = 0; k < kNumCategories; k++) os << ",at_peak_" << engine::category_name(Category(k));
  for (int k = 0; k < kNumCategories; k++) os << ",own_peak_" << engine::category_name(Category(k));
  os << "\n";
  for (const auto& p : r.points) {
    os << p.x << ',' << (p.fits ? 1 : 0) << ',' << p.peak;
    for (size_t k = 0; k < size_t(kNumCategories); k++) os << ',' << p.at_peak[k];
    for (size_t k = 0; k < size_t(kNumCategories); k++) os << ',' << p.own_peak[k];
    os << "\n";
  }
  return os.str();
}

std::string scale_json(const ScaleResult& r) {
  using engine::json::quote;
  auto jnum = [](double v) { return std::isinf(v) ? std::string("null") : str(v); };
  std::ostringstream os;
  os.precision(17);
  os << "{\"model\":" << quote(r.model) << ",\"axis\":" << quote(r.axis_name) << ",\"fixed\":" << quote(r.fixed)
     << ",\"unit\":" << quote(r.unit) << ",\"precision\":" << quote(r.options.config.precision) << ",\"attention\":"
     << quote(r.options.config.attention) << ",\"device\":" << quote(engine::device_type_name(r.options.device))
     << ",\n\"points\":[";
  for (size_t i = 0; i < r.points.size(); i++) {
    const ScalePoint& p = r.points[i];
    os << (i ? "," : "") << "\n{\"x\":" << p.x << ",\"fits\":" << (p.fits ? "true" : "false") << ",\"peak\":" << p.peak
       << ",\"at_peak\":{";
    for (int k = 0; k < kNumCategories; k++)
      os << (k ? "," : "") << quote(engine::category_name(Category(k))) << ":" << p.at_peak[size_t(k)];
    os << "},\"own_peak\":{";
    for (int k = 0; k < kNumCategories; k++)
      os << (k ? "," : "") << quote(engine::category_name(Category(k))) << ":" << p.own_peak[size_t(k)];
    os << "}}";
  }
  os << "],\n\"fits\":[";
  for (size_t i = 0; i < r.fits.size(); i++) {
    const PolyFit& f = r.fits[i].fit;
    os << (i ? "," : "") << "\n{\"memory\":" << quote(r.fits[i].name) << ",\"a\":" << f.coef[0]
       << ",\"b\":" << f.coef[1] << ",\"c\":" << f.coef[2] << ",\"max_residual\":" << f.max_residual << "}";
  }
  os << "],\n\"analytic\":";
  if (r.analytic.present)
    os << "{\"b\":" << r.analytic.b << ",\"c\":" << r.analytic.c << ",\"derivation\":" << quote(r.analytic.derivation)
       << "}";
  else
    os << "null";
  os << ",\"crossover\":" << jnum(r.crossover) << ",\"activation_crossover\":" << jnum(r.activation_crossover)
     << ",\n\"gpus\":[";
  for (size_t i = 0; i < r.gpus.size(); i++)
    os << (i ? "," : "") << "{\"gpu\":" << quote(r.gpus[i].gpu) << ",\"arena_bytes\":" << r.gpus[i].capacity
       << ",\"law_max_x\":" << jnum(r.gpus[i].max_x)
       << ",\"extrapolated\":" << (r.gpus[i].extrapolated ? "true" : "false")
       << (r.gpus[i].probed >= 0 ? str(",\"max_", r.axis_name, "_probed\":", r.gpus[i].probed) : std::string()) << "}";
  os << "]}\n";
  return os.str();
}

std::string scale_stacked_svg(const ScaleResult& r) {
  SvgChart c;
  c.title = str(r.model, ": memory at the peak by category");
  c.subtitle = config_text(r);
  c.x.label = x_label(r);
  c.y.label = "live memory at the peak (GiB)";
  c.stacked = true;
  std::vector<double> xs;
  double top = 0;
  for (const auto& p : r.points)
    if (p.fits) xs.push_back(double(p.x)), top = std::max(top, double(p.peak) / double(1 << 30));
  // Bottom to top: what does not grow first (parameters, optimizer, gradients), then what does.
  for (Category k : {Category::param, Category::optimizer, Category::grad, Category::input, Category::workspace,
                     Category::comm, Category::kv_cache, Category::temp, Category::activation}) {
    SvgSeries s{engine::category_name(k), xs, {}, category_color(engine::category_name(k)), false, true};
    bool any = false;
    for (const auto& p : r.points)
      if (p.fits) s.y.push_back(double(p.at_peak[size_t(k)]) / double(1 << 30)), any |= p.at_peak[size_t(k)] > 0;
    if (any) c.series.push_back(s);
  }
  // Cards whose arena lies within the plotted range, one line per distinct size.
  std::map<size_t, std::string> cards;
  for (const auto& g : gpu_profiles()) {
    size_t cap = gpu_arena_capacity(g);
    if (double(cap) / double(1 << 30) <= top * 1.15)
      cards[cap] += (cards[cap].empty() ? "" : ", ") + std::string(g.name);
  }
  // Sizes closer than 5% of the plot's height share one line (their labels would overlap).
  std::vector<std::pair<double, std::string>> marks;
  for (const auto& [cap, names] : cards) {
    double v = double(cap) / double(1 << 30);
    if (!marks.empty() && v - marks.back().first < 0.05 * top * 1.15) marks.back().second += ", " + names;
    else marks.push_back({v, names});
  }
  for (const auto& [v, names] : marks) c.y_marks.push_back({v, names + " arena " + gib(v * double(1 << 30)) + " GiB"});
  c.note = "total = " + law_text(r, r.fits.front().fit) + " (least squares)";
  return svg_chart(c, 820, 500);
}

std::string scale_fit_svg(const ScaleResult& r) {
  SvgChart c;
  const bool seq = r.options.axis == ScaleAxis::seq, world = r.options.axis == ScaleAxis::world;
  c.title = str(r.model, ": measured memory and the fitted law");
  c.subtitle = config_text(r);
  c.x.label = x_label(r);
  c.y.label = "memory (GiB)";
  const PolyFit& total = r.fits.front().fit;
  const PolyFit& act = r.fits.back().fit;
  SvgSeries measured{"measured peak (total)", {}, {}, "#4e79a7", false, true};
  SvgSeries act_measured{"measured saved activations (own peak)", {}, {}, "#e15759", false, true};
  for (const auto& p : r.points)
    if (p.fits) {
      measured.x.push_back(double(p.x)), measured.y.push_back(double(p.peak) / double(1 << 30));
      act_measured.x.push_back(double(p.x)),
          act_measured.y.push_back(double(p.own_peak[size_t(Category::activation)]) / double(1 << 30));
    }
  SvgSeries fitted{seq     ? "fit a + b·L + c·L² (total)"
                   : world ? "fit a + b / N (total)"
                           : "fit a + b·B (total)",
                   {},
                   {},
                   "#222222",
                   true,
                   false};
  SvgSeries linear{"a + b·L: the total without its quadratic term", {}, {}, "#59a14f", true, false};
  SvgSeries analytic{seq ? "analytic: layers' activations b·L + c·L² (Korthikanti)"
                         : "analytic: layers' activations b·B (Korthikanti)",
                     {},
                     {},
                     "#af7aa1",
                     true,
                     false};
  double x0 = measured.x.front(), x1 = measured.x.back();
  for (int i = 0; i <= 40; i++) {
    double x = x0 + (x1 - x0) * i / 40.0;
    fitted.x.push_back(x), fitted.y.push_back((world ? total.at(1 / x) : total.at(x)) / double(1 << 30));
    linear.x.push_back(x), linear.y.push_back((total.coef[0] + total.coef[1] * x) / double(1 << 30));
    analytic.x.push_back(x), analytic.y.push_back((r.analytic.b * x + r.analytic.c * x * x) / double(1 << 30));
  }
  c.series = {measured, fitted};
  if (seq) c.series.push_back(linear);
  c.series.push_back(act_measured);
  if (r.analytic.present) c.series.push_back(analytic);
  c.note = seq ? str("c·L² overtakes b·L at L = ", num(r.crossover), " (total), ", num(r.activation_crossover),
                     " (activations); activations = ", law_text(r, act))
               : str("total = ", law_text(r, total), "; activations = ", law_text(r, act));
  return svg_chart(c, 820, 500);
}

}  // namespace tools
