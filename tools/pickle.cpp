// pickle.cpp: the opcodes of pickle protocol 2 that PyValue needs (see pickle.h).
#include "tools/pickle.h"

#include <cstring>

#include "engine/error.h"

namespace tools {

PyValue& PyValue::push(PyValue v) {
  ENGINE_CHECK(kind == Kind::list, "pickle: push on a value that is not a list");
  items.push_back(std::move(v));
  return *this;
}

PyValue& PyValue::set(std::string key, PyValue v) {
  ENGINE_CHECK(kind == Kind::dict, "pickle: set('", key, "') on a value that is not a dict");
  members.emplace_back(std::move(key), std::move(v));
  return *this;
}

namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int k = 0; k < 4; k++) out += char((v >> (8 * k)) & 0xff);
}

void put_text(std::string& out, const std::string& s) {
  out += 'X';  // BINUNICODE: 4-byte little-endian length, UTF-8 bytes
  put_u32(out, uint32_t(s.size()));
  out += s;
}

void put(std::string& out, const PyValue& v) {
  switch (v.kind) {
    case PyValue::Kind::none: out += 'N'; break;
    case PyValue::Kind::boolean: out += char(v.b ? 0x88 : 0x89); break;  // NEWTRUE / NEWFALSE
    case PyValue::Kind::integer:
      if (v.i >= 0 && v.i < 256) {
        out += 'K';  // BININT1
        out += char(v.i);
      } else if (v.i >= INT32_MIN && v.i <= INT32_MAX) {
        out += 'J';  // BININT: 4-byte little-endian signed
        put_u32(out, uint32_t(int32_t(v.i)));
      } else {
        out += char(0x8a);  // LONG1: 8 bytes, little-endian two's complement
        out += char(8);
        for (int k = 0; k < 8; k++) out += char((uint64_t(v.i) >> (8 * k)) & 0xff);
      }
      break;
    case PyValue::Kind::real: {
      out += 'G';  // BINFLOAT: 8-byte big-endian IEEE 754
      uint64_t bits;
      std::memcpy(&bits, &v.d, 8);
      for (int k = 7; k >= 0; k--) out += char((bits >> (8 * k)) & 0xff);
      break;
    }
    case PyValue::Kind::text: put_text(out, v.s); break;
    case PyValue::Kind::list:
      out += ']';  // EMPTY_LIST, then MARK items APPENDS
      if (!v.items.empty()) {
        out += '(';
        for (const auto& item : v.items) put(out, item);
        out += 'e';
      }
      break;
    case PyValue::Kind::dict:
      out += '}';  // EMPTY_DICT, then MARK key value ... SETITEMS
      if (!v.members.empty()) {
        out += '(';
        for (const auto& [key, value] : v.members) {
          put_text(out, key);
          put(out, value);
        }
        out += 'u';
      }
      break;
  }
}

}  // namespace

std::string pickle_dumps(const PyValue& v) {
  std::string out = "\x80\x02";  // PROTO 2
  put(out, v);
  out += '.';  // STOP
  return out;
}

}  // namespace tools
