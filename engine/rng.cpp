// rng.cpp: the default generator.
#include "engine/rng.h"

namespace engine {

Generator& generator() {
  thread_local Generator g;
  return g;
}

void manual_seed(uint64_t seed) { generator() = Generator{seed, 0}; }

}  // namespace engine
