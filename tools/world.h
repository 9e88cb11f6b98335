// world.h: engine_train's data-parallel world (tools/README.md, "Data parallel"): the flags that describe it, their
// checks, which rank this process is, the rank's output paths and the run header's line.
//
// A world comes from the flags (--world-size N on meta: one rank predicted) or from the environment a launcher sets
// (engine_train --nproc N: tools/launcher.h; torchrun- or Slurm-style: engine/dist.h); --zero, --bucket-mb,
// --bucket-view and --rank (meta) describe how the ranks share the work.
#pragma once
#include <string>

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

}  // namespace tools
