// flags.h: strict command-line flags for the engine's programs.
//
// Every flag is declared with a kind, a default and a help line; anything else on the command line is an
// error that lists the valid flags (a typo never passes silently). Values are checked on parse: an integer
// flag given "abc" says so, a choice flag lists its choices.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tools {

class Flags {
 public:
  explicit Flags(std::string program, std::string summary);

  void add_string(const std::string& name, const std::string& def, const std::string& help);
  void add_int(const std::string& name, int64_t def, const std::string& help);
  void add_double(const std::string& name, double def, const std::string& help);
  void add_bool(const std::string& name, const std::string& help);  // a switch: present = true
  void add_choice(const std::string& name, const std::string& def, const std::vector<std::string>& choices,
                  const std::string& help);

  // Parses argv ("--name value" or "--name=value"). Returns false when --help was asked for (the help text
  // is then printed); throws engine::Error for a bad command line.
  bool parse(int argc, char** argv);

  std::string str(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double real(const std::string& name) const;
  bool on(const std::string& name) const;
  bool given(const std::string& name) const;  // set on the command line (not the default)
  std::string help() const;

 private:
  enum class Kind { string, integer, real, boolean, choice };
  struct Flag {
    Kind kind;
    std::string value, help;
    std::vector<std::string> choices;
    bool given = false;
  };
  std::string program_, summary_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  const Flag& find(const std::string& name) const;
  void add(const std::string& name, Flag f);
};

// A program's main: runs `body` and turns what it throws into one line on stderr and an exit status: the
// engine's out-of-memory report (3), an engine::Error (2: its message already names the flag or file), the
// host running out of memory (2, said in those words, never a bare "std::bad_alloc"), and anything else as an
// internal error (70) with its type, which is a bug to report.
int run_main(const char* program, const std::function<int()>& body);

}  // namespace tools
