// flags_test.cpp: strict flag parsing (unknown flags, bad values, choices) and the engine_train program's
// error messages and exit codes, run as a user would run it.
#include <gtest/gtest.h>

#include "engine/error.h"
#include "tests/tools/shell_util.h"
#include "tools/flags.h"
#include "tests/util/error_util.h"

namespace {

using testutil::shell;

bool parse(tools::Flags& f, std::vector<std::string> args) {
  std::vector<char*> argv;
  static std::string prog = "prog";
  argv.push_back(prog.data());
  for (auto& a : args) argv.push_back(a.data());
  return f.parse(int(argv.size()), argv.data());
}

tools::Flags make() {
  tools::Flags f("prog", "test program");
  f.add_int("batch", 8, "batch size");
  f.add_double("lr", 0.1, "learning rate");
  f.add_choice("device", "cpu", {"cpu", "meta"}, "device");
  f.add_bool("verbose", "talk");
  f.add_string("out", "", "output file");
  return f;
}

std::string error_of(std::vector<std::string> args) {
  auto f = make();
  return testutil::error_of([&] { parse(f, args); });
}

}  // namespace

TEST(Flags, ParsesBothSpellingsAndDefaults) {
  auto f = make();
  EXPECT_TRUE(parse(f, {"--batch", "12", "--lr=0.5", "--device", "meta", "--verbose"}));
  EXPECT_EQ(f.integer("batch"), 12);
  EXPECT_DOUBLE_EQ(f.real("lr"), 0.5);
  EXPECT_EQ(f.str("device"), "meta");
  EXPECT_TRUE(f.on("verbose"));
  EXPECT_TRUE(f.given("batch"));
  EXPECT_FALSE(f.given("out"));
  auto g = make();
  EXPECT_TRUE(parse(g, {}));
  EXPECT_EQ(g.integer("batch"), 8);
  EXPECT_FALSE(g.on("verbose"));
}

TEST(Flags, BadCommandLinesSayWhatIsWrong) {
  EXPECT_NE(error_of({"--bacth", "3"}).find("unknown flag --bacth"), std::string::npos);
  EXPECT_NE(error_of({"--bacth", "3"}).find("--batch"), std::string::npos) << "lists the valid flags";
  EXPECT_NE(error_of({"--batch", "x3"}).find("needs an integer"), std::string::npos);
  EXPECT_NE(error_of({"--lr", "fast"}).find("needs a number"), std::string::npos);
  EXPECT_NE(error_of({"--device", "tpu"}).find("choose one of cpu, meta"), std::string::npos);
  EXPECT_NE(error_of({"--batch"}).find("needs a value"), std::string::npos);
  EXPECT_NE(error_of({"batch"}).find("unexpected argument"), std::string::npos);
}

TEST(EngineTrain, HelpUnknownModelAndBadFlag) {
  auto [code, out] = shell(testutil::program("engine_train") + " --help");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("--model"), std::string::npos);
  std::tie(code, out) = shell(testutil::program("engine_train") + " --model nosuchmodel --device meta");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("unknown model 'nosuchmodel'"), std::string::npos) << out;
  EXPECT_NE(out.find("transformer_lm"), std::string::npos) << "lists the valid models: " << out;
  std::tie(code, out) = shell(testutil::program("engine_train") + " --model transformer_lm --stepz 3");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("unknown flag --stepz"), std::string::npos) << out;
  // A flag the run would ignore is an error too.
  std::tie(code, out) = shell(testutil::program("engine_train") + " --model transformer_lm --prefill-tokens 64");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("--prefill-tokens sizes the prompt passes of --generate"), std::string::npos) << out;
  std::tie(code, out) = shell(testutil::program("engine_train") + " --model yolov3 --device meta --task mnli");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("--task chooses the tasks of mtdnn"), std::string::npos) << out;
}

TEST(EngineTrain, OutOfMemoryIsAReportNotACrash) {
  auto [code, out] = shell(testutil::program("engine_train") +
                           " --model transformer_lm --size small --device meta --memory 2GB --steps 1");
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("out of memory on meta"), std::string::npos) << out;
  EXPECT_NE(out.find("largest live tensors"), std::string::npos) << out;
}

TEST(EngineTrain, MetaRunOfAFullSizeModel) {
  auto [code, out] =
      shell(testutil::program("engine_train") + " --model transformer_lm --size small --device meta --steps 2");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("step 2/2 | loss - |"), std::string::npos) << out;
  EXPECT_NE(out.find("| param |"), std::string::npos) << out;
  EXPECT_NE(out.find("| optimizer |"), std::string::npos) << out;
}
