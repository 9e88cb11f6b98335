// registry.h: every model by name. engine_train and engine_bench look models up here, so a model added to
// the table in registry.cpp appears in both with no other change.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"

namespace models {

struct ModelEntry {
  std::string name;
  std::string description;
  std::function<std::unique_ptr<Model>(const ModelConfig&)> create;
  bool transformer = false;  // takes ModelConfig::dims (--layers --hidden ... and --config)
  bool generates = false;    // takes ModelConfig::generate (a decoder LM's --generate N)
  bool sequences = false;    // takes ModelConfig::seq (--seq: one length for every sequence of a batch)
};

const std::vector<ModelEntry>& registry();
std::vector<std::string> model_names();
// Whether the named model takes ModelConfig::seq (ModelEntry::sequences), and the names of those that do.
bool takes_seq(const std::string& name);
std::string names_taking_seq();
// Builds the model on the current default device; an unknown name is an Error listing the valid ones.
std::unique_ptr<Model> create_model(const ModelConfig& config);

}  // namespace models
