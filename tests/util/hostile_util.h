// hostile_util.h: every input format the engine reads, one entry point each, for the fuzz regression in
// `make test` (tests/tools/fuzz_regression_test.cpp) and the libFuzzer targets of `make fuzz` (tests/fuzz/).
//
// read_input(format, bytes) puts `bytes` where the format's reader expects a file (a data set's other files
// are the samples of tests/data) and runs the engine's reader on it, the way a run would. It returns, or
// throws engine::Error: both are fine answers to any input. Anything else (another exception type, a crash,
// a sanitizer report) is a bug of the reader.
#pragma once
#include <string>
#include <vector>

namespace testutil {

enum class InputFormat {
  checkpoint,  // an engine checkpoint (safetensors), loaded into a tiny transformer_lm
  batch_file,  // a safetensors batch for engine_train --batch-file
  squad_json,  // SQuAD 1.1 JSON
  glue_tsv,    // a GLUE task's train.tsv (RTE's columns)
  token_file,  // a translation token file (one sentence of ids per line)
  vocab,       // a WordPiece vocabulary
  jpeg,        // an image, as the VOC and COCO readers decode it
  png,         // a label map, as the VOC reader decodes and checks it
  png16,       // a 16-bit instance map, as the Cityscapes reader (pix2pixhd --data) decodes and checks it
  coco_json,   // COCO instances JSON (with the sample's images)
  byte_data,   // the masked LM's raw byte data
};

struct FormatSample {
  InputFormat format;
  const char* name;
  std::string valid;  // a valid input of the format (from tests/data, or made by the engine)
};

// One valid sample of every format; the paths are relative to the project root (where tests run).
std::vector<FormatSample> format_samples();

// Runs the format's reader on `bytes` (see above). `dir` is a scratch folder the caller owns.
void read_input(InputFormat format, const std::string& bytes, const std::string& dir);

}  // namespace testutil
