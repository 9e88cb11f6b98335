// glue.cpp: the GLUE task table, the TSV readers, byte tokenization, pair encoding and synthetic examples.
#include "models/data/glue.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "engine/error.h"
#include "engine/io.h"

namespace models::data {

const std::vector<GlueTask>& glue_tasks() {
  using K = GlueKind;
  // Label spellings are those of the TSV files; their order is MT-DNN's (experiments/glue/glue_task_def.yml).
  // Train sizes: the rows of GLUE's train.tsv files.
  static const std::vector<GlueTask> tasks = {
      {"mnli", "MNLI", K::pair_classification, {"contradiction", "neutral", "entailment"}, 392702},
      {"rte", "RTE", K::pair_classification, {"not_entailment", "entailment"}, 2490},
      {"qqp", "QQP", K::pair_classification, {"0", "1"}, 363846},
      {"qnli", "QNLI", K::pair_classification, {"not_entailment", "entailment"}, 104743},
      {"mrpc", "MRPC", K::pair_classification, {"0", "1"}, 3668},
      {"sst", "SST-2", K::single_classification, {"0", "1"}, 67349},
      {"cola", "CoLA", K::single_classification, {"0", "1"}, 8551},
      {"stsb", "STS-B", K::regression, {}, 5749},
  };
  return tasks;
}

std::string glue_task_names() {
  std::string s;
  for (const auto& t : glue_tasks()) s += (s.empty() ? "" : ", ") + t.name;
  return s;
}

const GlueTask& glue_task(const std::string& name) {
  for (const auto& t : glue_tasks())
    if (t.name == name) return t;
  throw engine::Error(engine::str("unknown GLUE task '", name, "': valid tasks are ", glue_task_names()));
}

// ---------------------------------------------------------------------------------------------------
// TSV reading.

namespace {

// Where a task's fields are: header names for the files that have a header, column numbers for CoLA.
struct ColumnSpec {
  bool header;
  std::string a, b, target;  // header names (b empty: single sentence)
  int64_t a_col, target_col, columns;  // headerless files only
};

ColumnSpec columns_of(const GlueTask& task) {
  const std::string& n = task.name;
  if (n == "mnli") return {true, "sentence1", "sentence2", "gold_label", 0, 0, 0};
  if (n == "rte") return {true, "sentence1", "sentence2", "label", 0, 0, 0};
  if (n == "qnli") return {true, "question", "sentence", "label", 0, 0, 0};
  if (n == "qqp") return {true, "question1", "question2", "is_duplicate", 0, 0, 0};
  if (n == "mrpc") return {true, "#1 String", "#2 String", "Quality", 0, 0, 0};
  if (n == "sst") return {true, "sentence", "", "label", 0, 0, 0};
  if (n == "stsb") return {true, "sentence1", "sentence2", "score", 0, 0, 0};
  if (n == "cola") return {false, "", "", "", 3, 1, 4};  // source, label, original label, sentence
  throw engine::Error(engine::str("glue: no column layout for task '", n, "'"));
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> cols;
  size_t start = 0;
  while (true) {
    size_t tab = line.find('\t', start);
    cols.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return cols;
    start = tab + 1;
  }
}

int64_t find_column(const std::vector<std::string>& header, const std::string& name, const std::string& where,
                    const GlueTask& task) {
  for (size_t i = 0; i < header.size(); i++)
    if (header[i] == name) return int64_t(i);
  std::string have;
  for (const auto& h : header) have += (have.empty() ? "'" : ", '") + h + "'";
  throw engine::Error(engine::str(where, ": the header has no column '", name, "' (", task.name, "'s ",
                                  task.folder, "/train.tsv names it); found ", have));
}

}  // namespace

std::vector<GlueExample> read_glue_tsv(const GlueTask& task, const std::string& path) {
  engine::check_input_file(path, "GLUE data file", 16 * engine::kGiB);
  std::ifstream in(path, std::ios::binary);
  ENGINE_CHECK(in, "glue: cannot open ", task.name, " data file ", path, ": ", std::strerror(errno));
  ColumnSpec spec = columns_of(task);
  int64_t a_col = spec.a_col, b_col = -1, target_col = spec.target_col, columns = spec.columns;
  std::vector<GlueExample> out;
  std::string line;
  int64_t line_no = 0;
  bool header_seen = !spec.header;
  while (std::getline(in, line)) {
    line_no++;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // files saved with CRLF endings
    if (line_no == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // UTF-8 BOM (MRPC)
    if (line.empty()) continue;
    std::string where = engine::str(path, ":", line_no);
    std::vector<std::string> cols = split_tabs(line);
    if (!header_seen) {
      header_seen = true;
      columns = int64_t(cols.size());
      a_col = find_column(cols, spec.a, where, task);
      if (!spec.b.empty()) b_col = find_column(cols, spec.b, where, task);
      target_col = find_column(cols, spec.target, where, task);
      continue;
    }
    ENGINE_CHECK(int64_t(cols.size()) == columns, where, ": expected ", columns, " columns (", task.folder,
                 " layout), found ", cols.size());
    GlueExample e;
    e.a = cols[size_t(a_col)];
    if (b_col >= 0) e.b = cols[size_t(b_col)];
    const std::string& target = cols[size_t(target_col)];
    if (task.kind == GlueKind::regression) {
      char* end = nullptr;
      e.score = std::strtod(target.c_str(), &end);
      ENGINE_CHECK(!target.empty() && end == target.c_str() + target.size() && std::isfinite(e.score), where,
                   ": the ", task.name, " score '", target, "' is not a number");
    } else {
      auto it = std::find(task.labels.begin(), task.labels.end(), target);
      if (it == task.labels.end()) {
        std::string valid;
        for (const auto& l : task.labels) valid += (valid.empty() ? "'" : ", '") + l + "'";
        throw engine::Error(engine::str(where, ": unknown ", task.name, " label '", target, "': expected one of ",
                                        valid));
      }
      e.label = int64_t(it - task.labels.begin());
    }
    out.push_back(std::move(e));
  }
  ENGINE_CHECK(!out.empty(), "glue: ", path, " holds no ", task.name, " examples");
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Tokenization and encoding.

std::unique_ptr<Tokenizer> glue_tokenizer(const std::string& dir) {
  std::string vocab = dir + "/vocab.txt";
  if (!dir.empty() && std::ifstream(vocab).good()) return WordPieceTokenizer::from_file(vocab);
  return std::make_unique<ByteTokenizer>();
}

void encode_tokens(std::vector<int64_t> a, std::vector<int64_t> b, bool pair, const Tokenizer& tokenizer,
                   int64_t row, EncodedBatch& out) {
  const int64_t T = out.seq;
  const int64_t specials = pair ? 3 : 2;
  ENGINE_CHECK(T > specials, "glue: a sequence length of ", T, " leaves no room for text");
  while (int64_t(a.size() + b.size()) > T - specials) (a.size() >= b.size() ? a : b).pop_back();
  int64_t* ids = &out.ids[size_t(row * T)];
  int64_t* types = &out.token_types[size_t(row * T)];
  int64_t* pad = &out.padding[size_t(row * T)];
  int64_t* not_a = &out.not_premise[size_t(row * T)];
  int64_t* not_b = &out.not_hypothesis[size_t(row * T)];
  int64_t t = 0;
  auto put = [&](int64_t id, int64_t type) {
    ids[t] = id;
    types[t] = type;
    pad[t] = 0;
    not_a[t] = type == 0 ? 0 : 1;
    not_b[t] = type == 1 ? 0 : 1;
    t++;
  };
  put(tokenizer.cls_id, 0);
  for (int64_t id : a) put(id, 0);
  put(tokenizer.sep_id, 0);
  if (pair) {
    for (int64_t id : b) put(id, 1);
    put(tokenizer.sep_id, 1);
  }
  for (; t < T; t++) {
    ids[t] = tokenizer.pad_id;
    types[t] = 0;
    pad[t] = not_a[t] = not_b[t] = 1;
  }
}

EncodedBatch encode_examples(const std::vector<GlueExample>& examples, bool pair, int64_t seq,
                             const Tokenizer& tokenizer) {
  EncodedBatch out;
  out.batch = int64_t(examples.size());
  out.seq = seq;
  size_t n = size_t(out.batch * seq);
  out.ids.resize(n);
  out.token_types.resize(n);
  out.padding.resize(n);
  out.not_premise.resize(n);
  out.not_hypothesis.resize(n);
  for (int64_t r = 0; r < out.batch; r++) {
    const GlueExample& e = examples[size_t(r)];
    encode_tokens(tokenizer.encode(e.a), pair ? tokenizer.encode(e.b) : std::vector<int64_t>{}, pair, tokenizer,
                  r, out);
    out.labels.push_back(e.label);
    out.scores.push_back(e.score);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Synthetic examples.

namespace {

int64_t below(std::mt19937_64& rng, int64_t n) { return int64_t(rng() % uint64_t(n)); }

std::string random_letters(std::mt19937_64& rng, int64_t n, char first = 'a') {
  std::string s(size_t(n), ' ');
  for (auto& c : s) c = char(first + below(rng, 8));
  return s;
}

}  // namespace

GlueExample synthetic_glue_example(const GlueTask& task, int64_t max_len, std::mt19937_64& rng) {
  ENGINE_CHECK(max_len >= 1, "glue: synthetic sentences need at least one letter");
  GlueExample e;
  int64_t n = 1 + below(rng, max_len);
  e.a = random_letters(rng, n);
  if (task.kind == GlueKind::regression) {  // stsb: replace k of the n letters
    int64_t k = below(rng, n + 1);
    e.b = e.a;
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) order[size_t(i)] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t i = 0; i < k; i++) {
      char& c = e.b[size_t(order[size_t(i)])];
      c = char('a' + (c - 'a' + 1 + below(rng, 7)) % 8);  // a different letter
    }
    e.score = 5.0 * double(n - k) / double(n);
    return e;
  }
  e.label = below(rng, int64_t(task.labels.size()));
  const std::string& label = task.labels[size_t(e.label)];
  if (task.name == "sst") {
    int64_t low = 0;
    for (char c : e.a) low += c < 'e' ? 1 : -1;
    bool positive = low > 0;
    if (positive != (label == "1")) {  // flip every letter between the halves: the count changes sign
      for (auto& c : e.a) c = char(c < 'e' ? c + 4 : c - 4);
      if (low == 0) e.a += label == "1" ? 'a' : 'h';  // a tie is negative; one more letter breaks it
    }
    return e;
  }
  if (task.name == "cola") {
    if (label == "1") {
      std::sort(e.a.begin(), e.a.end());
    } else {
      // Descending with first > last: never in order. (All-equal letters would be sorted: break the tie.)
      if (n < 2) e.a += 'a';
      std::sort(e.a.begin(), e.a.end(), std::greater<char>());
      if (e.a.front() == e.a.back()) {
        if (e.a.back() > 'a') e.a.back() = 'a';
        else e.a.front() = 'b';
      }
    }
    return e;
  }
  // Pairs: the same sentence, a random one, or (mnli contradiction) the sentence moved to letters i-p.
  if (label == "entailment" || label == "1") {
    e.b = e.a;
  } else if (label == "contradiction") {
    e.b = e.a;
    for (auto& c : e.b) c = char(c + 8);
  } else {
    e.b = random_letters(rng, 1 + below(rng, max_len));
  }
  return e;
}

}  // namespace models::data
