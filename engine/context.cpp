// context.cpp: the thread-local tagging context.
#include "engine/context.h"

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

Context& context() {
  thread_local Context ctx;
  return ctx;
}

std::string current_scope() {
  std::string s;
  for (const auto& piece : context().scopes) {
    if (piece.empty()) continue;
    if (!s.empty()) s += '.';
    s += piece;
  }
  return s;
}

std::string current_owner() {
  std::string s = current_scope();
  if (context().op) s += std::string("/") + context().op;
  return s;
}

}  // namespace engine
