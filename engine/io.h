// io.h: writing files so that a reader never sees half of one.
//
// write_file_atomic writes to "<path>.tmp.<pid>", flushes it to disk, then renames it over `path`: after a
// crash either the old file or the complete new one is there, never a truncated one.
#pragma once
#include <string>

namespace engine {

void write_file_atomic(const std::string& path, const std::string& content);

}  // namespace engine
