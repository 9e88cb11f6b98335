// counters.cpp: the per-thread op counters.
#include "engine/counters.h"

#include "engine/context.h"

namespace engine {

Counters& counters() {
  thread_local Counters c;
  return c;
}

void count_op(const char* op, double flops, double bytes) {
  Counters& c = counters();
  const char* name = context().op ? context().op : op;
  OpCount& e = c.by_op[name];
  e.flops += flops;
  e.bytes += bytes;
  e.calls++;
  if (c.by_module) {
    OpCount& m = c.by_module_op[current_scope() + "/" + name];
    m.flops += flops;
    m.bytes += bytes;
    m.calls++;
  }
  c.flops += flops;
  c.bytes += bytes;
}

}  // namespace engine
