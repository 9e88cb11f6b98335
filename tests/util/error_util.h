// error_util.h: the message of the engine::Error a piece of code throws, for tests of error messages.
#pragma once
#include <initializer_list>
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

// Expects `expr` to throw an engine::Error whose message contains every one of the strings after it.
#define EXPECT_ERROR_HAS(expr, ...)                                                                           \
  do {                                                                                                        \
    const std::string message_ = testutil::error_of([&] { (void)(expr); });                                   \
    for (const std::string& part_ : std::initializer_list<std::string>{__VA_ARGS__})                          \
      EXPECT_NE(message_.find(part_), std::string::npos) << "'" << part_ << "' not in: '" << message_ << "'"; \
  } while (0)
