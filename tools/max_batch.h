// max_batch.h: the largest batch that trains without running out of memory, and what stops the next one.
//
// Each probe builds the model on a FRESH device of the same type and capacity (a new arena, allocator
// and ledger: nothing left over from the previous probe can help or hurt it) and runs the steps of the
// model's probe schedule (Model::probe_schedule; {1, 2} by default); it fits when no engine::OutOfMemory is
// thrown. The schedule reaches the steady state: the optimizer allocates a parameter's state in that
// parameter's first update, so a probe runs until every trainable parameter has been updated (every task
// head of a multi-task model), then each kind of step once more beside the complete state. A training probe
// checks that no trainable parameter is left without state (else an Error, not a verdict). fp16: a step whose
// update is skipped for overflow still allocates the state (ops::Optimizer::allocate_state), so a probe on
// cuda, where the first steps overflow, reaches the same layout as on meta, where nothing overflows.
//
// Search: exponential upward from 1 (1, 2, 4, ...; a token budget from the model's default) until a
// probe fails, then bisection between the last fit and the first failure: about 2 log2(N) probes.
// Bisection assumes that a batch fits whenever a larger one does; fragmentation could in principle break
// that, so a caller that needs certainty re-runs N and N + 1 (the tests do).
//
// The binding term: the ledger category (activation, optimizer, temp, ...) whose bytes at the peak grew
// most from the largest fitting probe to the first failing one, with both figures. For the failing
// probe that is the peak it reached before the request that failed (the request itself is named in
// `failure`, the first line of the out-of-memory report).
//
// The knob is ModelConfig.batch (sequences or images), or ModelConfig.tokens for a model whose unit is
// tokens (translation models: item_unit() "tok"); counts_tokens() asks the model, once per model name. With
// SearchAxis::seq the knob is ModelConfig.seq at the config's batch (engine_train --find-max-seq: the longest
// sequence that fits), for a model of one sequence length (models/registry.h's Takes kSeq): the search
// runs from 8 tokens (or the model's shortest, Model::min_seq), and stops at the model's longest (Model::max_seq:
// its learned positions) when that fits.
#pragma once
#include <array>
#include <functional>
#include <string>
#include <vector>

#include "engine/device.h"
#include "models/model.h"

namespace tools {

// What a search varies: the batch (or a token budget), or the sequence length at a fixed batch.
enum class SearchAxis { batch, seq };

struct MaxBatchProbe {
  int64_t batch = 0;  // the value probed: the batch (or token budget), or the sequence length (SearchAxis::seq)
  bool fits = false;
  size_t peak = 0;                                            // peak live bytes (before the failure)
  std::array<size_t, engine::kNumCategories> breakdown{};     // per category at that peak
  std::string failure;                                        // first line of the OOM report, if any
  std::string unit;                                           // the model's item unit, once it was built
  std::vector<int64_t> schedule;  // the steps it ran: Model::probe_schedule(), extended to options.steps
  // With whole_epoch: the epoch's batches replayed after the schedule, and the worst one: the batch whose step set
  // the peak (a probe that fits) or ran out of memory (one that does not, in the schedule or the epoch), as
  // Model::describe_batch names it ("" for a model whose batches all have one shape).
  int64_t epoch_batches = 0;
  int64_t worst_step = 0;
  std::string worst_batch;
};

struct MaxBatchOptions {
  int steps = 2;            // full steps per probe at least (train steps; eval steps with `inference`): the
                            // model's probe_schedule(), continued with the steps after its last
  bool inference = false;   // probe eval_step (forward only) instead of train_step
  int64_t limit = 1 << 16;  // the search stops here: a batch this large that fits ends the search
  SearchAxis axis = SearchAxis::batch;
  // Every probe also replays one whole epoch of the model's data (Model::epoch_steps) after its schedule: the answer
  // is the largest batch (or token budget) for which every batch of the epoch fits (engine_train: with --data).
  bool whole_epoch = false;
  // Called after each probe with the bracket known so far: largest fit, first failure (0 when none yet).
  std::function<void(const MaxBatchProbe& probe, int64_t largest_fit, int64_t first_fail)> on_probe;
};

struct MaxBatchResult {
  int64_t largest_fit = 0;  // 0: not even a batch of 1 fits
  int64_t first_fail = 0;   // 0: everything up to `limit` fit
  int64_t limit = 0;        // the search's bound: options.limit, or a shorter model's longest sequence
  std::string unit;         // the model's item unit ("seq", "img", "tok")
  std::vector<MaxBatchProbe> probes;  // in the order they ran
  // The binding term (meaningful when first_fail > 0).
  engine::Category binding = engine::Category::activation;
  size_t binding_fit_bytes = 0, binding_fail_bytes = 0;
  std::string failure;      // the failing probe's out-of-memory line
};

// One probe: builds `config` with `batch` on a fresh device of `type` and `capacity` and runs steps.
MaxBatchProbe probe_batch(const models::ModelConfig& config, engine::DeviceType type, size_t capacity, int64_t batch,
                          int steps, bool inference = false, bool whole_epoch = false,
                          SearchAxis axis = SearchAxis::batch);
// Whether the model's batches differ in shape (Model::epoch_steps is not empty), so that --data's worst batch counts.
bool batches_vary(const models::ModelConfig& config);

MaxBatchResult find_max_batch(const models::ModelConfig& config, engine::DeviceType type, size_t capacity,
                              const MaxBatchOptions& options = {});

// Whether the search sets ModelConfig.tokens (the model's item_unit() is "tok") rather than .batch.
bool counts_tokens(const models::ModelConfig& config);
// The model's smallest trainable batch (Model::min_batch): searches never probe below it.
int64_t min_batch(const models::ModelConfig& config);
// Where the search starts: the smallest batch, or a token-counted model's default budget (below it the
// search bisects).
int64_t first_probe(const models::ModelConfig& config);
// The model's own batch at its default config (sequences, images or tokens; 1 if it cannot be built).
int64_t default_batch(const models::ModelConfig& config);
// The longest and shortest sequences the config's model builds (Model::max_seq, 0: no bound; Model::min_seq).
int64_t max_seq(const models::ModelConfig& config);
int64_t min_seq(const models::ModelConfig& config);
// An Error naming the models that have one when the config's model has no sequence length to search.
void check_seq_search(const models::ModelConfig& config);

// The result for a reader: the verdict, the binding term, the failing request, and a table of probes.
std::string describe_max_batch(const MaxBatchResult& r, size_t capacity, const MaxBatchOptions& options);

// The largest micro-batch for a global batch of G items (engine_train --find-max-batch --global-batch G): G itself
// when a step of G fits; else the largest divisor b of G such that G / b micro-batches of b fit (gradient
// accumulation, Model::set_accumulation). Under accumulation the memory of a step does not depend on the number of
// micro-batches beyond two (from the second on, the whole gradient set is live), so the search runs with two and
// the answer is then checked with its own count.
struct MicroBatchResult {
  int64_t global = 0;
  int64_t micro = 0;       // 0: not even a micro-batch of the smallest divisor fits
  int64_t accumulate = 0;  // global / micro
  MaxBatchProbe whole;     // the step of the whole global batch, no accumulation
  MaxBatchResult search;   // the largest micro-batch under accumulation (when the whole batch does not fit)
  MaxBatchProbe check;     // the answer with its own micro-batch count (when the search ran and found one)
};
MicroBatchResult find_micro_batch(const models::ModelConfig& config, engine::DeviceType type, size_t capacity,
                                  int64_t global, const MaxBatchOptions& options = {});
std::string describe_micro_batch(const MicroBatchResult& r, size_t capacity, const MaxBatchOptions& options);

}  // namespace tools
