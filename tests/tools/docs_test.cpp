// docs_test.cpp: the figures the READMEs show are what the programs print today. README.md's 2020 table and
// the translation models' max tokens in models/README.md are written by tools/bench/update_docs.sh from one
// `engine_bench lambda --device meta` run; this test runs the same table and fails when a committed figure
// differs (run tools/bench/update_docs.sh and commit the result).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tools/bench_lambda.h"
#include "tools/fork_pool.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The lines strictly between the line that starts with `begin` and the line `end`.
std::vector<std::string> block(const std::string& text, const std::string& begin, const std::string& end) {
  std::vector<std::string> lines;
  std::istringstream is(text);
  bool inside = false, found = false;
  for (std::string line; std::getline(is, line);) {
    if (line.rfind(begin, 0) == 0) inside = found = true;
    else if (line == end) inside = false;
    else if (inside) lines.push_back(line);
  }
  EXPECT_TRUE(found) << "no line starting with " << begin;
  return lines;
}

std::vector<std::string> table_lines(const std::vector<std::string>& lines) {
  std::vector<std::string> out;
  for (const auto& l : lines)
    if (l.rfind("|", 0) == 0) out.push_back(l);
  return out;
}

}  // namespace

TEST(Docs, TheReadmeFiguresAreWhatEngineBenchLambdaPrints) {
  tools::LambdaOptions o;
  o.jobs = tools::available_cpus();
  tools::LambdaTable t = tools::run_lambda(o);
  const std::string fix = "\nregenerate them with tools/bench/update_docs.sh (after make) and commit the result";

  std::istringstream md(tools::lambda_markdown(t));
  std::vector<std::string> printed;
  for (std::string line; std::getline(md, line);) printed.push_back(line);
  const std::vector<std::string> committed =
      table_lines(block(read_file("README.md"), "<!-- BEGIN lambda table", "<!-- END lambda table -->"));
  const std::vector<std::string> expected = table_lines(printed);
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(committed.size(), expected.size()) << "README.md's 2020 table has another number of lines" << fix;
  for (size_t i = 0; i < std::min(committed.size(), expected.size()); i++)
    EXPECT_EQ(committed[i], expected[i]) << "README.md's 2020 table, line " << i + 1 << fix;

  const std::string models_readme = read_file("models/README.md");
  int checked = 0;
  for (const auto& row : t.rows) {
    if (row.unit != "tok" || row.model.empty()) continue;
    std::vector<std::string> lines =
        block(models_readme, "<!-- BEGIN max tokens: " + row.model + " ", "<!-- END max tokens: " + row.model + " -->");
    ASSERT_EQ(lines.size(), 1u) << row.model << " in models/README.md";
    for (const auto& c : row.cells) {
      const std::string cell = c.gpu + " " + (c.first_fail == 0 ? ">=" : "") + std::to_string(c.max_batch);
      EXPECT_TRUE(lines[0].find(" " + cell + ",") != std::string::npos ||
                  lines[0].find(" " + cell + " (") != std::string::npos)
          << "models/README.md, " << row.model << ": engine_bench lambda says " << cell << "; the file says\n"
          << lines[0] << fix;
      checked++;
    }
  }
  EXPECT_EQ(checked, 3 * int(t.gpus.size())) << "transformer_big, convs2s and unsupmt on every card";
}
