// config_flags.cpp: ModelConfig <-> engine_train's flag names.
#include "tools/config_flags.h"

namespace tools {

std::vector<std::pair<std::string, std::string>> config_settings(const models::ModelConfig& c) {
  auto count = [](int64_t v) { return v > 0 ? std::to_string(v) : std::string(); };
  auto unless = [](const std::string& v, const char* def) { return v == def ? std::string() : v; };
  return {{"size", c.size},
          {"task", c.task},
          {"seq", count(c.seq)},
          {"batch", count(c.batch)},
          {"tokens", count(c.tokens)},
          {"precision", unless(c.precision, "fp32")},
          {"attention", unless(c.attention, "naive")},
          {"recompute", unless(c.recompute, "none")},
          {"data", c.data},
          {"seed", c.seed == 1 ? std::string() : std::to_string(c.seed)}};
}

std::string config_flags(const models::ModelConfig& c) {
  std::string s = "--model " + c.name;
  for (const auto& [flag, value] : config_settings(c))
    if (!value.empty()) s += " --" + flag + " " + value;
  return s;
}

}  // namespace tools
