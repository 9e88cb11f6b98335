// mtdnn.cpp: the MT-DNN network (BERT + one head per task), its task sampling and its batches.
#include "models/mtdnn/mtdnn.h"

#include <algorithm>
#include <random>

#include "engine/rng.h"
#include "models/bert/pretraining.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/view.h"

namespace models::mtdnn {

using data::GlueKind;
using engine::DType;

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

bool uses_san(const data::GlueTask& t) { return t.kind == GlueKind::pair_classification; }
bool is_pair(const data::GlueTask& t) { return t.kind != GlueKind::single_classification; }

// A generator for one purpose of one step: the same (seed, step, purpose) always gives the same numbers.
enum Stream : uint32_t { task_stream = 1, data_stream = 2 };
std::mt19937_64 step_rng(uint64_t seed, int64_t step, Stream stream) {
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(uint64_t(step)), uint32_t(uint64_t(step) >> 32),
                    uint32_t(stream)};
  return std::mt19937_64(seq);
}

}  // namespace

MtdnnConfig MtdnnConfig::from(const ModelConfig& c) {
  MtdnnConfig m;
  std::string size = c.size.empty() ? "large" : c.size;
  if (size == "tiny") m.seq = 64;
  if (c.seq) m.seq = c.seq;
  m.bert = bert::bert_config_from(c, "large", m.seq, /*tiny_grows=*/false);
  // --dropout (a config.json's hidden_dropout_prob) is mt-dnn's dropout_p everywhere: the heads' and SAN's too.
  if (c.dims.dropout >= 0) m.dropout = m.san.dropout = c.dims.dropout;
  if (!c.task.empty()) m.tasks = split_commas(c.task);
  if (c.batch) m.batch = c.batch;
  m.data = c.data;
  m.seed = c.seed;
  return m;
}

// ---------------------------------------------------------------------------------------------------
MtdnnNet::MtdnnNet(const MtdnnConfig& c) : config(c) {
  bert = register_module("bert", std::make_shared<bert::BertModel>(c.bert, /*with_pooler=*/true));
  auto scoring_list = register_module("scoring_list", std::make_shared<graph::Module>());
  const int64_t C = c.bert.hidden;
  for (size_t i = 0; i < c.tasks.size(); i++) {
    TaskHead h;
    h.task = &data::glue_task(c.tasks[i]);
    std::string name = std::to_string(i);
    if (uses_san(*h.task))
      h.san = scoring_list->register_module(name, std::make_shared<SanClassifier>(C, h.task->num_outputs(), c.san));
    else
      h.linear = scoring_list->register_module(
          name, std::make_shared<nn::Linear>(C, h.task->num_outputs(), true, nn::Init::normal(c.bert.init_std)));
    heads.push_back(h);
  }
}

Tensor MtdnnNet::forward(int64_t task, const Batch& batch) const {
  ENGINE_CHECK(task >= 0 && task < int64_t(heads.size()), "mtdnn: task index ", task, " outside [0, ", heads.size(),
               ")");
  const TaskHead& h = heads[size_t(task)];
  Tensor hidden = bert->forward(batch.at("ids"), batch.at("token_types"), batch.at("padding"));  // [B, T, C]
  engine::MemoryScope s("scoring_list");
  if (h.san) {
    auto w = batch.find("turn_weights");
    return h.san->forward(hidden, batch.at("not_premise"), batch.at("not_hypothesis"),
                          w == batch.end() ? Tensor() : w->second);  // [B, n]
  }
  Tensor pooled = bert->pooler->forward(hidden);  // [B, C]
  return h.linear->forward(ops::dropout(pooled, config.dropout, training()));  // [B, n] or [B, 1]
}

Tensor MtdnnNet::loss(int64_t task, const Batch& batch) const {
  Tensor out = forward(task, batch);
  engine::MemoryScope s("loss");
  const data::GlueTask& t = *heads[size_t(task)].task;
  // Losses in f32, as every loss of the engine: under bf16/fp16 the small [B, n] outputs are cast first
  // (no-ops in fp32).
  if (t.kind == GlueKind::regression) {
    const Tensor& scores = batch.at("scores");  // [B, 1] f32
    return ops::mse_loss(ops::to(out, scores.dtype()), scores);
  }
  if (t.kind == GlueKind::single_classification) return ops::cross_entropy(out, batch.at("labels"));
  // SAN: the negative log-likelihood of the averaged probabilities.
  Tensor target = ops::unsqueeze(batch.at("labels"), 1);  // [B, 1]
  Tensor p = ops::to(out, engine::DType::f32);            // [B, n]
  return ops::neg(ops::mean(ops::gather(ops::log(p), 1, target)));  // -mean_b log P_b[label_b]
}

// ---------------------------------------------------------------------------------------------------
Mtdnn::Mtdnn(const ModelConfig& c) : config_(MtdnnConfig::from(c)) { build(); }
Mtdnn::Mtdnn(const MtdnnConfig& c) : config_(c) { build(); }

void Mtdnn::build() {
  auto& c = config_;
  if (c.tasks.empty())
    for (const auto& t : data::glue_tasks()) c.tasks.push_back(t.name);
  for (size_t i = 0; i < c.tasks.size(); i++) {
    const auto& name = c.tasks[i];
    try {
      data::glue_task(name);
    } catch (const engine::Error& e) {
      throw engine::Error(engine::str("mtdnn: unknown task '", name, "' in --task: valid tasks are ",
                                      data::glue_task_names(), " (or a comma-separated list of them)"));
    }
    ENGINE_CHECK(std::count(c.tasks.begin(), c.tasks.end(), name) == 1, "mtdnn: task '", name,
                 "' is listed twice in --task");
  }
  ENGINE_CHECK(c.task_sampling == "proportional" || c.task_sampling == "uniform", "mtdnn: unknown task sampling '",
               c.task_sampling, "': expected proportional or uniform");
  ENGINE_CHECK(c.seq <= c.bert.max_positions, "mtdnn: --seq ", c.seq, " exceeds BERT's ", c.bert.max_positions,
               " learned positions");
  ENGINE_CHECK(c.seq >= kMinSeq && c.batch >= 1, "mtdnn: --seq ", c.seq, " and --batch ", c.batch, " must be at least ",
               kMinSeq, " and 1");
  tokenizer_ = data::glue_tokenizer(c.data);
  ENGINE_CHECK(tokenizer_->vocab_size() <= c.bert.vocab, "mtdnn: the ", tokenizer_->describe(),
               " does not fit BERT's ", c.bert.vocab, " word embeddings");

  for (const auto& name : c.tasks) {
    const data::GlueTask& t = data::glue_task(name);
    if (c.data.empty()) {
      task_sizes_.push_back(t.train_size);
    } else {
      examples_.push_back(data::read_glue_tsv(t, c.data + "/" + t.folder + "/train.tsv"));
      task_sizes_.push_back(int64_t(examples_.back().size()));
    }
  }

  engine::manual_seed(c.seed);
  net_ = std::make_shared<MtdnnNet>(c);
  net_->tag_memory();
  ops::AdamaxOptions o;
  o.lr = c.lr;
  o.eps = 1e-6;
  optimizer_ = std::make_unique<ops::Adamax>(net_->named_parameters(), o);
  int64_t total = schedule_steps();
  schedule_ = std::make_unique<ops::LinearWarmupDecay>(c.lr, int64_t(c.warmup_fraction * double(total)), total);
  clip_norm_ = c.clip_norm;
}

int64_t Mtdnn::schedule_steps() const {
  if (config_.total_steps > 0) return config_.total_steps;
  int64_t rows = 0;
  for (int64_t n : task_sizes_) rows += n;
  return config_.epochs * ((rows + config_.batch - 1) / config_.batch);
}

int64_t Mtdnn::task_of_step(int64_t step) const {
  if (task_sizes_.size() == 1) return 0;
  bool uniform = config_.task_sampling == "uniform";
  uint64_t total = 0;
  for (int64_t n : task_sizes_) total += uniform ? 1 : uint64_t(n);
  // (Seeding a Mersenne Twister per step instead, seed_seq over its 312 words, was a third of mtdnn's meta probes.)
  const uint64_t seed = config_.seed, at = uint64_t(step);
  const uint32_t ctr[4] = {uint32_t(at), uint32_t(at >> 32), uint32_t(task_stream), 0u};
  const uint32_t key[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  uint32_t bits[4];
  engine::philox4x32_10_full(ctr, key, bits);
  uint64_t r = ((uint64_t(bits[0]) << 32) | bits[1]) % total;  // a row of the concatenated training sets (or a task)
  for (size_t i = 0; i < task_sizes_.size(); i++) {
    uint64_t n = uniform ? 1 : uint64_t(task_sizes_[i]);
    if (r < n) return int64_t(i);
    r -= n;
  }
  return int64_t(task_sizes_.size()) - 1;
}

std::function<bool(const std::string&)> Mtdnn::world_trains(int64_t step) const {
  if (task_sizes_.size() == 1) return {};
  const int64_t parts = int64_t(world_size()) * accumulation();
  std::vector<bool> trained(task_sizes_.size(), false);
  bool pooler = false;  // the pooler feeds the linear heads only (SAN reads the sequence)
  for (int64_t p = 0; p < parts; p++) {
    const int64_t task = task_of_step((step - 1) * parts + p + 1);
    trained[size_t(task)] = true;
    pooler = pooler || !net_->heads[size_t(task)].san;
  }
  return [trained, pooler](const std::string& name) {
    const std::string heads = "scoring_list.";
    if (name.rfind("bert.pooler.", 0) == 0) return pooler;
    if (name.compare(0, heads.size(), heads) != 0) return true;  // the rest of the encoder: every task's
    const size_t task = size_t(std::stoull(name.substr(heads.size(), name.find('.', heads.size()) - heads.size())));
    return task < trained.size() && trained[task];
  };
}

std::vector<int64_t> Mtdnn::probe_schedule() const {
  const size_t tasks = task_sizes_.size();
  // Optimizer step s reads data steps (s - 1) P + p + 1, p < P = world x accumulation; this rank's are p = rank k + j.
  const int64_t k = accumulation(), parts = int64_t(world_size()) * k, mine = int64_t(rank()) * k;
  auto has = [&](int64_t step, int64_t task, int64_t from, int64_t count) {
    for (int64_t p = from; p < from + count; p++)
      if (task_of_step((step - 1) * parts + p + 1) == task) return true;
    return false;
  };
  // The first step at or after `from` that trains `task` somewhere in the world (its head then gets its state on
  // every rank: world_trains), or on this rank (`own`: a step of that kind here). Every task has rows, so it comes;
  // the bound only turns a sampling bug into an error instead of a hang.
  auto next_of = [&](int64_t task, int64_t from, bool own) {
    for (int64_t step = from; step < from + (int64_t(1) << 32); step++)
      if (has(step, task, own ? mine : 0, own ? k : parts)) return step;
    throw engine::Error(engine::str("mtdnn: task ", config_.tasks[size_t(task)], " is never sampled"));
  };
  std::vector<int64_t> first, again;
  for (size_t t = 0; t < tasks; t++) first.push_back(next_of(int64_t(t), 1, false));
  std::sort(first.begin(), first.end());
  for (size_t t = 0; t < tasks; t++) again.push_back(next_of(int64_t(t), first.back() + 1, true));
  std::sort(again.begin(), again.end());
  first.insert(first.end(), again.begin(), again.end());
  return first;
}

std::string Mtdnn::summary() const {
  const auto& c = config_;
  std::string heads;
  for (const auto& h : net_->heads)
    heads += engine::str(heads.empty() ? "" : " ", h.task->name, "(",
                         h.san ? "san" : h.task->kind == GlueKind::regression ? "mse" : "linear", ")");
  return engine::str("mtdnn: BERT ", c.bert.layers, " layers, hidden ", c.bert.hidden, ", ", c.bert.heads,
                     " heads, ffn ", c.bert.intermediate, "; heads ", heads, "; tasks sampled ", c.task_sampling,
                     "; seq ", c.seq, ", batch ", c.batch, ", Adamax lr ", c.lr, ", attention ",
                     ops::attention_algo_name(c.bert.algo), ", recompute ", c.bert.recompute, ", data ",
                     c.data.empty() ? "synthetic" : c.data, ", ", tokenizer_->describe());
}

Model::HostBatch Mtdnn::make_host_batch(int64_t step) {
  const auto& c = config_;
  const int task_index = task_of_step(step);
  const data::GlueTask& task = *net_->heads[size_t(task_index)].task;
  const bool pair = is_pair(task);
  std::mt19937_64 rng = step_rng(c.seed, step, data_stream);
  std::vector<data::GlueExample> examples(size_t(c.batch));
  for (auto& e : examples) {
    if (c.data.empty()) {
      e = data::synthetic_glue_example(task, pair ? (c.seq - 3) / 2 : c.seq - 2, rng);
    } else {
      const auto& rows = examples_[size_t(task_index)];
      e = rows[size_t(rng() % rows.size())];
    }
  }
  auto e = std::make_shared<data::EncodedBatch>(data::encode_examples(examples, pair, c.seq, *tokenizer_));
  const bool san = uses_san(task), regression = task.kind == GlueKind::regression;
  // SAN's turn dropout is drawn with the batch, in training only (a host batch is used in the mode it was made in).
  auto turn_weights = std::make_shared<std::vector<double>>();
  if (san && net_->training()) *turn_weights = san_turn_weights(c.batch, c.san.turns, c.san.turn_drop, rng);
  return [this, task_index, e, san, regression, turn_weights]() -> Batch {
    const auto& c = config_;
    batch_task_ = task_index;
    auto dev = engine::default_device();
    const engine::Shape bt{c.batch, c.seq};
    Batch b;
    b["ids"] = ops::from_vector(e->ids, bt, DType::i64, dev);
    b["token_types"] = ops::from_vector(e->token_types, bt, DType::i64, dev);
    b["padding"] = ops::from_vector(e->padding, bt, DType::boolean, dev);
    if (san) {
      b["not_premise"] = ops::from_vector(e->not_premise, bt, DType::boolean, dev);
      b["not_hypothesis"] = ops::from_vector(e->not_hypothesis, bt, DType::boolean, dev);
      if (!turn_weights->empty())  // they weigh activations
        b["turn_weights"] = ops::from_vector(*turn_weights, {c.batch, c.san.turns}, compute_dtype(), dev);
    }
    if (regression)
      b["scores"] = ops::from_vector(e->scores, {c.batch, 1}, DType::f32, dev);
    else
      b["labels"] = ops::from_vector(e->labels, {c.batch}, DType::i64, dev);
    return b;
  };
}

std::vector<std::string> Mtdnn::load_weights(const std::map<std::string, Tensor>& tensors) {
  auto has_prefix = [&](const std::string& prefix) {
    for (const auto& kv : tensors)
      if (kv.first.compare(0, prefix.size(), prefix) == 0) return true;
    return false;
  };
  if (has_prefix("scoring_list.")) return module().load(tensors, true);
  const std::string prefix = has_prefix("bert.") ? "bert." : "";
  std::map<std::string, Tensor> encoder;  // by the encoder's own names
  std::vector<std::string> ignored;
  for (const auto& [name, t] : tensors) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    encoder[name.substr(prefix.size())] = t;
    ignored.push_back(name.substr(prefix.size()));  // unexpected names are not an error; missing ones are
  }
  std::vector<std::string> loaded = net_->bert->load(encoder, true, ignored);
  for (auto& n : loaded) n = "bert." + n;
  return loaded;
}

Tensor Mtdnn::loss(const Batch& batch) { return net_->loss(batch_task_, batch); }

}  // namespace models::mtdnn
