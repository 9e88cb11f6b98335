// launcher.h: engine_train --nproc N, the single-host launcher of a world of N ranks (what torchrun does on one node).
//
// The program runs itself N times (fork + exec of /proc/self/exe with the same arguments less --nproc), each child
// with the environment engine/dist.h reads: RANK and LOCAL_RANK r, WORLD_SIZE N, ENGINE_STORE_DIR (a fresh
// directory for the rendezvous, removed at the end), ENGINE_HOST 127.0.0.1 and, unless set, OMP_NUM_THREADS =
// cores / N. Rank 0's output is the run's; the others' goes to files in the store directory and is printed only
// when that rank fails. When a rank fails, the others are stopped (they would wait for it in their next
// collective) and the launcher exits with the failed rank's status, after printing which rank it was and its
// last lines.
#pragma once
#include <string>
#include <vector>

namespace tools {

// The arguments without `flag` and its value ("--flag V" or "--flag=V").
std::vector<std::string> without_flag(const std::vector<std::string>& args, const std::string& flag);

// Runs ranks 0..nproc-1 of this program with `args` (argv[1..], --nproc already removed); returns the exit status.
int launch_ranks(int nproc, const std::vector<std::string>& args);

}  // namespace tools
