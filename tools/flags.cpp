// flags.cpp: parsing and validation of command-line flags.
#include "tools/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <typeinfo>

#include "engine/device.h"
#include "engine/error.h"

namespace tools {

using engine::Error;
using engine::str;

Flags::Flags(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {
  add_bool("help", "print this help and exit");
}

void Flags::add(const std::string& name, Flag f) {
  flags_[name] = std::move(f);
  order_.push_back(name);
}

void Flags::add_string(const std::string& name, const std::string& def, const std::string& help) {
  add(name, {Kind::string, def, help, {}});
}
void Flags::add_int(const std::string& name, int64_t def, const std::string& help) {
  add(name, {Kind::integer, std::to_string(def), help, {}});
}
void Flags::add_double(const std::string& name, double def, const std::string& help) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", def);
  add(name, {Kind::real, buf, help, {}});
}
void Flags::add_bool(const std::string& name, const std::string& help) { add(name, {Kind::boolean, "0", help, {}}); }
void Flags::add_choice(const std::string& name, const std::string& def, const std::vector<std::string>& choices,
                       const std::string& help) {
  add(name, {Kind::choice, def, help, choices});
}

namespace {
std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string o;
  for (size_t i = 0; i < v.size(); i++) o += (i ? sep : "") + v[i];
  return o;
}
}  // namespace

bool Flags::parse(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0)
      throw Error(engine::str(program_, ": unexpected argument '", arg, "': flags start with -- (see --help)"));
    std::string name = arg.substr(2), value;
    bool has_value = false;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      std::vector<std::string> names;
      for (const auto& n : order_) names.push_back("--" + n);
      throw Error(engine::str(program_, ": unknown flag --", name, ". Valid flags: ", join(names, ", ")));
    }
    Flag& f = it->second;
    if (f.kind == Kind::boolean) {
      if (has_value && value != "1" && value != "true" && value != "0" && value != "false")
        throw Error(engine::str(program_, ": --", name, " is a switch; give it no value (or =true/=false)"));
      f.value = (!has_value || value == "1" || value == "true") ? "1" : "0";
      f.given = true;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) throw Error(engine::str(program_, ": --", name, " needs a value (", f.help, ")"));
      value = argv[++i];
    }
    if (f.kind == Kind::integer) {
      char* end = nullptr;
      errno = 0;
      std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end)
        throw Error(engine::str(program_, ": --", name, " needs an integer, got '", value, "'"));
      if (errno == ERANGE)
        throw Error(engine::str(program_, ": --", name, " ", value, " is out of range (a 64-bit integer: at most ",
                                INT64_MAX, ")"));
    } else if (f.kind == Kind::real) {
      char* end = nullptr;
      errno = 0;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end) throw Error(engine::str(program_, ": --", name, " needs a number, got '", value, "'"));
      if (errno == ERANGE || !std::isfinite(v))
        throw Error(engine::str(program_, ": --", name, " ", value, " is not a finite number in range"));
    } else if (f.kind == Kind::choice) {
      bool ok = false;
      for (const auto& c : f.choices) ok |= c == value;
      if (!ok)
        throw Error(
            engine::str(program_, ": --", name, " ", value, " is not valid; choose one of ", join(f.choices, ", ")));
    }
    f.value = value;
    f.given = true;
  }
  if (on("help")) {
    std::fputs(help().c_str(), stdout);
    return false;
  }
  return true;
}

const Flags::Flag& Flags::find(const std::string& name) const {
  auto it = flags_.find(name);
  ENGINE_CHECK(it != flags_.end(), "flags: no flag named --", name, " was declared");
  return it->second;
}

std::string Flags::str(const std::string& name) const { return find(name).value; }
int64_t Flags::integer(const std::string& name) const { return std::strtoll(find(name).value.c_str(), nullptr, 10); }
double Flags::real(const std::string& name) const { return std::strtod(find(name).value.c_str(), nullptr); }
bool Flags::on(const std::string& name) const { return find(name).value == "1"; }
bool Flags::given(const std::string& name) const { return find(name).given; }

std::string Flags::help() const {
  std::string o = "usage: " + program_ + " [flags]\n" + summary_ + "\n\nflags:\n";
  for (const auto& name : order_) {
    const Flag& f = flags_.at(name);
    std::string left = "  --" + name;
    if (f.kind == Kind::choice) left += " " + join(f.choices, "|");
    else if (f.kind == Kind::integer) left += " N";
    else if (f.kind == Kind::real) left += " X";
    else if (f.kind == Kind::string) left += " S";
    if (left.size() < 34) left.resize(34, ' ');
    else left += "\n" + std::string(34, ' ');
    o += left + f.help;
    if (f.kind != Kind::boolean && !f.value.empty()) o += " (default " + f.value + ")";
    o += "\n";
  }
  return o;
}

int run_main(const char* program, const std::function<int()>& body) {
  auto say = [&](const std::string& what) {
    std::fprintf(stderr, "%s%s\n", what.rfind(program, 0) == 0 ? "" : (std::string(program) + ": ").c_str(),
                 what.c_str());
  };
  try {
    return body();
  } catch (const engine::OutOfMemory& e) {
    say(e.what());
    return 3;
  } catch (const engine::Error& e) {
    say(e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    say("the host ran out of memory (a size given on the command line or read from a file may be too large for "
        "this machine)");
    return 2;
  } catch (const std::length_error& e) {
    say(std::string("a size is too large for the host (") + e.what() + "): check the sizes given on the command line "
        "or read from a file");
    return 2;
  } catch (const std::exception& e) {
    say(std::string("internal error (") + typeid(e).name() + "): " + e.what() + "; this is a bug, please report it "
        "with the command line");
    return 70;
  }
}

}  // namespace tools
