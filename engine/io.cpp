// io.cpp: atomic file writes.
#include "engine/io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "engine/error.h"

namespace engine {

void check_input_file(const std::string& path, const char* what, size_t max_bytes) {
  struct stat st;
  ENGINE_CHECK(!path.empty(), what, ": the path is empty");
  ENGINE_CHECK(stat(path.c_str(), &st) == 0, what, " '", path, "': cannot open it (", std::strerror(errno), ")");
  ENGINE_CHECK(!S_ISDIR(st.st_mode), what, " '", path, "' is a folder; give the file inside it");
  ENGINE_CHECK(S_ISREG(st.st_mode), what, " '", path, "' is not a regular file (",
               S_ISFIFO(st.st_mode)                         ? "a FIFO"
               : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                            : "a socket or link",
               "): only regular files are read");
  ENGINE_CHECK(size_t(st.st_size) <= max_bytes, what, " '", path, "' is ", st.st_size, " bytes: more than the ",
               max_bytes, " a ", what, " may have");
}

std::string read_file(const std::string& path, const char* what, size_t max_bytes) {
  check_input_file(path, what, max_bytes);
  int fd = -1;
  do fd = open(path.c_str(), O_RDONLY | O_CLOEXEC); while (fd < 0 && errno == EINTR);
  ENGINE_CHECK(fd >= 0, what, " '", path, "': cannot open it (", std::strerror(errno), ")");
  std::string content;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      throw Error(str(what, " '", path, "': read error (", std::strerror(err), ")"));
    }
    if (n == 0) break;
    content.append(buf, size_t(n));
    if (content.size() > max_bytes) {  // the file grew since stat
      close(fd);
      throw Error(str(what, " '", path, "' is more than the ", max_bytes, " bytes a ", what, " may have"));
    }
  }
  close(fd);
  return content;
}

void check_writable(const std::string& path, const std::string& what) {
  ENGINE_CHECK(!path.empty(), what, ": the path is empty");
  struct stat st;
  ENGINE_CHECK(stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode), what, " ", path,
               ": this is a folder; give a file path inside it");
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  ENGINE_CHECK(stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), what, " ", path, ": the folder '", dir,
               "' does not exist; create it first (mkdir -p ", dir, ") or give another path");
  ENGINE_CHECK(access(dir.c_str(), W_OK) == 0, what, " ", path, ": the folder '", dir, "' is not writable");
}

void write_file_atomic(const std::string& path, const std::string& content) {
  write_file_atomic(path, [&](const ByteSink& write) { write(content.data(), content.size()); });
}

namespace {

// Temporary files that a signal must not leave behind: SIGINT, SIGTERM and SIGHUP unlink the ones open now,
// then end the process as the signal would have. Fixed slots of fixed size, so the handler only reads memory
// and calls unlink (both async-signal-safe).
constexpr int kTempSlots = 16;
constexpr size_t kTempPathMax = 4096;
char g_temp_paths[kTempSlots][kTempPathMax];
volatile sig_atomic_t g_temp_used[kTempSlots];

void remove_temps_and_reraise(int sig) {
  for (int i = 0; i < kTempSlots; i++)
    if (g_temp_used[i]) unlink(g_temp_paths[i]);
  signal(sig, SIG_DFL);
  raise(sig);
}

int register_temp(const std::string& tmp) {
  static bool installed = [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction sa {};
      sa.sa_handler = remove_temps_and_reraise;
      sigemptyset(&sa.sa_mask);
      struct sigaction old {};
      // Keep a handler someone else installed (or an ignored signal) as it is.
      if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) sigaction(sig, &sa, nullptr);
    }
    return true;
  }();
  (void)installed;
  if (tmp.size() >= kTempPathMax) return -1;
  for (int i = 0; i < kTempSlots; i++)
    if (!g_temp_used[i]) {
      std::memcpy(g_temp_paths[i], tmp.c_str(), tmp.size() + 1);
      g_temp_used[i] = 1;
      return i;
    }
  return -1;  // more writes at once than slots: this one is still removed on failure, not on a signal
}

void unregister_temp(int slot) {
  if (slot >= 0) g_temp_used[slot] = 0;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::function<void(const ByteSink& write)>& produce) {
  write_file_atomic(path, [&](const ByteSink& write, const BytePatch&) { produce(write); });
}

void write_file_atomic(const std::string& path,
                       const std::function<void(const ByteSink& write, const BytePatch& patch)>& produce) {
  // An unpredictable name created exclusively (mkstemp: O_CREAT | O_EXCL, so a planted file or symlink of
  // that name is never followed or overwritten), beside `path` so that the rename stays on one file system.
  std::string tmp = path + ".tmp.XXXXXX";
  std::vector<char> name(tmp.begin(), tmp.end());
  name.push_back(0);
  int fd = mkostemp(name.data(), O_CLOEXEC);
  ENGINE_CHECK(fd >= 0, "cannot write '", path, "': ", std::strerror(errno));
  tmp = name.data();
  fchmod(fd, 0644);
  const int slot = register_temp(tmp);
  auto fail = [&](int err) {
    close(fd);
    fd = -1;  // cleaned up: the catch below must not do it again
    unlink(tmp.c_str());
    unregister_temp(slot);
    throw Error(str("cannot write '", path, "': ", std::strerror(err)));
  };
  ByteSink write = [&](const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      ssize_t n = ::write(fd, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(errno);
      p += n;
      bytes -= size_t(n);
    }
  };
  BytePatch patch = [&](size_t offset, const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      ssize_t n = ::pwrite(fd, p, bytes, off_t(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(errno);
      p += n;
      offset += size_t(n);
      bytes -= size_t(n);
    }
  };
  try {
    produce(write, patch);
  } catch (...) {
    if (fd >= 0) {
      close(fd);
      unlink(tmp.c_str());
      unregister_temp(slot);
    }
    throw;
  }
  bool ok = fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    unregister_temp(slot);
    throw Error(str("cannot write '", path, "': ", std::strerror(err)));
  }
  unregister_temp(slot);
  // Make the rename itself durable (best effort: not every file system can fsync a directory).
  size_t slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
}

}  // namespace engine
