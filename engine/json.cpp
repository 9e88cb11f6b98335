// json.cpp: a recursive-descent JSON parser with precise error positions.
#include "engine/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engine/error.h"
#include "engine/format.h"

namespace engine::json {

const Value* Value::find(const std::string& key) const {
  if (type != Type::object) return nullptr;
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

const Value& Value::at(const std::string& key, const std::string& what) const {
  const Value* v = find(key);
  ENGINE_CHECK(v, what, ": missing key '", key, "'");
  return *v;
}

namespace {

class Parser {
 public:
  Parser(const std::string& t, const std::string& source) : s_(t), source_(source) {}

  Value document() {
    Value v = value(0);
    skip_space();
    if (i_ != s_.size()) fail("end of input after the top-level value");
    return v;
  }

 private:
  const std::string& s_;
  const std::string& source_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& expected) const {
    size_t line = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); k++) line += s_[k] == '\n';
    std::string near = i_ < s_.size() ? std::string("'") + s_[i_] + "'" : std::string("end of input");
    throw Error(str(source_, ": JSON syntax error at byte ", i_, " (line ", line, "): expected ", expected,
                    ", found ", near));
  }

  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) i_++;
  }

  bool take(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      i_++;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!take(c)) fail(std::string("'") + c + "'");
  }

  Value value(int depth) {
    if (depth > 512) fail("less nesting (more than 512 levels)");
    skip_space();
    if (i_ >= s_.size()) fail("a value");
    char c = s_[i_];
    Value v;
    if (c == '{') {
      i_++;
      v.type = Value::Type::object;
      if (take('}')) return v;
      do {
        skip_space();
        if (i_ >= s_.size() || s_[i_] != '"') fail("a string key");
        std::string key = string_literal();
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      i_++;
      v.type = Value::Type::array;
      if (take(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.type = Value::Type::string;
      v.text = string_literal();
    } else if (c == 't' || c == 'f' || c == 'n') {
      const char* word = c == 't' ? "true" : c == 'f' ? "false" : "null";
      size_t n = std::char_traits<char>::length(word);
      if (s_.compare(i_, n, word) != 0) fail("true, false or null");
      i_ += n;
      v.type = c == 'n' ? Value::Type::null : Value::Type::boolean;
      v.b = c == 't';
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.type = Value::Type::number;
      size_t start = i_;
      if (s_[i_] == '-') i_++;
      auto digits = [&] {
        size_t k = i_;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') i_++;
        return i_ > k;
      };
      if (!digits()) fail("digits");
      if (i_ < s_.size() && s_[i_] == '.') {
        i_++;
        if (!digits()) fail("digits after '.'");
      }
      if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
        i_++;
        if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) i_++;
        if (!digits()) fail("exponent digits");
      }
      v.text = s_.substr(start, i_ - start);
      v.number = std::strtod(v.text.c_str(), nullptr);
    } else {
      fail("a value");
    }
    return v;
  }

  uint32_t hex4() {
    if (i_ + 4 > s_.size()) fail("four hex digits");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
      char h = s_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f') v |= uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= uint32_t(h - 'A' + 10);
      else { i_--; fail("a hex digit"); }
    }
    return v;
  }

  std::string string_literal() {
    i_++;  // opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("a closing '\"'");
      char c = s_[i_++];
      if (c == '"') return out;
      if (uint8_t(c) < 0x20) { i_--; fail("no raw control character inside a string"); }
      if (c != '\\') { out += c; continue; }
      if (i_ >= s_.size()) fail("an escape character");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i_ + 1 < s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
            i_ += 2;
            uint32_t lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: i_--; fail("a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u)");
      }
    }
  }
};

}  // namespace

Value parse_json(const std::string& text, const std::string& source) { return Parser(text, source).document(); }

std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string quote(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (uint8_t(c) < 0x20) {
          const char* hex = "0123456789abcdef";
          o += "\\u00";
          o += hex[(c >> 4) & 15];
          o += hex[c & 15];
        } else {
          o += c;
        }
    }
  }
  return o + "\"";
}

const char* type_name(Value::Type t) {
  switch (t) {
    case Value::Type::null: return "null";
    case Value::Type::boolean: return "a boolean";
    case Value::Type::number: return "a number";
    case Value::Type::string: return "a string";
    case Value::Type::array: return "an array";
    case Value::Type::object: return "an object";
  }
  return "?";
}

const Value& member(const Value& v, const std::string& key, Value::Type type, const std::string& where) {
  const Value* m = v.find(key);
  ENGINE_CHECK(m, where, ": missing key '", key, "'");
  ENGINE_CHECK(m->type == type, where, ".", key, " is ", type_name(m->type), ", expected ", type_name(type));
  return *m;
}

int64_t integer_member(const Value& v, const std::string& key, int64_t lo, int64_t hi, const std::string& where) {
  const Value& m = member(v, key, Value::Type::number, where);
  ENGINE_CHECK(std::isfinite(m.number) && m.number == std::floor(m.number) && m.number >= double(lo) &&
                   m.number <= double(hi),
               where, ".", key, " is ", m.text, ", expected a whole number from ", lo, " to ", hi);
  return int64_t(m.number);
}

}  // namespace engine::json
