// format.cpp: byte and number formatting.
#include "engine/format.h"

#include <cctype>
#include <cstdio>

#include "engine/error.h"

namespace engine {

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) { v /= 1024.0; u++; }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string format_fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

size_t parse_bytes(const std::string& s) {
  // A number: digits with at most one decimal point ("1..5GB" and "1.2.3GB" are not sizes).
  size_t i = 0, points = 0, digits = 0;
  for (; i < s.size() && (std::isdigit((unsigned char)s[i]) || s[i] == '.'); i++) (s[i] == '.' ? points : digits)++;
  ENGINE_CHECK(digits > 0 && points <= 1, "cannot read a memory size from '", s,
               "': expected a number with a unit, e.g. 24GB or 1.5GiB");
  const double v = std::strtod(s.substr(0, i).c_str(), nullptr);
  std::string unit = s.substr(i);
  for (auto& c : unit) c = char(std::toupper((unsigned char)c));
  double mult;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw Error(str("unknown memory unit '", s.substr(i), "' in '", s, "': use B, KB, MB, GB or TB"));
  const double bytes = v * mult;
  ENGINE_CHECK(bytes < 18446744073709551616.0, "the memory size '", s, "' is larger than a 64-bit size holds");
  return size_t(bytes);
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace engine
