// readme_commands_test.cpp: every command that README.md's code blocks show and that can run without a GPU
// runs, as a user would paste it (from a scratch folder that sees the project's tests/data), and succeeds; a
// max-batch command whose comment states its answer ("# 29 -> 72 img"), or a longest-sequence one ("# 301 tokens
// fit"), must print that answer; one whose comment says "# out of memory: PEAK" must stop with the out-of-memory
// report (exit 3), what would fit, and that peak. So the README cannot rot: a renamed flag, a removed model or a
// changed figure fails here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/tools/bench_test_util.h"
#include "tests/tools/shell_util.h"

namespace {

namespace fs = std::filesystem;

struct ReadmeCommand {
  std::string line, command, comment;
};

// The lines of README.md's ``` blocks that start with build/engine_.
std::vector<ReadmeCommand> readme_commands() {
  std::ifstream in("README.md");
  std::vector<ReadmeCommand> out;
  bool in_block = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block;
      continue;
    }
    if (!in_block || line.rfind("build/engine_", 0) != 0) continue;
    ReadmeCommand c;
    c.line = line;
    const size_t hash = line.find(" #");
    c.command = line.substr(0, hash);
    c.comment = hash == std::string::npos ? "" : line.substr(hash + 2);
    while (!c.command.empty() && c.command.back() == ' ') c.command.pop_back();
    out.push_back(c);
  }
  return out;
}

}  // namespace

TEST(Readme, EveryCommandThatRunsWithoutAGpuSucceeds) {
  std::vector<ReadmeCommand> commands = readme_commands();
  ASSERT_GE(commands.size(), 10u) << "README.md's commands were not found";
  testutil::TempDir dir;  // the user's working folder: outputs land here; tests/data is the project's
  fs::create_symlink(fs::absolute("tests"), dir.path / "tests");
  int ran = 0;
  for (const ReadmeCommand& c : commands) {
    if (c.command.find("--device cuda") != std::string::npos) continue;  // needs a GPU
    std::string cmd = c.command;
    cmd.replace(0, std::string("build/").size(), testutil::program(""));  // the programs beside this test
    auto [code, out] = testutil::shell("cd " + dir.path.string() + " && " + cmd);
    // "# out of memory: 38.64 GiB": the command shows the out-of-memory report (exit 3) with what would fit, and
    // the config's peak it states.
    if (c.comment.find("out of memory: ") != std::string::npos) {
      EXPECT_EQ(code, 3) << "README.md: " << c.line << "\n" << out;
      EXPECT_NE(out.find("What would fit"), std::string::npos) << "README.md: " << c.line << "\n" << out;
      const std::string peak = c.comment.substr(c.comment.find("out of memory: ") + 15);
      EXPECT_NE(out.find("this config's peak is " + peak), std::string::npos)
          << "README.md: " << c.line << "\n" << out;
      ran++;
      continue;
    }
    EXPECT_EQ(code, 0) << "README.md: " << c.line << "\n" << out;
    // "# 29 -> 72 img": the answer this command gives is the figure after the arrow.
    std::smatch m;
    if (c.command.find("--find-max-batch") != std::string::npos &&
        std::regex_search(c.comment, m, std::regex("-> ([0-9]+)"))) {
      EXPECT_NE(out.find("max batch: " + m[1].str() + " "), std::string::npos)
          << "README.md says " << c.comment << ":\n" << c.line << "\n" << out;
    }
    // "# 301 tokens fit": the longest sequence this command finds.
    if (c.command.find("--find-max-seq") != std::string::npos &&
        std::regex_search(c.comment, m, std::regex("([0-9]+) tokens fit"))) {
      EXPECT_NE(out.find("longest sequence: " + m[1].str() + " tokens fit"), std::string::npos)
          << "README.md says " << c.comment << ":\n"
          << c.line << "\n"
          << out;
    }
    ran++;
  }
  EXPECT_GE(ran, 10);
}
