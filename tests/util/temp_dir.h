// temp_dir.h: a fresh folder under the system temp folder for a test's files, removed with everything in it
// when the test ends.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace testutil {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("engine_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // The path of `name` inside the folder.
  std::string file(const std::string& name) const { return (path / name).string(); }
  // Writes `content` to `name` inside the folder; returns its path.
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(file(name), std::ios::binary) << content;
    return file(name);
  }
};

}  // namespace testutil
