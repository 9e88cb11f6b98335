// fork_pool.h: independent pieces of work in child processes, `jobs` at a time, results as strings.
//
// engine_bench's max-batch searches are independent per model and single-threaded (the meta device
// computes nothing; the time goes to building models and recording allocations), so the way to use two
// cores is two processes. A process, not a thread: the engine's default device, random generator and op
// counters are per process, and a fork gives each search its own without any locking. The child sends
// its result back through a pipe as a string (the caller chooses the encoding).
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace tools {

// Runs work(i) for i in [0, n), up to `jobs` at once, each in a forked child; on_done(i, result) runs
// in this process as each finishes (in completion order). jobs <= 1 runs everything here, in order. A
// work item that throws gives its message as an Error in the parent; a child that dies is an Error too.
// Call it before this process creates a CUDA context (a forked child cannot use its parent's).
void run_forked(size_t n, int jobs, const std::function<std::string(size_t)>& work,
                const std::function<void(size_t, const std::string&)>& on_done);

// The number of CPUs this process may run on (at least 1).
int available_cpus();

}  // namespace tools
