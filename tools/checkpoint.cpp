// checkpoint.cpp: the checkpoint's metadata, the save, and the load that splits a file into weights and
// optimizer state.
#include "tools/checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include "engine/io.h"
#include "engine/rng.h"
#include "engine/safetensors.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"

namespace tools {

namespace {

using engine::Error;
using engine::str;
using engine::Tensor;
using Metadata = std::map<std::string, std::string>;

constexpr const char* kMarker = "engine.checkpoint";  // present (= "1") in every engine checkpoint

// The ModelConfig fields a checkpoint records, named as engine_train's flags.
struct TextField {
  const char* flag;
  std::string models::ModelConfig::*member;
};
struct CountField {
  const char* flag;
  int64_t& (*member)(models::ModelConfig&);
};
constexpr TextField kTextFields[] = {
    {"model", &models::ModelConfig::name},          {"size", &models::ModelConfig::size},
    {"attention", &models::ModelConfig::attention}, {"recompute", &models::ModelConfig::recompute},
    {"precision", &models::ModelConfig::precision}, {"optimizer", &models::ModelConfig::optimizer},
    {"data", &models::ModelConfig::data},           {"task", &models::ModelConfig::task},
    {"backbone", &models::ModelConfig::backbone}};
constexpr CountField kCountFields[] = {
    {"seq", [](models::ModelConfig& c) -> int64_t& { return c.seq; }},
    {"batch", [](models::ModelConfig& c) -> int64_t& { return c.batch; }},
    {"tokens", [](models::ModelConfig& c) -> int64_t& { return c.tokens; }},
    {"accumulate", [](models::ModelConfig& c) -> int64_t& { return c.accumulate; }},
    {"r1-every", [](models::ModelConfig& c) -> int64_t& { return c.r1_every; }},
    {"layers", [](models::ModelConfig& c) -> int64_t& { return c.dims.layers; }},
    {"hidden", [](models::ModelConfig& c) -> int64_t& { return c.dims.hidden; }},
    {"heads", [](models::ModelConfig& c) -> int64_t& { return c.dims.heads; }},
    {"ffn", [](models::ModelConfig& c) -> int64_t& { return c.dims.ffn; }},
    {"vocab", [](models::ModelConfig& c) -> int64_t& { return c.dims.vocab; }},
    {"positions", [](models::ModelConfig& c) -> int64_t& { return c.dims.positions; }}};

std::string key(const char* flag) { return std::string("engine.") + flag; }

uint64_t parse_u64(const std::string& path, const Metadata& m, const std::string& k) {
  auto it = m.find(k);
  ENGINE_CHECK(it != m.end(), path, ": the checkpoint's metadata has no '", k, "' entry");
  const std::string& text = it->second;
  ENGINE_CHECK(!text.empty() && text.size() <= 20 && text.find_first_not_of("0123456789") == std::string::npos, path,
               ": metadata '", k, "' = '", text, "' is not a non-negative integer");
  return std::stoull(text);
}

// Every error of a load names the file (the safetensors reader's already do).
template <typename F>
auto naming_file(const std::string& path, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const engine::OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.find(path) != std::string::npos) throw;
    throw Error(str(path, ": ", what));
  }
}

std::string listed(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 10; i++) s += (i ? ", " : "") + names[i];
  if (names.size() > 10) s += str(", ... (", names.size(), " in all)");
  return s;
}

// Optimizer k's metadata keys in a checkpoint: its own for the first, prefixed "optimizers.<k>." after it.
std::string optimizer_key(size_t k, const std::string& key_name) {
  return k == 0 ? key_name : str("optimizers.", k, ".", key_name);
}
Metadata optimizer_metadata(const Metadata& m, size_t k) {
  if (k == 0) return m;
  Metadata out;
  const std::string prefix = optimizer_key(k, "");
  for (const auto& [key_name, value] : m)
    if (key_name.rfind(prefix, 0) == 0) out[key_name.substr(prefix.size())] = value;
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
namespace {
void save_whole(const std::string& path, models::Model& model, const models::ModelConfig& config, int64_t step) {
  auto params = model.module().named_parameters();
  ENGINE_CHECK(params.empty() || params.front().second.device().type() != engine::DeviceType::meta, "--save ", path,
               ": the model is on the meta device, which holds shapes and no values: there is nothing to save "
               "(run on cpu or cuda to save a checkpoint)");
  std::vector<std::pair<std::string, Tensor>> tensors = params;
  for (auto& b : model.module().named_buffers()) tensors.push_back(b);
  // Every optimizer's state (a GAN has one per network): tensors under their parameters' names, metadata keys
  // prefixed "optimizers.<k>." from the second optimizer on (optimizer_metadata reads them back).
  Metadata metadata;
  const std::vector<ops::Optimizer*> optimizers = model.optimizers();
  for (size_t k = 0; k < optimizers.size(); k++) {
    ops::OptimizerState state = model.checkpoint_state(*optimizers[k]);  // under ZeRO: assembled from the ranks
    for (auto& s : state.tensors) tensors.push_back(s);
    for (const auto& [key_name, value] : state.metadata) metadata[optimizer_key(k, key_name)] = value;
  }
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors)
    ENGINE_CHECK(seen.insert(name).second, "--save ", path, ": two tensors are named '", name,
                 "' (an optimizer state name equals a parameter's or buffer's)");

  metadata[kMarker] = "1";
  for (const auto& f : kTextFields) metadata[key(f.flag)] = config.*f.member;
  models::ModelConfig saved_config = config;
  for (const auto& f : kCountFields) metadata[key(f.flag)] = std::to_string(f.member(saved_config));
  metadata[key("batch")] = std::to_string(model.batch_size());  // the batch in effect, defaults resolved
  metadata[key("seed")] = std::to_string(config.seed);
  metadata[key("step")] = std::to_string(step);
  metadata[key("generator.seed")] = std::to_string(engine::generator().seed);
  metadata[key("generator.offset")] = std::to_string(engine::generator().offset);
  if (model.rank() == 0) engine::save_safetensors(path, tensors, metadata);  // the world's checkpoint: rank 0's
}
}  // namespace

void save_checkpoint(const std::string& path, models::Model& model, const models::ModelConfig& config, int64_t step) {
  // Under ZeRO-3 the parameters are gathered whole for the file (and released after).
  model.with_whole_parameters([&] { save_whole(path, model, config, step); });
}

// ---------------------------------------------------------------------------------------------------
void check_hf_exportable(models::Model& model, const std::string& dir) {
  ENGINE_CHECK(!model.hf_config_json().empty(), "--export-hf ", dir, ": this model has no Hugging Face transformers "
               "architecture to export to (the BERT family has: bert_base, bert_squad); use --save for an engine "
               "checkpoint");
  auto params = model.module().named_parameters();
  ENGINE_CHECK(params.empty() || params.front().second.device().type() != engine::DeviceType::meta, "--export-hf ",
               dir, ": the model is on the meta device, which holds no values (run on cpu or cuda)");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ENGINE_CHECK(!ec && std::filesystem::is_directory(dir) && access(dir.c_str(), W_OK) == 0, "--export-hf ", dir,
               ": cannot create or write this folder", ec ? " (" + ec.message() + ")" : std::string());
}

namespace {
void export_whole(const std::string& dir, models::Model& model) {
  check_hf_exportable(model, dir);
  // Under ZeRO each rank holds pieces of the f32 masters: the whole ones, assembled from the ranks (a collective
  // every rank takes part in, as for --save).
  std::map<std::string, Tensor> masters;
  if (model.zero_stage() > 0)
    for (ops::Optimizer* o : model.optimizers())
      for (auto& [key, t] : model.checkpoint_state(*o).tensors)
        if (key.size() > 7 && key.compare(key.size() - 7, 7, ".master") == 0)
          masters[key.substr(0, key.size() - 7)] = t;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, p] : model.module().named_parameters()) {
    Tensor master =
        model.zero_stage() > 0 ? (masters.count(name) ? masters.at(name) : Tensor()) : model.master_weight(name);
    tensors.push_back({name, master.defined() ? master : p});
  }
  for (auto& b : model.module().named_buffers()) tensors.push_back(b);
  if (model.rank() != 0) return;  // the world's export: rank 0's
  const std::string base = (std::filesystem::path(dir) / "").string();
  engine::save_safetensors(base + "model.safetensors", tensors, {{"format", "pt"}});
  engine::write_file_atomic(base + "config.json", model.hf_config_json());
}
}  // namespace

void export_hf(const std::string& dir, models::Model& model) {
  model.with_whole_parameters([&] { export_whole(dir, model); });
}

// ---------------------------------------------------------------------------------------------------
std::string fill_config_from_checkpoint(const std::string& path, models::ModelConfig& config,
                                        const std::function<bool(const std::string& field)>& given) {
  Metadata m = engine::read_safetensors_metadata(path);
  if (!m.count(kMarker)) return "";  // weights only: the command line says what model they are for
  auto saved = [&](const char* flag) -> const std::string* {
    auto it = m.find(key(flag));
    return it == m.end() ? nullptr : &it->second;
  };
  const std::string* model = saved("model");
  ENGINE_CHECK(model, path, ": the checkpoint's metadata has no 'engine.model' entry");
  ENGINE_CHECK(!given("model") || config.name == *model, path, ": this checkpoint was written by model '", *model,
               "', not '", config.name, "'");
  // A checkpoint never chooses a file to read: the data it was trained on must be given again.
  const std::string* data = saved("data");
  ENGINE_CHECK(!data || data->empty() || given("data"), path, ": this checkpoint was trained with --data '", *data,
               "'; give --data (that path or another) to resume: a checkpoint does not name the files a run reads");
  std::string filled;
  for (const auto& f : kTextFields)
    if (!given(f.flag) && saved(f.flag) && std::string(f.flag) != "data") {
      config.*f.member = *saved(f.flag);
      if (!saved(f.flag)->empty() && std::string(f.flag) != "model") filled += str(" --", f.flag, " ", *saved(f.flag));
    }
  // Sizes are checked against the model's limits when it is built (models::create_model); here, against int64.
  for (const auto& f : kCountFields)
    if (!given(f.flag) && saved(f.flag)) {
      const uint64_t v = parse_u64(path, m, key(f.flag));
      ENGINE_CHECK(v <= uint64_t(INT64_MAX), path, ": metadata '", key(f.flag), "' = ", v, " is out of range");
      f.member(config) = int64_t(v);
      models::ModelConfig defaults;
      if (int64_t(v) != f.member(defaults)) filled += str(" --", f.flag, " ", v);
    }
  if (!given("seed") && saved("seed")) config.seed = parse_u64(path, m, key("seed"));
  return filled;
}

// ---------------------------------------------------------------------------------------------------
CheckpointLoad load_checkpoint(const std::string& path, models::Model& model, bool with_optimizer) {
  return naming_file(path, [&] {
    Metadata metadata = engine::read_safetensors_metadata(path);
    CheckpointLoad result;
    result.engine_checkpoint = metadata.count(kMarker) > 0;

    // Onto the model's device: weights are copied from there, optimizer state is adopted in place.
    auto params = model.module().named_parameters();
    auto device = params.empty() ? engine::default_device() : params.front().second.device_ptr();
    std::map<std::string, Tensor> tensors;
    {
      engine::MemoryScope owner("checkpoint");
      tensors = engine::load_safetensors(path, device);
    }

    // An engine file: the module's names are weights, the rest optimizer state. Any other file: all of it
    // is weights, and the model's load_weights decides what it accepts.
    std::set<std::string> module_names;
    for (const auto& [n, t] : params) module_names.insert(n);
    for (const auto& [n, t] : model.module().named_buffers()) module_names.insert(n);
    std::map<std::string, Tensor> weights, rest;
    for (auto& [name, t] : tensors) (result.engine_checkpoint && !module_names.count(name) ? rest : weights)[name] = t;
    tensors.clear();
    std::vector<std::string> loaded = model.load_weights(weights);
    result.weights = loaded.size();
    // Mixed precision: the f32 masters take the file's values (exact for an f32 file; an engine checkpoint's
    // own masters, in its optimizer state, replace them below).
    {
      graph::NoGrad no_grad;
      for (const std::string& name : loaded) {
        Tensor master = model.master_weight(name);
        auto it = weights.find(name);
        if (master.defined() && it != weights.end()) ops::copy_(master, it->second);
      }
    }
    weights.clear();  // the copies go back to the arena
    if (!result.engine_checkpoint) return result;

    if (with_optimizer && !rest.empty()) {
      const std::vector<ops::Optimizer*> optimizers = model.optimizers();
      for (size_t k = 0; k < optimizers.size(); k++) optimizers[k]->load_state(rest, optimizer_metadata(metadata, k));
      result.optimizer_restored = true;
      for (ops::Optimizer* o : optimizers)
        for (const auto& [name, t] : o->state().tensors) rest.erase(name);
      std::vector<std::string> unknown;
      for (const auto& [name, t] : rest) unknown.push_back(name);
      ENGINE_CHECK(unknown.empty(), "the checkpoint has ", unknown.size(),
                   " tensors that neither the model nor its optimizer has: ", listed(unknown));
    }
    result.step = int64_t(parse_u64(path, metadata, key("step")));
    engine::Generator g;
    g.seed = parse_u64(path, metadata, key("generator.seed"));
    g.offset = parse_u64(path, metadata, key("generator.offset"));
    engine::generator() = g;
    return result;
  });
}

}  // namespace tools
