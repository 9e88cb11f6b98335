// bench_test_util.h: checks shared by the engine_bench tests: a small XML well-formedness checker (for the
// SVG plots, independent of any library), temporary files, and running a python3 check script.
#pragma once
#include "tests/util/temp_dir.h"  // TempDir, which these tests use too
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/tools/shell_util.h"

namespace testutil {

// "" when `xml` is well-formed (one root element, every tag closed in order, attributes quoted, only the
// five predefined entities or numeric references); else what is wrong and where.
inline std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  size_t i = 0, roots = 0;
  auto name_at = [&](size_t& k) {
    size_t s = k;
    while (k < xml.size() &&
           (std::isalnum((unsigned char)xml[k]) || xml[k] == '-' || xml[k] == '_' || xml[k] == ':' || xml[k] == '.'))
      k++;
    return xml.substr(s, k - s);
  };
  auto entity_ok = [&](size_t k) {
    size_t semi = xml.find(';', k);
    if (semi == std::string::npos || semi - k > 10) return false;
    std::string e = xml.substr(k + 1, semi - k - 1);
    return e == "amp" || e == "lt" || e == "gt" || e == "quot" || e == "apos" || (!e.empty() && e[0] == '#');
  };
  while (i < xml.size()) {
    if (xml[i] == '&' && !entity_ok(i)) return "bad entity at byte " + std::to_string(i);
    if (xml[i] != '<') {
      if (open.empty() && !std::isspace((unsigned char)xml[i]))
        return "text outside the root at byte " + std::to_string(i);
      i++;
      continue;
    }
    if (xml.compare(i, 5, "<?xml") == 0 || xml.compare(i, 4, "<!--") == 0) {
      size_t end = xml.find(xml[i + 1] == '?' ? "?>" : "-->", i);
      if (end == std::string::npos) return "unterminated declaration or comment";
      i = end + 2;
      continue;
    }
    bool closing = xml[i + 1] == '/';
    size_t k = i + (closing ? 2 : 1);
    std::string name = name_at(k);
    if (name.empty()) return "a tag without a name at byte " + std::to_string(i);
    if (closing) {
      if (open.empty() || open.back() != name)
        return "</" + name + "> does not close <" + (open.empty() ? "" : open.back()) + ">";
      open.pop_back();
      k = xml.find('>', k);
      if (k == std::string::npos) return "unterminated closing tag";
      i = k + 1;
      continue;
    }
    // Attributes: name="value" (no '<' inside, entities valid).
    while (true) {
      while (k < xml.size() && std::isspace((unsigned char)xml[k])) k++;
      if (k >= xml.size()) return "unterminated tag <" + name + ">";
      if (xml[k] == '>' || xml.compare(k, 2, "/>") == 0) break;
      std::string attr = name_at(k);
      if (attr.empty() || k + 1 >= xml.size() || xml[k] != '=' || xml[k + 1] != '"')
        return "attribute of <" + name + "> at byte " + std::to_string(k) + " is not name=\"value\"";
      size_t end = xml.find('"', k + 2);
      if (end == std::string::npos) return "unterminated attribute value";
      for (size_t j = k + 2; j < end; j++) {
        if (xml[j] == '<') return "'<' inside an attribute of <" + name + ">";
        if (xml[j] == '&' && !entity_ok(j)) return "bad entity in an attribute of <" + name + ">";
      }
      k = end + 1;
    }
    bool self_closing = xml[k] == '/';
    if (open.empty() && ++roots > 1) return "more than one root element";
    if (!self_closing) open.push_back(name);
    i = k + (self_closing ? 2 : 1);
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  return roots == 1 ? "" : "no root element";
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}
inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline bool have_python3() { return shell("python3 -c 'print(1)'").first == 0; }

// Runs a python3 script (written to a file in `dir`) with `args`; returns (exit status, output).
inline std::pair<int, std::string> python(const TempDir& dir, const std::string& script, const std::string& args) {
  std::string path = dir.file("check.py");
  write_text(path, script);
  return shell("python3 " + path + " " + args);
}

}  // namespace testutil
