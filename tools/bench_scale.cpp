// bench_scale.cpp: the sweep, the fits, the analytic law and the reports (see bench_scale.h).
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
// Points

std::vector<int64_t> parse_points(const std::string& spec, const std::string& flag) {
  const std::string forms = " (expected A:B for half-octave steps, A:B:STEP, or a list A,B,C; 1 <= A < B)";
  auto integer = [&](const std::string& s) {
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    ENGINE_CHECK(!s.empty() && *end == 0 && v >= 1, "--", flag, " ", spec, ": '", s, "' is not a positive integer", forms);
    return int64_t(v);
  };
  std::vector<int64_t> out;
  if (spec.find(',') != std::string::npos) {
    std::stringstream is(spec);
    for (std::string piece; std::getline(is, piece, ',');) out.push_back(integer(piece));
  } else {
    std::vector<std::string> parts;
    std::stringstream is(spec);
    for (std::string piece; std::getline(is, piece, ':');) parts.push_back(piece);
    ENGINE_CHECK(parts.size() == 2 || parts.size() == 3, "--", flag, " ", spec, ": not a range", forms);
    int64_t a = integer(parts[0]), b = integer(parts[1]);
    ENGINE_CHECK(a < b, "--", flag, " ", spec, ": the range is empty or backwards", forms);
    if (parts.size() == 3) {
      int64_t step = integer(parts[2]);
      for (int64_t x = a; x <= b; x += step) out.push_back(x);
    } else {  // a·2^k and 1.5·a·2^k (rounded; a value that rounds onto the previous one is skipped)
      for (double x = double(a); x <= double(b); x *= 2)
        for (double v : {x, x * 1.5})
          if (v <= double(b) && (out.empty() || std::llround(v) > out.back())) out.push_back(std::llround(v));
    }
    if (out.back() != b) out.push_back(b);
  }
  for (size_t i = 1; i < out.size(); i++)
    ENGINE_CHECK(out[i] > out[i - 1], "--", flag, " ", spec, ": values must increase", forms);
  ENGINE_CHECK(out.size() <= 256, "--", flag, " ", spec, ": ", out.size(), " points is too many (at most 256)");
  return out;
}

// ---------------------------------------------------------------------------------------------------
// The analytic law

AnalyticLaw bert_activation_law(const models::ModelConfig& config, ScaleAxis axis, int64_t batch, int64_t seq) {
  AnalyticLaw law;
  const std::string& m = config.name;
  if (m != "bert_base" && m != "bert_squad" && m != "mtdnn") return law;
  if (config.precision != "fp32" || config.recompute != "none") return law;
  std::string size = !config.size.empty() ? config.size : m == "mtdnn" ? "large" : "base";
  models::bert::BertConfig b = models::bert::BertConfig::of_size(size);
  if (size == "tiny") b.hidden_dropout = b.attention_dropout = 0;  // the recipes turn dropout off for tiny
  const double N = double(b.layers), h = double(b.hidden), a = double(b.heads);
  const bool flash = config.attention == "flash";
  const double copies = b.attention_dropout > 0 ? 2 : 1;  // softmax output, and its dropped copy
  // Per layer (models/README.md): naive sbh·64 + as²b·4·copies + 16·sb + sb + 4b; flash sbh·68 + 4·asb + 16·sb.
  if (axis == ScaleAxis::seq) {
    const double B = double(batch);
    law.b = N * (flash ? 68 * B * h + 4 * a * B + 16 * B : 64 * B * h + 17 * B);
    law.c = flash ? 0 : N * 4 * copies * a * B;
    law.derivation = flash ? str("b = layers x (68·B·h + 4·a·B + 16·B) = ", N, " x (68·", batch, "·", b.hidden, " + 4·", b.heads,
                                 "·", batch, " + 16·", batch, "); c = 0 (flash keeps no L x L tensor)")
                           : str("b = layers x (64·B·h + 17·B) = ", N, " x (64·", batch, "·", b.hidden, " + 17·", batch,
                                 "); c = layers x 4 bytes x ", copies == 2 ? "2 (softmax output + dropped copy)" : "1",
                                 " x heads x B = ", N, " x 4 x ", copies, " x ", b.heads, " x ", batch);
  } else {
    const double s = double(seq);
    law.b = N * (flash ? 68 * s * h + 4 * a * s + 16 * s : 64 * s * h + 4 * copies * a * s * s + 17 * s + 4);
    law.derivation = str("b = layers x per-sequence bytes of one layer at seq ", seq, " (",
                         flash ? "68·s·h + 4·a·s + 16·s" : "64·s·h + 4·copies·a·s² + 17·s + 4", ")");
  }
  law.present = true;
  return law;
}

// ---------------------------------------------------------------------------------------------------
// The sweep

namespace {

int64_t parse_seq_in_summary(const std::string& summary) {
  size_t p = summary.find("seq ");
  return p == std::string::npos ? 0 : std::strtoll(summary.c_str() + p + 4, nullptr, 10);
}

}  // namespace

std::string unit_word(const std::string& unit) {
  if (unit == "seq") return "sequences";
  if (unit == "img") return "images";
  if (unit == "tok") return "tokens";
  return unit;
}

ScaleResult run_scale(const ScaleOptions& o) {
  ENGINE_CHECK(o.points.size() >= 2, "engine_bench scale: give at least two points");
  ENGINE_CHECK(o.steps >= 1, "engine_bench scale: --steps must be at least 1");
  ScaleResult r;
  r.model = o.config.name;
  r.options = o;
  r.axis_name = o.axis == ScaleAxis::seq ? "seq" : "batch";
  const engine::Generator saved_generator = engine::generator();
  int64_t fixed_batch = 0, fixed_seq = 0;
  for (size_t i = 0; i < o.points.size(); i++) {
    models::ModelConfig c = o.config;
    ScalePoint p;
    p.x = o.points[i];
    if (o.axis == ScaleAxis::seq) c.seq = p.x;
    else (counts_tokens(c) ? c.tokens : c.batch) = p.x;
    auto device = engine::Device::create(o.device, o.capacity);
    {
      engine::DeviceGuard guard(device);
      try {
        std::unique_ptr<models::Model> model = models::create_model(c);
        if (r.summary.empty()) {
          r.summary = model->summary();
          r.unit = model->item_unit();
          fixed_batch = model->batch_size();
          fixed_seq = o.config.seq ? o.config.seq : parse_seq_in_summary(r.summary);
        }
        for (int step = 1; step <= o.steps; step++) model->train_step(step);
        p.fits = true;
      } catch (const engine::OutOfMemory& e) {
        std::string what = e.what();
        p.failure = what.substr(0, what.find('\n'));
      } catch (const std::exception& e) {
        engine::generator() = saved_generator;
        throw engine::Error(str("engine_bench scale: ", o.config.name, " at ", r.axis_name, " ", p.x, ": ", e.what()));
      }
    }
    const engine::Ledger& l = device->ledger();
    p.peak = l.peak_bytes();
    for (int k = 0; k < kNumCategories; k++) {
      p.at_peak[size_t(k)] = l.peak_breakdown(Category(k));
      p.own_peak[size_t(k)] = l.peak_bytes(Category(k));
    }
    r.points.push_back(p);
    if (o.on_point)
      o.on_point(i + 1, o.points.size(), str(r.axis_name, " ", p.x, p.fits ? ": peak " + engine::format_bytes(p.peak) : ": out of memory"));
  }
  engine::generator() = saved_generator;
  r.fixed = o.axis == ScaleAxis::seq ? str("batch ", fixed_batch, " ", unit_word(r.unit))
                                     : fixed_seq ? str("seq ", fixed_seq) : std::string("the model's default length");
  r.analytic = bert_activation_law(o.config, o.axis, fixed_batch, fixed_seq);
  fit_scale(r);
  // The law is an estimate; for a batch sweep the max batch itself is cheap to probe (meta predicts the GPU
  // exactly), so the table gives both and says which is which. Cards of equal memory share a search.
  if (o.axis == ScaleAxis::batch) {
    std::map<size_t, int64_t> probed;
    for (GpuLimit& lim : r.gpus) {
      auto it = probed.find(lim.capacity);
      if (it == probed.end())
        it = probed.emplace(lim.capacity, find_max_batch(o.config, engine::DeviceType::meta, lim.capacity).largest_fit).first;
      lim.probed = it->second;
    }
  }
  return r;
}

void fit_scale(ScaleResult& r) {
  const ScaleOptions& o = r.options;
  r.fits.clear();
  r.gpus.clear();
  const int degree = o.axis == ScaleAxis::seq ? 2 : 1;
  std::vector<double> xs;
  for (const auto& p : r.points)
    if (p.fits) xs.push_back(double(p.x));
  ENGINE_CHECK(int(xs.size()) >= degree + 1, "engine_bench scale: only ", xs.size(), " of ", r.points.size(),
               " points fit the arena; a ", degree == 2 ? "quadratic" : "linear", " law needs ", degree + 1,
               " (use a shorter range or a larger --memory)");
  auto fit_of = [&](const std::string& name, const std::function<double(const ScalePoint&)>& y) {
    std::vector<double> ys;
    for (const auto& p : r.points)
      if (p.fits) ys.push_back(y(p));
    r.fits.push_back({name, fit_polynomial(xs, ys, degree)});
  };
  fit_of("total", [](const ScalePoint& p) { return double(p.peak); });
  for (int k = 0; k < kNumCategories; k++) {
    bool used = false;
    for (const auto& p : r.points) used |= p.fits && p.at_peak[size_t(k)] > 0;
    if (used) fit_of(engine::category_name(Category(k)), [k](const ScalePoint& p) { return double(p.at_peak[size_t(k)]); });
  }
  fit_of("activation (own peak)", [](const ScalePoint& p) { return double(p.own_peak[size_t(Category::activation)]); });
  r.crossover = quadratic_crossover(r.fits.front().fit);
  r.activation_crossover = quadratic_crossover(r.fits.back().fit);
  for (const auto& g : gpu_profiles()) {
    GpuLimit lim;
    lim.gpu = g.name;
    lim.capacity = gpu_arena_capacity(g);
    lim.max_x = solve_for_capacity(r.fits.front().fit, double(lim.capacity));
    lim.extrapolated = lim.max_x > xs.back();
    r.gpus.push_back(lim);
  }
}

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

const char* x_letter(const ScaleResult& r) { return r.options.axis == ScaleAxis::seq ? "L" : "B"; }

std::string law_text(const ScaleResult& r, const PolyFit& f) {
  std::string x = x_letter(r);
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
  return r.options.axis == ScaleAxis::seq ? "sequence length L (tokens)" : "batch B (" + unit_word(r.unit) + ")";
}

}  // namespace

std::string scale_markdown(const ScaleResult& r) {
  std::ostringstream os;
  const bool seq = r.options.axis == ScaleAxis::seq;
  const std::string x = x_letter(r);
  os << "## Memory scaling of " << r.model << " with " << (seq ? "sequence length" : "batch size") << " ("
     << config_text(r) << ")\n\n" << r.summary << "\n\n";
  os << "Live bytes at the step's peak, by category (GiB; " << r.options.steps << " training steps per point):\n\n| "
     << r.axis_name << " | fits | peak |";
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
  os << "\n### Fitted laws: bytes = a + b·" << x << (seq ? " + c·" + x + "²" : "") << " (least squares over the "
     << "points that fit)\n\n| memory | a (GiB) | b (bytes per " << (seq ? "token" : unit_word(r.unit).substr(0, unit_word(r.unit).size() - 1))
     << ") |" << (seq ? " c (bytes per token²) |" : "") << " largest residual |\n|---|---:|---:|" << (seq ? "---:|" : "")
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
       << (seq ? "c is the attention probabilities [B, heads, L, L] kept for backward, the only quadratic term, so the "
                 "fitted c should equal the analytic one; b also counts what lies outside the layers (embeddings, "
                 "heads, loss), so the fitted b is larger than the layers' part.\n"
               : "b is the bytes one more sequence adds; the fitted b also counts what lies outside the layers "
                 "(embeddings, heads, loss).\n");
  }
  if (seq)
    os << "\nThe quadratic term overtakes the linear one (c·L² > b·L) at L = b / c = " << num(r.crossover)
       << " tokens for the total, " << num(r.activation_crossover) << " for the saved activations.\n";
  auto law = [](const GpuLimit& g) {
    std::string v = g.max_x < 0 ? "none (the fixed part alone is larger)" : std::isinf(g.max_x) ? "unbounded" : str(int64_t(g.max_x));
    if (g.extrapolated && g.max_x >= 0 && !std::isinf(g.max_x)) v += " (extrapolated)";
    return v;
  };
  if (seq) {
    os << "\n### Longest sequence per GPU, estimated by the law (total law = the card's arena; not probed)\n\n"
          "| gpu | arena | longest L (the law's estimate) |\n|---|---:|---:|\n";
    for (const auto& g : r.gpus) os << "| " << g.gpu << " | " << engine::format_bytes(g.capacity) << " | " << law(g) << " |\n";
    os << "\nextrapolated: beyond the longest L measured, so a prediction of the law (a model with learned "
          "positions, as BERT's 512, cannot run longer sequences at all).\n";
  } else {
    os << "\n### Largest batch per GPU\n\n| gpu | arena | max batch (probed) | the law's estimate |\n|---|---:|---:|---:|\n";
    for (const auto& g : r.gpus)
      os << "| " << g.gpu << " | " << engine::format_bytes(g.capacity) << " | " << g.probed << " | " << law(g) << " |\n";
    os << "\nmax batch (probed): the largest batch that trains in the card's arena, found on meta by the search of "
          "`engine_train --find-max-batch` (each probe a fresh arena; meta predicts the GPU exactly): this is the max "
          "batch. The law's estimate solves the fitted total law for the arena; it can differ by a batch or two "
          "(fragmentation, rounding to 256 bytes, steps in the law); extrapolated: beyond the largest batch measured.\n";
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
    os << (i ? "," : "") << "\n{\"memory\":" << quote(r.fits[i].name) << ",\"a\":" << f.coef[0] << ",\"b\":" << f.coef[1]
       << ",\"c\":" << f.coef[2] << ",\"max_residual\":" << f.max_residual << "}";
  }
  os << "],\n\"analytic\":";
  if (r.analytic.present)
    os << "{\"b\":" << r.analytic.b << ",\"c\":" << r.analytic.c << ",\"derivation\":" << quote(r.analytic.derivation) << "}";
  else
    os << "null";
  os << ",\"crossover\":" << jnum(r.crossover) << ",\"activation_crossover\":" << jnum(r.activation_crossover)
     << ",\n\"gpus\":[";
  for (size_t i = 0; i < r.gpus.size(); i++)
    os << (i ? "," : "") << "{\"gpu\":" << quote(r.gpus[i].gpu) << ",\"arena_bytes\":" << r.gpus[i].capacity
       << ",\"law_max_x\":" << jnum(r.gpus[i].max_x) << ",\"extrapolated\":" << (r.gpus[i].extrapolated ? "true" : "false")
       << (r.gpus[i].probed >= 0 ? ",\"max_batch_probed\":" + std::to_string(r.gpus[i].probed) : std::string()) << "}";
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
                     Category::temp, Category::activation}) {
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
    if (double(cap) / double(1 << 30) <= top * 1.15) cards[cap] += (cards[cap].empty() ? "" : ", ") + std::string(g.name);
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
  const bool seq = r.options.axis == ScaleAxis::seq;
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
      act_measured.x.push_back(double(p.x)), act_measured.y.push_back(double(p.own_peak[size_t(Category::activation)]) / double(1 << 30));
    }
  SvgSeries fitted{seq ? "fit a + b·L + c·L² (total)" : "fit a + b·B (total)", {}, {}, "#222222", true, false};
  SvgSeries linear{"a + b·L: the total without its quadratic term", {}, {}, "#59a14f", true, false};
  SvgSeries analytic{seq ? "analytic: layers' activations b·L + c·L² (Korthikanti)" : "analytic: layers' activations b·B (Korthikanti)",
                     {}, {}, "#af7aa1", true, false};
  double x0 = measured.x.front(), x1 = measured.x.back();
  for (int i = 0; i <= 40; i++) {
    double x = x0 + (x1 - x0) * i / 40.0;
    fitted.x.push_back(x), fitted.y.push_back(total.at(x) / double(1 << 30));
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
