// context.cpp: the thread-local tagging context.
#include "engine/context.h"

#include <atomic>
#include <cstring>

namespace engine {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::setup: return "setup";
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::generate: return "generate";
    case Phase::recompute:
      return "recompute";
    case Phase::backward2:
      return "backward2";
    default: return "?";
  }
}

uint64_t ScopeStack::next_version() {
  static std::atomic<uint64_t> last{0};
  return ++last;
}

Context& context() {
  thread_local Context ctx;
  return ctx;
}

std::string current_scope() { return context().scopes.path(); }

std::string current_owner() {
  const Context& c = context();
  if (!c.op) return c.scopes.path();
  std::string s;
  s.reserve(c.scopes.path().size() + 1 + std::strlen(c.op));
  s += c.scopes.path();
  s += '/';
  s += c.op;
  return s;
}

}  // namespace engine
