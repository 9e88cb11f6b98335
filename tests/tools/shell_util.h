// shell_util.h: runs a program as a user would (for the tools' program-level tests).
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>
#include <utility>

namespace testutil {

// Runs `cmd` with stderr joined to stdout (a pipe, not a terminal); returns (exit status, output).
inline std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed: " + cmd};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace testutil
