// shell_util.h: runs a program as a user would (for the tools' program-level tests).
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>
#include <utility>

namespace testutil {

// The path of one of the programs (engine_train, engine_bench): beside the running test binary, so that a
// test build in another folder (make test-sanitize's) runs its own programs.
inline std::string program(const std::string& name) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string dir = n > 0 ? std::string(exe, size_t(n)) : std::string("build/x");
  return dir.substr(0, dir.find_last_of('/') + 1) + name;
}

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
