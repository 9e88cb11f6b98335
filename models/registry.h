// registry.h: every model by name. engine_train and engine_bench look models up here, so a model added to
// the table in registry.cpp appears in both with no other change.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"

namespace models {

// The fields of ModelConfig that only some models take. create_model refuses a field given to a model that does not
// take it, naming the models that do, instead of ignoring it; a tool that applies one setting to every model (the
// 2020 table's --attention flash) gives it only to those that take it (model_takes).
enum Takes : unsigned {
  kDims = 1u << 0,      // dims (--layers --hidden --heads --ffn --vocab --positions, --config): a transformer's shape
  kSeq = 1u << 1,       // seq: one sequence length for every sequence of a batch
  kTokens = 1u << 2,    // tokens: batches counted in tokens (the translation models, which refuse --batch)
  kFlash = 1u << 3,     // attention "flash": multi-head attention with a flash path
  kGenerate = 1u << 4,  // generate: a decoder LM's --generate N
  kTasks = 1u << 5,     // task: a multi-task model's tasks
  kBackbone = 1u << 6,  // backbone: a choice of backbone
  kR1Every = 1u << 7,   // r1_every: a GAN's lazy R1 penalty
};

struct ModelEntry {
  std::string name;
  std::string description;
  std::function<std::unique_ptr<Model>(const ModelConfig&)> create;
  unsigned takes = 0;  // Takes flags
  bool has(Takes t) const { return (takes & t) != 0; }
};

const std::vector<ModelEntry>& registry();
std::vector<std::string> model_names();
// Whether the named model takes the field (false for an unknown name), and the names of those that do.
bool model_takes(const std::string& name, Takes t);
std::string models_taking(Takes t);
// Builds the model on the current default device; an unknown name is an Error listing the valid ones.
std::unique_ptr<Model> create_model(const ModelConfig& config);

}  // namespace models
