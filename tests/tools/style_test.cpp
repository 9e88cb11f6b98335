// style_test.cpp: the habits CI keeps. Every source line fits 120 columns (characters, not bytes: "·" is
// one), as .clang-format says; generated tables (models/data/unicode_classes.h) are exempt. `make format`
// formats the files changed since main.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/tools/shell_util.h"

namespace {

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // count lead bytes only
  return n;
}

}  // namespace

TEST(Style, EverySourceLineFitsOneHundredTwentyColumns) {
  auto [code, out] = testutil::shell("git ls-files --cached --others --exclude-standard '*.cpp' '*.h' '*.cu' '*.cuh'");
  if (code != 0 || out.empty()) GTEST_SKIP() << "not a git checkout: the file list comes from git";
  std::istringstream files(out);
  int checked = 0;
  for (std::string f; std::getline(files, f);) {
    if (f.empty() || f.find("unicode_classes.h") != std::string::npos) continue;
    std::ifstream in(f);
    if (!in) continue;  // deleted since
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      n++;
      EXPECT_LE(utf8_length(line), 120u) << f << ":" << n << " is longer than 120 columns (make format, or wrap it)";
    }
    checked++;
  }
  EXPECT_GT(checked, 100);
}
