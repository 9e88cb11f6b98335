// pickle.h: a minimal writer of Python pickles (protocol 2), for PyTorch's memory_viz snapshot format.
//
// Only what a snapshot needs: None, bool, int (64-bit), float, str, list and dict with string keys. The
// opcodes used (PROTO 2, EMPTY_DICT/EMPTY_LIST + MARK + SETITEMS/APPENDS, BININT1/BININT/LONG1,
// BINUNICODE, BINFLOAT, NONE, NEWTRUE/NEWFALSE, STOP) are read both by Python's pickle module and by
// the JavaScript unpickler of pytorch.org/memory_viz, which knows only a subset of the protocol. No memo:
// repeated strings are written again (files are larger, loading is no slower).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tools {

struct PyValue {
  enum class Kind { none, boolean, integer, real, text, list, dict } kind = Kind::none;
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::string s;
  std::vector<PyValue> items;                           // list
  std::vector<std::pair<std::string, PyValue>> members;  // dict, in insertion order

  PyValue() = default;
  PyValue(bool v) : kind(Kind::boolean), b(v) {}
  PyValue(int v) : kind(Kind::integer), i(v) {}
  PyValue(int64_t v) : kind(Kind::integer), i(v) {}
  PyValue(size_t v) : kind(Kind::integer), i(int64_t(v)) {}
  PyValue(double v) : kind(Kind::real), d(v) {}
  PyValue(const char* v) : kind(Kind::text), s(v) {}
  PyValue(std::string v) : kind(Kind::text), s(std::move(v)) {}
  static PyValue list() { PyValue v; v.kind = Kind::list; return v; }
  static PyValue dict() { PyValue v; v.kind = Kind::dict; return v; }
  // Appends to a list / sets a key of a dict; returns *this for chaining.
  PyValue& push(PyValue v);
  PyValue& set(std::string key, PyValue v);
};

// The pickle bytes of `v` (protocol 2).
std::string pickle_dumps(const PyValue& v);

}  // namespace tools
