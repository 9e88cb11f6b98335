// engine/env.h: on/off switches read from the environment, for measuring one way against the other (a kernel
// variant, a buffer kept or recomputed) in a whole process without rebuilding: ops/attention.cpp's
// ENGINE_FLASH_KEEP_DS, ENGINE_FLASH_DQ_SUMS and ENGINE_FLASH_KEEP_DROPOUT, ops/cuda/conv.cu's ENGINE_CONV_IM2COL,
// ops/conv_params.h's ENGINE_CONV_WINOGRAD.
#pragma once
#include <cstdlib>
#include <cstring>

#include "engine/error.h"

namespace engine {

// `fallback` when the variable `name` is unset or empty, else its value: 0 (`off` says what that does) or 1 (`on`);
// any other value is an error naming the variable, both values and the default.
inline bool env_switch(const char* name, bool fallback, const char* off, const char* on) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  ENGINE_CHECK(!std::strcmp(s, "0") || !std::strcmp(s, "1"), name, "=\"", s, "\": expected 0 (", off, ") or 1 (", on,
               "); unset it for the default, ", fallback ? 1 : 0);
  return *s == '1';
}

}  // namespace engine
