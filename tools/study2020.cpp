// study2020.cpp: reading the 2020 study's table, and its model names in the registry's words.
#include "tools/study2020.h"

#include <algorithm>
#include <sstream>

#include "engine/error.h"
#include "engine/io.h"

namespace tools {

using engine::str;

// ---------------------------------------------------------------------------------------------------
// The study's models and their registry names: the one place where the two name spaces meet.

const std::vector<StudyModel>& study_models() {
  static const std::vector<StudyModel> table = {
      //  lambda2020.csv     registry           seq (0: default)
      {"nasnet_large", "nasnet_large", 0},
      {"deeplabv3", "deeplabv3", 0},
      {"yolov3", "yolov3", 0},
      {"pix2pixhd", "pix2pixhd", 0},
      {"stylegan", "stylegan", 0},
      {"maskrcnn", "maskrcnn", 0},
      {"transformer_big", "transformer_big", 0},
      {"convs2s", "convs2s", 0},
      {"unsupmt", "unsupmt", 0},
      {"bert_base", "bert_base", 128},   // pretraining phase 1 length
      {"bert_squad", "bert_squad", 384},  // run_squad's max_seq_length
      {"mtdnn", "mtdnn", 512},
  };
  return table;
}

// ---------------------------------------------------------------------------------------------------
// lambda2020.csv

namespace {

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream is(line);
  while (std::getline(is, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

double number_at(const std::string& s, const std::string& path, int line, const std::string& column) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  ENGINE_CHECK(!s.empty() && *end == 0, path, ":", line, ": column '", column, "' should be a number, got '", s, "'");
  return v;
}

}  // namespace

const Study2020Row* Study2020::find(const std::string& model) const {
  for (const auto& r : rows)
    if (r.model == model) return &r;
  return nullptr;
}

Study2020 read_study2020(const std::string& path) {
  std::string text;
  try {
    text = engine::read_file(path, "study table", 64 * engine::kMiB);
  } catch (const engine::Error& e) {
    throw engine::Error(engine::str("cannot read the 2020 study's table '", path, "': ", e.what(),
                                    " (give a lambda2020.csv-style file with --study, or leave --study out for the "
                                    "built-in table)"));
  }
  return parse_study2020(text, path);
}

extern const char kStudy2020Csv[];  // generated from tools/data/lambda2020.csv by the Makefile

Study2020 builtin_study2020() { return parse_study2020(kStudy2020Csv, "tools/data/lambda2020.csv (built in)"); }

Study2020 parse_study2020(const std::string& text, const std::string& path) {
  std::istringstream f(text);
  Study2020 s;
  std::vector<std::string> header;
  size_t first_gpu = 0, throughput_unit = 0;
  std::string line;
  for (int n = 1; std::getline(f, line); n++) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cells = split_csv(line);
    if (header.empty()) {
      header = cells;
      auto at = [&](const char* name) {
        auto it = std::find(header.begin(), header.end(), name);
        ENGINE_CHECK(it != header.end(), path, ":", n, ": the header has no column '", name, "'");
        return size_t(it - header.begin());
      };
      ENGINE_CHECK(at("model") == 0, path, ":", n, ": the first column must be 'model'");
      first_gpu = at("batch_unit") + 1;
      throughput_unit = at("throughput_unit");
      s.gpus.assign(header.begin() + long(first_gpu), header.begin() + long(throughput_unit));
      ENGINE_CHECK(!s.gpus.empty() && header.size() == throughput_unit + 1 + s.gpus.size(), path, ":", n,
                   ": expected a batch column and a t_ column per card");
      continue;
    }
    ENGINE_CHECK(cells.size() == header.size(), path, ":", n, ": ", cells.size(), " columns, the header has ",
                 header.size());
    Study2020Row r;
    r.model = cells[0];
    r.task = cells[1];
    r.dataset = cells[2];
    r.input = cells[3];
    r.batch_unit = cells[first_gpu - 1];
    r.throughput_unit = cells[throughput_unit];
    for (size_t g = 0; g < s.gpus.size(); g++) {
      r.batch.push_back(number_at(cells[first_gpu + g], path, n, header[first_gpu + g]));
      r.throughput.push_back(number_at(cells[throughput_unit + 1 + g], path, n, header[throughput_unit + 1 + g]));
    }
    s.rows.push_back(std::move(r));
  }
  ENGINE_CHECK(!s.rows.empty(), path, ": no model rows");
  return s;
}

}  // namespace tools
