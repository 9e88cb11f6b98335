// config_flags.h: a model config written as engine_train's flags, the one place that maps ModelConfig's fields to
// their flag names (the OOM report's commands, engine_bench diff's titles).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"

namespace tools {

// Every setting as (flag, value) in a fixed order, the value "" where the config keeps the model's default
// (--size, --seq, --batch, --tokens, --task, --data) or the flag's (--precision fp32, --attention naive,
// --recompute none, --seed 1).
std::vector<std::pair<std::string, std::string>> config_settings(const models::ModelConfig& config);

// "--model bert_base --seq 512 --batch 64 --precision bf16": the model and every setting that is not a default.
std::string config_flags(const models::ModelConfig& config);

}  // namespace tools
