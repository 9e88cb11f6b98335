// hf_config.cpp: config.json -> TransformerDims, for BertConfig and GPT2Config.
#include "models/hf_config.h"

#include <cmath>

#include "engine/error.h"
#include "engine/io.h"
#include "engine/json.h"

namespace models {

namespace {

using engine::json::Value;

// One config file being read: the members by key with the class's defaults, and errors that name the file.
class ConfigFile {
 public:
  ConfigFile(const std::string& path, const std::string& model) : path_(path), model_(model) {
    root_ = engine::json::parse_json(engine::read_file(path, "--config", 16 * engine::kMiB), path);
    ENGINE_CHECK(root_.is_object(), path, ": a config.json holds one JSON object, this file holds ",
                 engine::json::type_name(root_.type));
  }
  // A whole number in [1, 2^24], or `fallback` (transformers' default) when the key is absent.
  int64_t count(const std::string& key, int64_t fallback) const {
    const Value* v = root_.find(key);
    if (!v || v->type == Value::Type::null) return fallback;
    return engine::json::integer_member(root_, key, 1, int64_t(1) << 24, path_);
  }
  double number(const std::string& key, double fallback) const {
    const Value* v = root_.find(key);
    if (!v) return fallback;
    return engine::json::member(root_, key, Value::Type::number, path_).number;
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    const Value* v = root_.find(key);
    if (!v) return fallback;
    return engine::json::member(root_, key, Value::Type::string, path_).text;
  }
  // The engine builds exactly `engine_value`: another value in the file is an Error.
  void require(const std::string& key, const std::string& value, const std::string& engine_value) const {
    ENGINE_CHECK(value == engine_value, path_, ": ", key, " is \"", value, "\"; ", model_, " builds ", engine_value,
                 " only (remove the key or set it to \"", engine_value, "\")");
  }
  void require(const std::string& key, double value, double engine_value) const {
    ENGINE_CHECK(std::fabs(value - engine_value) <= 1e-9 * std::fabs(engine_value), path_, ": ", key, " is ", value,
                 "; ", model_, " builds ", engine_value, " only (remove the key or set it to ", engine_value, ")");
  }

 private:
  std::string path_, model_;
  Value root_;
};

}  // namespace

std::string hf_model_type(const std::string& model) {
  if (model == "bert_base" || model == "bert_squad" || model == "mtdnn") return "bert";
  if (model == "transformer_lm") return "gpt2";
  return "";
}

TransformerDims read_hf_config(const std::string& path, const std::string& model) {
  const std::string type = hf_model_type(model);
  ENGINE_CHECK(!type.empty(),
               "--config reads a Hugging Face config.json for bert_base, bert_squad, mtdnn (BertConfig) "
               "and transformer_lm (GPT2Config), not for ",
               model, "; its other flags set its shape (--size ...)");
  ConfigFile f(path, model);
  const std::string file_type = f.text("model_type", type);
  ENGINE_CHECK(file_type == type, path, ": model_type is \"", file_type, "\"; ", model, " reads \"", type,
               "\" configs (", type == "bert" ? "BertConfig" : "GPT2Config", ")");
  TransformerDims d;
  if (type == "bert") {  // transformers' BertConfig defaults: BERT-Base
    d.layers = f.count("num_hidden_layers", 12);
    d.hidden = f.count("hidden_size", 768);
    d.heads = f.count("num_attention_heads", 12);
    d.ffn = f.count("intermediate_size", 3072);
    d.vocab = f.count("vocab_size", 30522);
    d.positions = f.count("max_position_embeddings", 512);
    d.dropout = f.number("hidden_dropout_prob", 0.1);
    d.attention_dropout = f.number("attention_probs_dropout_prob", 0.1);
    f.require("hidden_act", f.text("hidden_act", "gelu"), "gelu");
    f.require("type_vocab_size", double(f.count("type_vocab_size", 2)), 2);
    f.require("layer_norm_eps", f.number("layer_norm_eps", 1e-12), 1e-12);
    f.require("position_embedding_type", f.text("position_embedding_type", "absolute"), "absolute");
  } else {  // GPT2Config defaults: GPT-2 small
    d.layers = f.count("n_layer", 12);
    d.hidden = f.count("n_embd", 768);
    d.heads = f.count("n_head", 12);
    d.ffn = f.count("n_inner", 4 * d.hidden);
    d.vocab = f.count("vocab_size", 50257);
    d.positions = f.count("n_positions", 1024);
    d.dropout = f.number("resid_pdrop", 0.1);
    d.attention_dropout = f.number("attn_pdrop", 0.1);
    f.require("embd_pdrop", f.number("embd_pdrop", 0.1), d.dropout);
    f.require("activation_function", f.text("activation_function", "gelu_new"), "gelu_new");
    f.require("layer_norm_epsilon", f.number("layer_norm_epsilon", 1e-5), 1e-5);
  }
  return d;
}

}  // namespace models
