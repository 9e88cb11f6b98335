// io.h: writing files so that a reader never sees half of one.
//
// write_file_atomic writes to a temporary file beside `path` (an unpredictable name, created exclusively, so a
// planted file or symlink is never followed), flushes it to disk, then renames it over `path`: after a crash
// either the old file or the complete new one is there, never a truncated one. The temporary is removed on
// an error and on SIGINT, SIGTERM or SIGHUP.
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace engine {

void write_file_atomic(const std::string& path, const std::string& content);

// Reading input files. A data path can name anything: a FIFO (a read that blocks forever), a device such as
// /dev/zero (a read that never ends), a folder, or a file far larger than its format ever is. Readers call
// check_input_file first: a regular file of at most `max_bytes`, else an Error naming `what`, the path and the
// limit. read_file does that, then returns the whole file.
void check_input_file(const std::string& path, const char* what, size_t max_bytes);
std::string read_file(const std::string& path, const char* what, size_t max_bytes);
constexpr size_t kMiB = size_t(1) << 20, kGiB = size_t(1) << 30;

// Checks, before a long run, that `path` can be written when the run ends: its folder exists and is writable
// and the path is not a folder. Else an Error naming `what` (e.g. "--save") and the fix.
void check_writable(const std::string& path, const std::string& what);

// The same for content produced piece by piece (a checkpoint need not be held in memory whole): `produce`
// receives a sink that appends bytes to the temporary file. If produce throws, the temporary is removed
// and `path` is untouched.
using ByteSink = std::function<void(const void* data, size_t bytes)>;
void write_file_atomic(const std::string& path, const std::function<void(const ByteSink& write)>& produce);
// The same, for a format whose header holds a value known only after the data (a checksum): `patch` rewrites
// bytes already written, at their offset in the file.
using BytePatch = std::function<void(size_t offset, const void* data, size_t bytes)>;
void write_file_atomic(const std::string& path,
                       const std::function<void(const ByteSink& write, const BytePatch& patch)>& produce);

}  // namespace engine
