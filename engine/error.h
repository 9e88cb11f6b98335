// error.h: the engine's exceptions and the CHECK macro.
//
// Every error a user can cause (bad shape, bad flag, corrupt file, out of memory) is thrown as an
// engine::Error whose message names what was wrong, which argument, and what was expected. Internal
// invariants use the same macro: a failed invariant is a bug, but it still reports instead of crashing.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace engine {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  append(os, rest...);
}
}  // namespace detail

// str("a", 1, shape) concatenates anything that has operator<<.
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

}  // namespace engine

// ENGINE_CHECK(cond, "matmul: inner dimensions differ: ", a.shape(), " vs ", b.shape());
#define ENGINE_CHECK(cond, ...)                                      \
  do {                                                               \
    if (!(cond)) throw ::engine::Error(::engine::str(__VA_ARGS__));  \
  } while (0)
