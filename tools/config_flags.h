// config_flags.h: a model config written as engine_train's flags, the one place that maps ModelConfig's fields to
// their flag names (the OOM report's commands, engine_bench diff's titles), and the flags engine_train and
// engine_bench share for a model's shape and optimizer.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"
#include "tools/flags.h"

namespace tools {

// Every setting as (flag, value) in a fixed order, the value "" where the config keeps the model's default
// (--size, --seq, --batch, --tokens, --task, --data, --optimizer, the dimensions) or the flag's (--precision fp32,
// --attention naive, --recompute none, --seed 1); kSwitchOn for a switch that is on (--bucket-view, written alone).
constexpr const char* kSwitchOn = "on";
std::vector<std::pair<std::string, std::string>> config_settings(const models::ModelConfig& config);

// The transformer dimensions' part of config_settings (--layers ... --attention-dropout), in the same order.
std::vector<std::pair<std::string, std::string>> dims_settings(const models::ModelConfig& config);

// "--model bert_base --seq 512 --batch 64 --precision bf16": the model and every setting that is not a default.
std::string config_flags(const models::ModelConfig& config);

// The flags that reshape a transformer or change the optimizer, shared by engine_train and engine_bench:
// --config FILE (a Hugging Face config.json, models/hf_config.h), then --layers --hidden --heads --ffn --vocab
// --positions --dropout --attention-dropout over it, and --optimizer.
void add_shape_flags(Flags& flags);
// Reads them into `config` (whose name is set: --config reads the file for that model).
void read_shape_flags(const Flags& flags, models::ModelConfig& config);

}  // namespace tools
