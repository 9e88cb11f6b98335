// hf_config.h: a Hugging Face transformers config.json as a transformer's dimensions (engine_train --config FILE).
//
// The BERT family (bert_base, bert_squad, mtdnn) reads BertConfig's keys (num_hidden_layers, hidden_size,
// num_attention_heads, intermediate_size, vocab_size, max_position_embeddings, the two dropout probabilities);
// transformer_lm reads GPT2Config's (n_layer, n_embd, n_head, n_inner (null: 4 x n_embd), vocab_size, n_positions,
// resid_pdrop). A key the file leaves out takes transformers' default for that class, as from_pretrained would.
// Keys that would change the network in a way the engine does not build are an Error naming the key and the value
// the engine has (hidden_act other than gelu, type_vocab_size other than 2, a different layer-norm epsilon, ...);
// keys that do not shape a training step (architectures, torch_dtype, id2label, ...) are ignored.
#pragma once
#include <string>

#include "models/model.h"

namespace models {

// The model_type a file must have for `model` ("bert" or "gpt2"), "" for a model that reads no config files.
std::string hf_model_type(const std::string& model);
// Reads `path` for `model`; an unreadable file, a syntax error, a wrong model_type or an unsupported key is an Error.
TransformerDims read_hf_config(const std::string& path, const std::string& model);

}  // namespace models
