// world.h: engine_train's data-parallel world (tools/README.md, "Data parallel"): the flags that describe it, their
// checks, which rank this process is, the rank's output paths, the run header's line and the per-rank step report.
//
// A world comes from the flags (--world-size N on meta: one rank predicted) or from the environment a launcher sets
// (engine_train --nproc N: tools/launcher.h; torchrun- or Slurm-style: engine/dist.h); --zero, --bucket-mb,
// --bucket-view and --rank (meta) describe how the ranks share the work.
#pragma once
#include <string>
#include <vector>

#include "engine/dist.h"
#include "models/model.h"
#include "tools/flags.h"

namespace tools {

void add_world_flags(Flags& flags);

// --nproc N (N > 1): checks it and runs the N ranks of this command (tools/launcher.h); returns the world's exit
// status. Call it only when nproc_given(flags).
bool nproc_given(const Flags& flags);
int launch_nproc(const Flags& flags, int argc, char** argv);

struct World {
  engine::dist::WorldSpec env;  // this process's place (RANK, WORLD_SIZE, ... ; a world of one without them)
  int world_size = 1;           // --world-size on meta, else the environment's
  int rank = 0;                 // the rank the model is: --rank on meta, else the environment's
  int zero = 0;
  int64_t bucket_mb = 25;
  bool bucket_view = false;
  // Sets ModelConfig's world (create_model then sets up the predicted rank on meta).
  void apply(models::ModelConfig& config) const;
  // Rank r > 0 writes its files beside rank 0's, as FILE.rank<r> ("" stays "").
  std::string rank_path(const std::string& path) const;
};
// The world of these flags and this environment; every inconsistent combination is an Error naming the fix.
World world_of(const Flags& flags);

// "data parallel: rank 0 of 4 (gloo) | gradient buckets: 3, 44.73 MiB of staging, ... | ZeRO-1: ...".
std::string data_parallel_line(models::Model& model);

// One step of a data-parallel world over its ranks, for the line under each step and --json: each rank's time and
// peak, the slowest rank, and the step's collectives on the slowest rank (calls, bytes per rank, seconds).
struct WorldStep {
  int world = 1, slowest = 0, largest = 0, smallest = 0;
  std::vector<double> ms, peak;  // per rank
  struct Collective {
    const char* name;
    double calls = 0, bytes = 0, seconds = 0;
  };
  std::vector<Collective> collectives;  // all-reduce, broadcast
  // The bus bandwidth as nccl-tests defines it: all-reduce's algorithm bandwidth (bytes / time) x 2 (W - 1) / W,
  // broadcast's x 1; GB/s.
  double algbw(const Collective& c) const { return c.bytes / c.seconds / 1e9; }
  double busbw(const Collective& c) const {
    return std::string(c.name) == "all-reduce" ? algbw(c) * 2.0 * (world - 1) / world : algbw(c);
  }
};
// Every rank calls it (it gathers): `before` is this rank's totals as the step began, `ms` and `peak` its own.
WorldStep world_step(models::Model& model, const engine::dist::CommTotals& before, double ms, size_t peak);
// "ranks: peak 1.2 GiB (rank 3) .. 1.1 GiB (rank 0) | slowest rank 3: 40.1 ms | all-reduce ... GB/s, bus ... GB/s".
std::string ranks_line(const WorldStep& w, bool meta);
// The same for --json: {"peak_bytes": [per rank], "ms": [per rank, null on meta], "slowest_rank": r,
// "all_reduce": {"calls", "bytes", "seconds", "bus_gb_per_s"}, "broadcast": {...}} (times null on meta).
std::string ranks_json(const WorldStep& w, bool meta);

}  // namespace tools
