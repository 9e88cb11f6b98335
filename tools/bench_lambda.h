// bench_lambda.h: the 2020 GPU study (lambda2020.csv) reproduced: every registered model x every card of
// the study, the largest batch that trains (tokens for translation models) beside the study's figure,
// and on a GPU the training throughput at that batch.
//
// Models come from models::registry(), so a model registered later appears with no change here. The
// study's names are mapped to registry names in ONE table (study_models(), tools/study2020.h); a study
// model that is not registered yet is a row that says so ("not yet implemented"), never a silent gap.
//
// The max batch is found on the meta device (it predicts the GPU's allocator exactly: tests/models/
// models_cuda_test.cpp), per card: arena = the card's memory less its context reserve (tools/
// gpu_profiles). With --device cuda each (model, card) then trains `steps` steps at that batch on the real
// GPU in an arena of that card's capacity (which also confirms that it fits) and reports items/s of the
// steps after the first (the first allocates the optimizer state and warms the kernels up).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "engine/device.h"
#include "tools/max_batch.h"
#include "tools/study2020.h"

namespace tools {

struct LambdaCell {
  std::string gpu;
  size_t capacity = 0;           // arena bytes on that card
  int64_t max_batch = 0;         // ours (0: not even 1 fits)
  int64_t first_fail = 0;        // the first that does not fit (0: the search limit fit)
  std::string binding;           // the category that grew most from max_batch to first_fail
  double batch_2020 = -1;        // -1: the study has no figure
  double throughput = -1;        // items/s on the GPU (cuda only; -1: not measured)
  double throughput_2020 = -1;
  std::string error;             // a cuda run that failed, in one line
};

struct LambdaRow {
  std::string study, model;      // either may be empty (a model outside the study; a study model not built)
  std::string status;            // "ok", "not yet implemented", or "error: ..."
  std::string unit;              // seq | img | tok
  std::string config;            // e.g. "seq 128"
  std::string attention;         // what it ran: the table's, or naive for a model without a flash path
  int probes = 0;
  double seconds = 0;
  std::vector<LambdaCell> cells;
};

struct LambdaOptions {
  std::string study_path;           // a lambda2020.csv-style file; empty: the built-in table
  engine::DeviceType device = engine::DeviceType::meta;
  std::string precision = "fp32", attention = "naive";
  std::vector<std::string> models;  // only these (registry or study names; empty: all)
  int steps = 2;                    // per probe (max batch)
  int throughput_steps = 4;         // cuda: steps per throughput run (the first is not timed)
  int jobs = 1;                     // searches run in this many processes at once (tools/fork_pool.h)
  // Called as work finishes: `done` of `total` steps (a model's search; on cuda, each throughput run).
  std::function<void(int64_t done, int64_t total, const std::string& what)> on_progress;
};

struct LambdaTable {
  std::vector<std::string> gpus;
  std::vector<LambdaRow> rows;
  std::string device, precision, attention;
  double seconds = 0;
  int probes = 0;
};

LambdaTable run_lambda(const LambdaOptions& options);

std::string lambda_markdown(const LambdaTable& t);
std::string lambda_csv(const LambdaTable& t);
std::string lambda_json(const LambdaTable& t);
std::string lambda_svg(const LambdaTable& t);

}  // namespace tools
