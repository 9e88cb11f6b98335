// world_util.h: what the data-parallel program-level tests read from engine_train's output (cpu ranks in
// data_parallel_test.cpp, cuda ranks in data_parallel_cuda_test.cpp).
#pragma once
#include <sstream>
#include <string>
#include <vector>

#include "engine/io.h"
#include "engine/json.h"

namespace testutil {

// The "loss X" pieces of the step lines, in order.
inline std::vector<std::string> step_losses(const std::string& out) {
  std::vector<std::string> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("step ", 0) == 0) {
      const size_t at = line.find("| loss ") + 7;
      v.push_back(line.substr(at, line.find(" |", at) - at));
    }
  return v;
}

// The run's peak, each step's peak and the peak's bytes by category, from --json (numbers by their literal text).
inline std::string ledger_of(const std::string& json_path) {
  const engine::json::Value v =
      engine::json::parse_json(engine::read_file(json_path, "--json", size_t(1) << 26), json_path);
  std::ostringstream os;
  const engine::json::Value& peak = v.at("peak", json_path);
  os << "peak " << peak.at("bytes", json_path).text << " |";
  for (const auto& s : v.at("steps", json_path).items) os << " " << s.at("peak_bytes", json_path).text;
  for (const auto& [k, b] : peak.at("by_category", json_path).members) os << " | " << k << " " << b.text;
  return os.str();
}

}  // namespace testutil
