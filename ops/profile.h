// profile.h: where a step's time goes, op by op (engine_train --profile).
//
// While kernel timing is on, run_kernel (ops/op.cpp) brackets every kernel: on cuda with a pair of CUDA
// events on the engine's stream (the GPU's own clock, so launches stay asynchronous until the times are
// read), on cpu with the host clock. Times are filed under the same name as the op counters
// (engine/counters.h: the running op, e.g. "softmax_backward", else the kernel's op), so a report can put
// each op's time beside its FLOPs and bytes: achieved TFLOP/s and GB/s. Off by default: the events cost a
// few microseconds per kernel.
// The GPU's idle time comes from the same events: from the end of one kernel (or the step's start marker) to
// the start of the next, filed under the op that waited (a copy between host and device counts as idle).
// Where the host cannot keep the GPU fed (a batch made on the host, a synchronizing index check, launches
// slower than the kernels), it shows before that op.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace ops {

void set_kernel_timing(bool on);
bool kernel_timing();

struct KernelTime {
  std::string op;
  std::string module;  // by_module entries only: the module scope the kernels ran in ("backbone.layer3.4.conv2")
  int64_t kernels = 0;
  double ms = 0;
  double idle_ms = 0;  // cuda: the GPU idle before this op's kernels (since the previous kernel or the step's start)
};
// Waits for the device, then returns the time per op since the last call, largest first; with `by_module`, also
// the time per module scope and op (a layer's forward and its backward apart), largest first.
std::vector<KernelTime> take_kernel_times(std::vector<KernelTime>* by_module = nullptr);
// Drops what was timed so far and marks the step's start on `device` (cuda: an event on the engine's stream),
// from which the idle time before the step's first kernel counts.
void start_step_timing(engine::Device& device);

// run_kernel's brackets (only while kernel timing is on).
void begin_kernel_timing(const char* op, const engine::Tensor& like);
void end_kernel_timing();

}  // namespace ops
