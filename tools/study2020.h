// study2020.h: the 2020 GPU study's table (tools/data/lambda2020.csv, built into the programs) and the one
// table where the study's model names meet the registry's.
#pragma once
#include <string>
#include <vector>

namespace tools {

// lambda2020.csv: one row per model; batch and throughput per card, in the file's card order.
struct Study2020Row {
  std::string model, task, dataset, input, batch_unit, throughput_unit;
  std::vector<double> batch, throughput;  // one per card; 0: does not fit
};
struct Study2020 {
  std::vector<std::string> gpus;  // column names: rtx2060, ..., rtx8000 (= gpu profile names)
  std::vector<Study2020Row> rows;
  const Study2020Row* find(const std::string& model) const;
};
// Parses the table's text; a malformed line is an Error naming `source` (the file) and the line.
Study2020 parse_study2020(const std::string& text, const std::string& source);
// Reads a file in that format (engine_bench lambda --study FILE).
Study2020 read_study2020(const std::string& path);
// The table the programs carry: tools/data/lambda2020.csv, built into them by the Makefile (so a program
// reads nothing outside itself; the file names the study it comes from).
Study2020 builtin_study2020();

// The registry name that stands for a study model ("" when none is mapped), and the config overrides
// that reproduce the study's setting (e.g. BERT's sequence length).
struct StudyModel {
  const char* study;     // name in lambda2020.csv
  const char* registry;  // name in models::registry()
  int64_t seq;           // 0: the model's default
};
const std::vector<StudyModel>& study_models();

}  // namespace tools
