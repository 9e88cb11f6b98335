// standalone_test.cpp: the repository stands alone. A user clones the project by itself, with nothing beside
// it; so no file of the project may point outside it (the team's notes live in a sibling folder that a clone
// does not have), and the programs must work from a copy of the project's files alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/tools/bench_test_util.h"
#include "tests/tools/shell_util.h"

namespace {

namespace fs = std::filesystem;

// The folder of the running test binary: the build folder, where the programs are too.
fs::path build_dir() { return fs::read_symlink("/proc/self/exe").parent_path(); }

// The project's files, relative to its root: git's list (tracked files and new ones it does not ignore) when
// this is a checkout, else every file outside the build and output folders.
std::vector<std::string> project_files() {
  std::vector<std::string> files;
  auto [code, out] = testutil::shell("git ls-files --cached --others --exclude-standard");
  if (code == 0 && !out.empty()) {
    std::istringstream is(out);
    for (std::string line; std::getline(is, line);)
      if (!line.empty() && fs::is_regular_file(line)) files.push_back(line);  // not a file deleted since
    return files;
  }
  for (auto it = fs::recursive_directory_iterator("."); it != fs::recursive_directory_iterator(); ++it) {
    const std::string rel = fs::relative(it->path(), ".").string();
    if (it->is_directory() && (rel == "build" || rel == "bench_out" || rel == ".git")) it.disable_recursion_pending();
    else if (it->is_regular_file()) files.push_back(rel);
  }
  return files;
}

}  // namespace

TEST(Repository, NoFileReadsOrCitesTheTeamsNotes) {
  const std::string sibling = std::string("..") + "/shared";  // spelled in two parts so this file passes
  std::vector<std::string> files = project_files();
  ASSERT_GT(files.size(), 100u) << "the project's files were not found from " << fs::current_path();
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str().find(sibling), std::string::npos) << f << " refers to " << sibling
                                                            << ", which a clone of the project does not have";
  }
}

TEST(Repository, TheProgramsWorkFromACopyOfTheProjectAlone) {
  testutil::TempDir dir;
  const fs::path project = dir.path / "project";
  for (const std::string& f : project_files()) {
    fs::create_directories((project / f).parent_path());
    fs::copy_file(f, project / f);
  }
  ASSERT_TRUE(fs::exists(project / "tools/data/lambda2020.csv"));
  const std::string bench = (build_dir() / "engine_bench").string();
  auto [code, out] = testutil::shell("cd " + project.string() + " && " + bench +
                                     " lambda --device meta --models bert_base --jobs 1 --out " +
                                     (dir.path / "out").string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("| bert_base | seq | seq 128 |"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir.path / "out" / "lambda.csv"));
}
