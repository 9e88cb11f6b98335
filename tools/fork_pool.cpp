// fork_pool.cpp: fork, a pipe per child, poll until every child has answered (see fork_pool.h).
#include "tools/fork_pool.h"

#include <poll.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "engine/error.h"

namespace tools {

int available_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? int(n) : 1;
}

namespace {

struct Child {
  pid_t pid;
  int fd;
  std::string out;
};

// In the child: run, write "0" + result or "1" + error message, leave without running destructors
// or atexit handlers that belong to the parent.
[[noreturn]] void child_main(int fd, size_t i, const std::function<std::string(size_t)>& work) {
  std::string msg;
  try {
    msg = "0" + work(i);
  } catch (const std::exception& e) {
    msg = std::string("1") + e.what();
  } catch (...) {
    msg = "1unknown exception";
  }
  const char* p = msg.data();
  size_t left = msg.size();
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(3);
    p += w;
    left -= size_t(w);
  }
  close(fd);
  std::fflush(nullptr);
  _exit(0);
}

}  // namespace

void run_forked(size_t n, int jobs, const std::function<std::string(size_t)>& work,
                const std::function<void(size_t, const std::string&)>& on_done) {
  if (jobs <= 1 || n <= 1) {
    for (size_t i = 0; i < n; i++) on_done(i, work(i));
    return;
  }
  std::map<size_t, Child> running;
  size_t next = 0;
  std::string first_error;
  while (next < n || !running.empty()) {
    while (next < n && running.size() < size_t(jobs) && first_error.empty()) {
      int fds[2];
      ENGINE_CHECK(pipe(fds) == 0, "run_forked: pipe failed: ", std::strerror(errno));
      std::fflush(nullptr);  // nothing buffered is written twice
      pid_t pid = fork();
      ENGINE_CHECK(pid >= 0, "run_forked: fork failed: ", std::strerror(errno));
      if (pid == 0) {
        close(fds[0]);
        for (auto& [j, c] : running) close(c.fd);
        child_main(fds[1], next, work);
      }
      close(fds[1]);
      running[next] = {pid, fds[0], ""};
      next++;
    }
    if (running.empty()) break;
    std::vector<pollfd> polls;
    std::vector<size_t> ids;
    for (auto& [i, c] : running) polls.push_back({c.fd, POLLIN, 0}), ids.push_back(i);
    if (poll(polls.data(), polls.size(), -1) < 0) {
      ENGINE_CHECK(errno == EINTR, "run_forked: poll failed: ", std::strerror(errno));
      continue;
    }
    for (size_t k = 0; k < polls.size(); k++) {
      if (!(polls[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Child& c = running.at(ids[k]);
      char buf[65536];
      ssize_t r = read(c.fd, buf, sizeof buf);
      if (r < 0 && errno == EINTR) continue;
      if (r > 0) {
        c.out.append(buf, size_t(r));
        continue;
      }
      // End of the child's output: collect it.
      close(c.fd);
      int status = 0;
      waitpid(c.pid, &status, 0);
      size_t i = ids[k];
      std::string out = std::move(c.out);
      running.erase(i);
      if (out.empty() || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (first_error.empty())
          first_error = engine::str("work item ", i, ": the child process ",
                                    WIFSIGNALED(status) ? engine::str("was killed by signal ", WTERMSIG(status))
                                                        : engine::str("exited with status ", WEXITSTATUS(status)));
      } else if (out[0] == '1') {
        if (first_error.empty()) first_error = out.substr(1);
      } else {
        on_done(i, out.substr(1));
      }
    }
  }
  if (!first_error.empty()) throw engine::Error(first_error);
}

}  // namespace tools
