// config_flags.cpp: ModelConfig <-> engine_train's flag names.
#include "tools/config_flags.h"

#include "engine/format.h"
#include "models/hf_config.h"
#include "ops/optimizer.h"

namespace tools {

namespace {

// The integer dimensions by flag name.
struct DimFlag {
  const char* flag;
  int64_t models::TransformerDims::*member;
  const char* help;
};
constexpr DimFlag kDimFlags[] = {
    {"layers", &models::TransformerDims::layers, "transformer layers (a seq2seq model: on each side)"},
    {"hidden", &models::TransformerDims::hidden, "hidden size (a multiple of --heads)"},
    {"heads", &models::TransformerDims::heads, "attention heads"},
    {"ffn", &models::TransformerDims::ffn, "feed-forward (intermediate) size"},
    {"vocab", &models::TransformerDims::vocab, "vocabulary size"},
    {"positions", &models::TransformerDims::positions, "learned positions (the longest --seq)"}};

std::string number(double v) { return engine::str(v); }

}  // namespace

std::vector<std::pair<std::string, std::string>> config_settings(const models::ModelConfig& c) {
  auto count = [](int64_t v) { return v > 0 ? std::to_string(v) : std::string(); };
  auto unless = [](const std::string& v, const char* def) { return v == def ? std::string() : v; };
  std::vector<std::pair<std::string, std::string>> s = {{"size", c.size},          {"task", c.task},
                                                        {"backbone", c.backbone},  {"seq", count(c.seq)},
                                                        {"batch", count(c.batch)}, {"tokens", count(c.tokens)}};
  const auto dims = dims_settings(c);
  s.insert(s.end(), dims.begin(), dims.end());
  s.insert(s.end(), {{"accumulate", c.accumulate > 1 ? std::to_string(c.accumulate) : ""},
                     {"r1-every", c.r1_every > 1 ? std::to_string(c.r1_every) : ""},
                     {"generate", count(c.generate)},
                     {"prefill-tokens", c.prefill_tokens == 8192 ? "" : std::to_string(c.prefill_tokens)},
                     {"precision", unless(c.precision, "fp32")},
                     {"attention", unless(c.attention, "naive")},
                     {"recompute", unless(c.recompute, "none")},
                     {"optimizer", c.optimizer},
                     {"data", c.data},
                     {"seed", c.seed == 1 ? std::string() : std::to_string(c.seed)},
                     {"world-size", c.world_size > 1 ? std::to_string(c.world_size) : ""},
                     {"rank", c.rank > 0 ? std::to_string(c.rank) : ""},
                     {"zero", c.zero > 0 ? std::to_string(c.zero) : ""},
                     {"bucket-mb", c.world_size > 1 && c.bucket_mb != 25 ? std::to_string(c.bucket_mb) : ""},
                     {"bucket-view", c.world_size > 1 && c.bucket_view ? kSwitchOn : ""}});
  return s;
}

std::vector<std::pair<std::string, std::string>> dims_settings(const models::ModelConfig& c) {
  std::vector<std::pair<std::string, std::string>> s;
  for (const DimFlag& d : kDimFlags)
    s.emplace_back(d.flag, c.dims.*d.member > 0 ? std::to_string(c.dims.*d.member) : std::string());
  s.emplace_back("dropout", c.dims.dropout >= 0 ? number(c.dims.dropout) : "");
  s.emplace_back("attention-dropout", c.dims.attention_dropout >= 0 ? number(c.dims.attention_dropout) : "");
  return s;
}

std::string config_flags(const models::ModelConfig& c) {
  std::string s = "--model " + c.name;
  for (const auto& [flag, value] : config_settings(c))
    if (!value.empty()) s += " --" + flag + (value == kSwitchOn ? std::string() : " " + value);
  return s;
}

void add_shape_flags(Flags& f) {
  f.add_string("config", "",
               "a Hugging Face config.json giving the transformer's shape (BertConfig keys for bert_base, bert_squad "
               "and mtdnn, GPT2Config keys for transformer_lm); the flags below override single values");
  for (const DimFlag& d : kDimFlags) f.add_int(d.flag, 0, std::string(d.help) + " (0: the size's or --config's)");
  f.add_double("dropout", -1, "dropout probability of a transformer (negative: the size's or --config's)");
  f.add_double("attention-dropout", -1, "dropout on the attention probabilities (negative: the size's or --config's)");
  std::string names;
  for (const auto& n : ops::optimizer_names()) names += (names.empty() ? "" : ", ") + n;
  f.add_string(
      "optimizer", "",
      "the optimizer instead of the model's recipe (its learning rate, schedule and weight decay kept): " + names);
}

void read_shape_flags(const Flags& f, models::ModelConfig& c) {
  if (f.given("config")) c.dims = models::read_hf_config(f.str("config"), c.name);
  for (const DimFlag& d : kDimFlags)
    if (f.given(d.flag)) {
      ENGINE_CHECK(f.integer(d.flag) > 0, "--", d.flag, " must be positive, got ", f.integer(d.flag));
      c.dims.*d.member = f.integer(d.flag);
    }
  if (f.given("dropout")) c.dims.dropout = f.real("dropout");
  if (f.given("attention-dropout")) c.dims.attention_dropout = f.real("attention-dropout");
  c.optimizer = f.str("optimizer");
}

}  // namespace tools
