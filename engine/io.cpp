// io.cpp: atomic file writes.
#include "engine/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "engine/error.h"

namespace engine {

void check_input_file(const std::string& path, const char* what, size_t max_bytes) {
  struct stat st;
  ENGINE_CHECK(!path.empty(), what, ": the path is empty");
  ENGINE_CHECK(stat(path.c_str(), &st) == 0, what, " '", path, "': cannot open it (", std::strerror(errno), ")");
  ENGINE_CHECK(!S_ISDIR(st.st_mode), what, " '", path, "' is a folder; give the file inside it");
  ENGINE_CHECK(S_ISREG(st.st_mode), what, " '", path, "' is not a regular file (",
               S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a socket or link",
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

void write_file_atomic(const std::string& path, const std::function<void(const ByteSink& write)>& produce) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ENGINE_CHECK(fd >= 0, "cannot write '", path, "': ", std::strerror(errno));
  auto fail = [&](int err) {
    close(fd);
    fd = -1;  // cleaned up: the catch below must not do it again
    unlink(tmp.c_str());
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
  try {
    produce(write);
  } catch (...) {
    if (fd >= 0) {
      close(fd);
      unlink(tmp.c_str());
    }
    throw;
  }
  bool ok = fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    throw Error(str("cannot write '", path, "': ", std::strerror(err)));
  }
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
