// io.cpp: atomic file writes.
#include "engine/io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "engine/error.h"

namespace engine {

void write_file_atomic(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ENGINE_CHECK(fd >= 0, "cannot write '", path, "': ", std::strerror(errno));
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      int err = errno;
      close(fd);
      unlink(tmp.c_str());
      throw Error(str("cannot write '", path, "': ", std::strerror(err)));
    }
    done += size_t(n);
  }
  bool ok = fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    throw Error(str("cannot write '", path, "': ", std::strerror(err)));
  }
}

}  // namespace engine
