// json.h: a small JSON reader and writer helpers (RFC 8259), for file headers and data sets
// (safetensors headers, SQuAD, COCO annotations) without a dependency.
//
// parse_json returns a Value tree; a syntax error is an engine::Error naming the byte offset, line and
// what was expected. Objects keep their keys in file order (a vector of pairs), and duplicate keys are
// kept as they appear (find() returns the first).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace engine::json {

struct Value {
  enum class Type { null, boolean, number, string, array, object } type = Type::null;
  bool b = false;
  double number = 0;
  std::string text;                                    // string value, or a number's literal
  std::vector<Value> items;                            // array
  std::vector<std::pair<std::string, Value>> members;  // object

  bool is_object() const { return type == Type::object; }
  bool is_array() const { return type == Type::array; }
  bool is_string() const { return type == Type::string; }
  bool is_number() const { return type == Type::number; }
  const Value* find(const std::string& key) const;  // nullptr when absent or not an object
  // The member, or an Error "<what>: missing key 'key'".
  const Value& at(const std::string& key, const std::string& what) const;
};

// `source` names the input in error messages (e.g. a file name).
Value parse_json(const std::string& text, const std::string& source = "json");

// For readers of JSON data files: the name of a type in messages ("a number", "an array", ...), a member that
// must exist and have `type`, and one that must be a whole number in [lo, hi] (NaN, 1e400 and 2.5 are
// refused). Errors read "<where>: missing key 'k'", "<where>.k is a string, expected a number".
const char* type_name(Value::Type t);
const Value& member(const Value& v, const std::string& key, Value::Type type, const std::string& where);
int64_t integer_member(const Value& v, const std::string& key, int64_t lo, int64_t hi, const std::string& where);
// A JSON string literal for s (quotes included), escaping what must be escaped.
std::string quote(const std::string& s);
// A JSON number literal for v that reads back as the same double ("%.17g"), or null when v is not finite.
std::string number(double v);

}  // namespace engine::json
