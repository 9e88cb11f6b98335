// bench_scale.h: memory against sequence length or batch size, per ledger category, with fitted laws.
//
// Each point trains `steps` steps of a fresh model on a fresh device (meta by default: the same numbers
// as the GPU, in milliseconds) and records the live bytes by category at the step's peak, and each
// category's own peak. Per category (and for the total) a least-squares law is fitted over the points
// that fit: bytes = a + b·L + c·L² for a sequence sweep, a + b·B for a batch sweep. For the BERT family
// the fitted activation law is printed beside the analytic one (models/README.md: Korthikanti et al.'s
// per-layer count restated for this engine, times the number of layers), with which coefficient is
// which. From the total law: the length where the quadratic term overtakes the linear one (b / c), and
// the longest sequence (or largest batch) that each GPU profile's arena holds.
#pragma once
#include <array>
#include <functional>
#include <string>
#include <vector>

#include "engine/device.h"
#include "models/model.h"
#include "tools/bench_fit.h"

namespace tools {

// world: the memory of one rank of a data-parallel world of N ranks (meta predicts rank 0 with no communication;
// config.zero sets the ZeRO stage), whose law is a + b / N (the sharded part falls as 1 / N): fitted in 1 / N, and
// the card limit is the smallest N whose rank fits.
enum class ScaleAxis { seq, batch, world };

struct ScaleOptions {
  models::ModelConfig config;   // the fixed part (name, size, batch or seq, precision, attention, recompute)
  ScaleAxis axis = ScaleAxis::seq;
  std::vector<int64_t> points;  // sequence lengths or batch sizes, increasing
  engine::DeviceType device = engine::DeviceType::meta;
  size_t capacity = size_t(1) << 40;  // meta: 1 TiB, "measure, refuse nothing"
  int steps = 2;
  bool inference = false;  // eval steps (config.inference: no training state); a decoder LM's with --generate
  std::function<void(size_t done, size_t total, const std::string& note)> on_point;
};

struct ScalePoint {
  int64_t x = 0;
  bool fits = false;
  size_t peak = 0;
  std::array<size_t, engine::kNumCategories> at_peak{};    // by category at the total peak (sums to peak)
  std::array<size_t, engine::kNumCategories> own_peak{};   // each category's own peak
  std::string failure;                                      // out-of-memory line, if any
};

// The analytic activation law (where a formula exists): coefficients per unit of x and x².
struct AnalyticLaw {
  bool present = false;
  double b = 0, c = 0;
  std::string derivation;  // how b and c were computed, in words and numbers
};

struct ScaleFitRow {
  std::string name;  // a category, "total", or "activation (own peak)"
  PolyFit fit;
};

struct GpuLimit {
  std::string gpu;
  size_t capacity = 0;
  double max_x = 0;          // the total law's estimate (-1: not even x = 0; kNever: never reached)
  bool extrapolated = false; // beyond the largest point measured
  int64_t probed = -1;       // the max batch itself (batch sweeps) or the longest sequence (sequence sweeps), probed on
                             // meta by engine_train --find-max-batch's / --find-max-seq's search (tools/max_batch.h);
                             // -1 for world sweeps
};

struct ScaleResult {
  std::string model, summary, axis_name, unit, fixed;  // fixed: e.g. "batch 32" for a seq sweep
  ScaleOptions options;
  std::vector<ScalePoint> points;
  std::vector<ScaleFitRow> fits;
  AnalyticLaw analytic;
  double crossover = kNever;           // of the total law
  double activation_crossover = kNever;
  std::vector<GpuLimit> gpus;
};

// "128:4096" (half-octave steps: 128, 192, 256, 384, ...), "128:1024:128" (a fixed step) or "128,256,512";
// a bad range is an Error that shows the accepted forms.
std::vector<int64_t> parse_points(const std::string& spec, const std::string& flag);

// Measures every point, then fit_scale().
ScaleResult run_scale(const ScaleOptions& options);
// The laws, crossovers and per-GPU limits from r.points (and r.options.axis): what run_scale does after
// measuring, apart so that a test can give it points of known coefficients.
void fit_scale(ScaleResult& r);

// Korthikanti's per-layer activation count (models/README.md) for the BERT family, times the layers; not
// present for other models, other precisions than fp32, or with recomputation.
AnalyticLaw bert_activation_law(const models::ModelConfig& config, ScaleAxis axis, int64_t batch, int64_t seq);

// "sequences", "images", "tokens" for a Model::item_unit() ("seq", "img", "tok").
std::string unit_word(const std::string& unit);

std::string scale_markdown(const ScaleResult& r);
std::string scale_csv(const ScaleResult& r);
std::string scale_json(const ScaleResult& r);
std::string scale_stacked_svg(const ScaleResult& r);  // memory at the peak, stacked by category
std::string scale_fit_svg(const ScaleResult& r);      // the total and its fitted law, linear vs quadratic term

}  // namespace tools
