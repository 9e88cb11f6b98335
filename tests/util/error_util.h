// error_util.h: the message of the engine::Error a piece of code throws, for tests of error messages.
#pragma once
#include <string>

#include "engine/error.h"

namespace testutil {

// The message of the engine::Error that f() throws, or "" when it throws none.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const engine::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace testutil
