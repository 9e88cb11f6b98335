// launcher.cpp: forking and watching the ranks of engine_train --nproc.
#include "tools/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/error.h"
#include "engine/format.h"
#include "tools/fork_pool.h"

namespace tools {

std::vector<std::string> without_flag(const std::vector<std::string>& args, const std::string& flag) {
  std::vector<std::string> out;
  const std::string name = "--" + flag;
  for (size_t i = 0; i < args.size(); i++) {
    if (args[i] == name) {
      i++;  // and its value
      continue;
    }
    if (args[i].rfind(name + "=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  return out;
}

namespace {

std::string last_lines(const std::string& path, size_t n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::ostringstream os;
  for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); i++) os << "  " << lines[i] << "\n";
  return os.str();
}

}  // namespace

int launch_ranks(int nproc, const std::vector<std::string>& args) {
  ENGINE_CHECK(nproc >= 1 && nproc <= 1024, "--nproc ", nproc, ": expected 1 to 1024 ranks");
  char tmpl[] = "/tmp/engine_world.XXXXXX";
  ENGINE_CHECK(mkdtemp(tmpl), "--nproc: could not create the rendezvous directory under /tmp: ", std::strerror(errno));
  const std::string store = tmpl;
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(size_t(nproc), -1);
  const int cpus = available_cpus();
  for (int r = 0; r < nproc; r++) {
    const pid_t pid = fork();
    ENGINE_CHECK(pid >= 0, "--nproc: fork failed for rank ", r, ": ", std::strerror(errno));
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("ENGINE_STORE_DIR", store.c_str(), 1);
      setenv("ENGINE_HOST", "127.0.0.1", 1);
      // The host's cores shared among the ranks (as torchrun sets OMP_NUM_THREADS): more threads than cores make
      // OpenMP's spinning threads wait on each other. A value the user set is kept.
      setenv("OMP_NUM_THREADS", std::to_string(std::max(1, cpus / nproc)).c_str(), 0);
      if (r > 0) {  // the others' output is kept for the report of a failure
        const int fd = open((store + "/rank" + std::to_string(r) + ".log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2), close(fd);
      }
      std::vector<char*> argv;
      std::string self = "/proc/self/exe";
      argv.push_back(self.data());
      std::vector<std::string> copy = args;
      for (std::string& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "rank %d: exec failed: %s\n", r, std::strerror(errno));
      _exit(127);
    }
    pids[size_t(r)] = pid;
  }
  int status_of_world = 0, failed = -1, running = nproc;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    int r = 0;
    while (r < nproc && pids[size_t(r)] != pid) r++;
    if (r == nproc) continue;
    pids[size_t(r)] = -1;
    running--;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && failed < 0) {
      failed = r;
      status_of_world = code;
      for (pid_t other : pids)
        if (other > 0) kill(other, SIGTERM);
    }
  }
  if (failed > 0)
    std::fprintf(stderr,
                 "engine_train --nproc %d: rank %d failed (exit status %d); the other ranks were stopped. "
                 "Its last lines:\n%s",
                 nproc, failed, status_of_world,
                 last_lines(store + "/rank" + std::to_string(failed) + ".log", 20).c_str());
  else if (failed == 0)
    std::fprintf(stderr, "engine_train --nproc %d: rank 0 failed (exit status %d); the other ranks were stopped\n",
                 nproc, status_of_world);
  std::error_code ec;
  std::filesystem::remove_all(store, ec);
  return status_of_world;
}

}  // namespace tools
