// bench_scale.cpp: the sweep, the fits and the analytic law (see bench_scale.h; the reports: bench_scale_report.cpp).
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
    ENGINE_CHECK(!s.empty() && *end == 0 && v >= 1, "--", flag, " ", spec, ": '", s, "' is not a positive integer",
                 forms);
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
  if (axis == ScaleAxis::world) return {};  // activations do not depend on the world size
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
  // flash with dropout keeps its decisions, one bit per (query, key) pair ([B, a, L, L rounded up to 64 / 8] bytes,
  // ops/attention.h), while the keys are short: L <= 8 x the head dim (BERT's 64: all 512 positions), L % 8 == 0.
  const bool keep_bits = flash && b.attention_dropout > 0 && b.hidden / b.heads == 64;
  // Per layer (models/README.md): naive sbh·64 + as²b·4·copies + 16·sb + sb + 4b; flash sbh·68 + 4·asb + 16·sb
  // (+ as²b/8, the keep bits).
  if (axis == ScaleAxis::seq) {
    const double B = double(batch);
    law.b = N * (flash ? 68 * B * h + 4 * a * B + 16 * B : 64 * B * h + 17 * B);
    law.c = flash ? (keep_bits ? N * a * B / 8 : 0) : N * 4 * copies * a * B;
    law.derivation =
        flash ? str("b = layers x (68·B·h + 4·a·B + 16·B) = ", N, " x (68·", batch, "·", b.hidden, " + 4·", b.heads,
                    "·", batch, " + 16·", batch, "); ",
                    keep_bits ? str("c = layers x heads x B / 8 = ", N, " x ", b.heads, " x ", batch,
                                    " / 8 (flash keeps no L x L probabilities, only its dropout decisions, one bit "
                                    "per pair, for L a multiple of 64 up to 512; other L multiples of 8 round up "
                                    "to 64 keys)")
                              : std::string("c = 0 (flash keeps no L x L tensor)"))
              : str("b = layers x (64·B·h + 17·B) = ", N, " x (64·", batch, "·", b.hidden, " + 17·", batch,
                    "); c = layers x 4 bytes x ", copies == 2 ? "2 (softmax output + dropped copy)" : "1",
                    " x heads x B = ", N, " x 4 x ", copies, " x ", b.heads, " x ", batch);
  } else {
    const double s = double(seq);
    const double keep = keep_bits && seq <= 512 && seq % 8 == 0 ? a * s * double((seq + 63) / 64 * 8) : 0;
    law.b = N * (flash ? 68 * s * h + 4 * a * s + 16 * s + keep : 64 * s * h + 4 * copies * a * s * s + 17 * s + 4);
    law.derivation = str("b = layers x per-sequence bytes of one layer at seq ", seq, " (",
                         flash ? (keep > 0 ? "68·s·h + 4·a·s + 16·s + the keep bits a·s·s/8" : "68·s·h + 4·a·s + 16·s")
                               : "64·s·h + 4·copies·a·s² + 17·s + 4",
                         ")");
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
  r.axis_name = o.axis == ScaleAxis::seq ? "seq" : o.axis == ScaleAxis::batch ? "batch" : "world";
  const engine::Generator saved_generator = engine::generator();
  int64_t fixed_batch = 0, fixed_seq = 0;
  for (size_t i = 0; i < o.points.size(); i++) {
    models::ModelConfig c = o.config;
    c.inference = c.inference || o.inference;
    ScalePoint p;
    p.x = o.points[i];
    if (o.axis == ScaleAxis::seq) c.seq = p.x;
    else if (o.axis == ScaleAxis::world)
      c.world_size = int(p.x), c.rank = 0;
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
        for (int step = 1; step <= o.steps; step++) {
          if (c.inference)
            model->eval_step(step);
          else
            model->train_step(step);
        }
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
      o.on_point(i + 1, o.points.size(),
                 str(r.axis_name, " ", p.x, p.fits ? ": peak " + engine::format_bytes(p.peak) : ": out of memory"));
  }
  engine::generator() = saved_generator;
  r.fixed = o.axis == ScaleAxis::seq ? str("batch ", fixed_batch, " ", unit_word(r.unit))
            : o.axis == ScaleAxis::world
                ? str("batch ", fixed_batch, " ", unit_word(r.unit), " per rank, ZeRO-", o.config.zero)
            : fixed_seq ? str("seq ", fixed_seq)
                        : std::string("the model's default length");
  r.analytic = bert_activation_law(o.config, o.axis, fixed_batch, fixed_seq);
  fit_scale(r);
  // The law is an estimate; the max batch (a batch sweep) or the longest sequence at the sweep's batch (a sequence
  // sweep) is cheap to probe (meta predicts the GPU exactly), so the table gives both and says which is which,
  // probed in the sweep's own mode (training or eval steps). Cards of equal memory share a search.
  if (o.axis != ScaleAxis::world) {
    models::ModelConfig c = o.config;
    MaxBatchOptions search;
    search.inference = o.inference || o.config.inference;
    if (o.axis == ScaleAxis::seq) {
      search.axis = SearchAxis::seq;
      c.batch = fixed_batch;
      c.seq = 0;
    }
    std::map<size_t, int64_t> probed;
    for (GpuLimit& lim : r.gpus) {
      auto it = probed.find(lim.capacity);
      if (it == probed.end())
        it = probed.emplace(lim.capacity, find_max_batch(c, engine::DeviceType::meta, lim.capacity, search).largest_fit)
                 .first;
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
  const bool world = o.axis == ScaleAxis::world;
  std::vector<double> xs;  // the law's variable: x, or 1 / N for the world axis
  for (const auto& p : r.points)
    if (p.fits) xs.push_back(world ? 1.0 / double(p.x) : double(p.x));
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
    if (used)
      fit_of(engine::category_name(Category(k)), [k](const ScalePoint& p) { return double(p.at_peak[size_t(k)]); });
  }
  fit_of("activation (own peak)", [](const ScalePoint& p) { return double(p.own_peak[size_t(Category::activation)]); });
  r.crossover = quadratic_crossover(r.fits.front().fit);
  r.activation_crossover = quadratic_crossover(r.fits.back().fit);
  for (const auto& g : gpu_profiles()) {
    GpuLimit lim;
    lim.gpu = g.name;
    lim.capacity = gpu_arena_capacity(g);
    if (world) {  // the smallest N with a + b / N <= capacity
      const PolyFit& f = r.fits.front().fit;
      const double room = double(lim.capacity) - f.coef[0];
      lim.max_x = room <= 0 ? -1 : f.coef[1] <= 0 ? 1 : std::max(1.0, std::ceil(f.coef[1] / room - 1e-9));
      lim.extrapolated = lim.max_x > double(r.points.back().x);
    } else {
      lim.max_x = solve_for_capacity(r.fits.front().fit, double(lim.capacity));
      lim.extrapolated = lim.max_x > xs.back();
    }
    r.gpus.push_back(lim);
  }
}

}  // namespace tools
