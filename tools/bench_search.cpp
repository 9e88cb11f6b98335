// bench_search.cpp: the shared, secant-guided max-batch search (see bench_search.h).
#include "tools/bench_search.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/rng.h"

namespace tools {

namespace {

// The largest batch that the secant through two fitting probes predicts for `capacity`: the largest
// batch that fit and the largest one at most half of it (far apart, so that a peak that grows in steps,
// as a token budget's does, still gives the average slope); 0 when there is no such pair or no growth.
int64_t predict(const std::map<int64_t, MaxBatchProbe>& fits, size_t capacity) {
  if (fits.size() < 2) return 0;
  auto b2 = std::prev(fits.end());
  auto b1 = fits.upper_bound(b2->first / 2);
  b1 = b1 == fits.begin() ? fits.begin() : std::prev(b1);
  if (b1 == b2) return 0;
  double slope = (double(b2->second.peak) - double(b1->second.peak)) / double(b2->first - b1->first);
  if (slope <= 0) return 0;
  return b2->first + int64_t(std::floor((double(capacity) - double(b2->second.peak)) / slope));
}

}  // namespace

std::vector<MaxBatchResult> find_max_batch_for_capacities(const models::ModelConfig& config, engine::DeviceType type,
                                                          const std::vector<size_t>& capacities,
                                                          const MaxBatchOptions& options, int64_t first_probe,
                                                          int64_t resolution, int64_t relative) {
  ENGINE_CHECK(options.steps >= 1 && options.limit >= 1 && first_probe >= 1 && resolution >= 1 && relative >= 1,
               "max batch: steps, limit, the first probe and the resolutions must be at least 1");
  const engine::Generator saved_generator = engine::generator();
  std::vector<size_t> sorted = capacities;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());

  std::map<int64_t, MaxBatchProbe> fits;  // every batch that fit some arena so far, with its probe
  std::map<size_t, MaxBatchResult> by_capacity;
  // Small batches do not predict large ones (their peak may be set by the optimizer step, not by the
  // activations), so the secant is used only once some batch has failed: its points are then large.
  bool failed_once = false;
  for (size_t capacity : sorted) {
    MaxBatchResult& r = by_capacity[capacity];
    if (!fits.empty()) {  // the largest batch that fit a smaller arena fits this one too
      r.largest_fit = fits.rbegin()->first;
      r.probes.push_back(fits.rbegin()->second);
    }
    auto run = [&](int64_t batch) {
      MaxBatchProbe p = probe_batch(config, type, capacity, batch, options.steps, options.inference);
      r.probes.push_back(p);
      if (p.fits) {
        r.largest_fit = std::max(r.largest_fit, batch);
        fits[batch] = p;
      } else if (r.first_fail == 0 || batch < r.first_fail) {
        r.first_fail = batch;
      }
      failed_once |= !p.fits;
      if (options.on_probe) options.on_probe(p, r.largest_fit, r.first_fail);
    };
    // Doubling (until some batch failed and two fit), then one guess from the secant, then galloping
    // away from it (strides s, 2s, 4s, ... with s = guess / 128) until the answer is bracketed, then
    // bisection down to the resolution (the larger of `resolution` and largest_fit / `relative`).
    int64_t step = 0;     // the gallop's next stride; 0 before the guess
    bool up = true;       // the gallop's direction: up after a guess that fit, down after one that failed
    bool bisect = false;
    // Nothing below the model's smallest batch is tried (deeplabv3 cannot train on 1 image): it counts as fitting.
    const int64_t below = min_batch(config) - 1;
    while (r.largest_fit < options.limit &&
           (r.first_fail == 0 ||
            r.first_fail - std::max(r.largest_fit, below) > std::max(resolution, r.largest_fit / relative))) {
      const int64_t lo = std::max(r.largest_fit, below), hi = r.first_fail ? r.first_fail : options.limit + 1;
      int64_t next;
      if (step == 0 && !bisect && (!failed_once || fits.size() < 2 || predict(fits, capacity) == 0)) {
        if (r.first_fail == 0) {
          next = std::min<int64_t>(r.largest_fit == 0 ? std::max(first_probe, below + 1) : 2 * lo, options.limit);
        } else {
          bisect = true;
          continue;
        }
      } else if (step == 0 && !bisect) {
        next = std::clamp<int64_t>(predict(fits, capacity), lo + 1, hi - 1);
        step = std::max<int64_t>(resolution, next / 128);  // the guess is rarely off by more than a percent
        run(next);
        up = r.probes.back().fits;
        continue;
      } else if (!bisect) {
        next = up ? std::min(lo + step, hi - 1) : std::max(hi - step, lo + 1);
        step *= 2;
        run(next);
        if (r.probes.back().fits != up) bisect = true;  // bracketed: the rest by halves
        continue;
      } else {
        next = lo + (hi - lo) / 2;
      }
      run(next);
    }
  }
  engine::generator() = saved_generator;

  std::vector<MaxBatchResult> out;
  for (size_t capacity : capacities) {
    MaxBatchResult r = by_capacity.at(capacity);
    finish_max_batch(r);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace tools
