// counters.h: FLOPs and bytes moved, counted by every op as it runs (for MFU and per-op reports).
//
// Each op adds its model FLOPs (a multiply-add counts 2) and the minimum bytes it must read and write.
// The counts are the same on every device, so a meta run gives a config's FLOPs per step.
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace engine {

struct OpCount {
  double flops = 0, bytes = 0;
  int64_t calls = 0;
};

struct Counters {
  std::map<std::string, OpCount> by_op;
  // With by_module on (engine_train --profile), also per module and op: key "<module scope>/<op>" (current_owner).
  bool by_module = false;
  std::map<std::string, OpCount> by_module_op;
  double flops = 0, bytes = 0;
  void reset() {
    const bool keep = by_module;
    *this = Counters();
    by_module = keep;
  }
};

Counters& counters();  // this thread's
// Adds to the running op's entry (context().op when set, e.g. "softmax_backward", else `op`).
void count_op(const char* op, double flops, double bytes);

}  // namespace engine
