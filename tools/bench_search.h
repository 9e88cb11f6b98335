// bench_search.h: the max batch of one model for several arena capacities at once, in few probes.
//
// The 2020 table asks the same question (largest batch that trains) for eight cards. Searching each card
// from batch 1 (tools/max_batch.h: ~2 log2 N probes) costs ~20 probes a card; this search shares what it
// learns between cards:
// * A probe's peak does not depend on the capacity (the ledger counts what the program allocates), and
//   the peak grows almost linearly with the batch. The secant through the two largest batches that fit
//   predicts the largest batch a capacity holds; the search probes that guess and the next batch.
// * Capacities are searched in increasing order: a batch that fits a smaller arena fits a larger one
//   (best fit over the same requests; the free tail only grows), so it is not probed again.
// * Every answer is still decided by probes on that capacity's own device: N + 1 fails there (a failure
//   is never carried over), and N fits there or in a smaller arena. When guesses miss twice, the search
//   falls back to doubling and bisection, so a law that is not linear costs probes, never correctness.
// Cards with equal memory get one search.
#pragma once
#include <vector>

#include "tools/max_batch.h"

namespace tools {

// One result per entry of `capacities` (same order); options.steps, inference, limit and on_probe as
// for find_max_batch. `first_probe`: where the search starts (1; a translation model's default token
// budget, since a budget shorter than a sentence makes no batch at all); below it the search halves.
// The search stops when first_fail - largest_fit <= max(resolution, largest_fit / relative): (1, huge)
// is exact; engine_bench searches token budgets to max(64 tokens, 1/64 of the answer), since the memory
// of a token budget is a step function of the whole sentences it packs and the study's figures are round.
std::vector<MaxBatchResult> find_max_batch_for_capacities(const models::ModelConfig& config, engine::DeviceType type,
                                                          const std::vector<size_t>& capacities,
                                                          const MaxBatchOptions& options = {}, int64_t first_probe = 1,
                                                          int64_t resolution = 1, int64_t relative = int64_t(1) << 62);

}  // namespace tools
