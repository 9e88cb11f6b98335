// hostile_util.cpp: the readers behind read_input (see hostile_util.h).
#include "tests/util/hostile_util.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/device.h"
#include "engine/error.h"
#include "engine/io.h"
#include "engine/rng.h"
#include "engine/safetensors.h"
#include "models/data/cityscapes.h"
#include "models/data/detection.h"
#include "models/data/glue.h"
#include "models/data/image_io.h"
#include "models/data/masked_lm.h"
#include "models/data/segmentation.h"
#include "models/data/squad.h"
#include "models/data/translation.h"
#include "models/data/wordpiece.h"
#include "models/registry.h"
#include "ops/factory.h"
#include "tools/checkpoint.h"

namespace testutil {

namespace fs = std::filesystem;

namespace {

std::string file_text(const std::string& path) { return engine::read_file(path, "sample", engine::kGiB); }

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// The tiny language model of the checkpoint and batch-file cases.
models::ModelConfig tiny_lm() {
  models::ModelConfig c;
  c.name = "transformer_lm";
  c.size = "tiny";
  c.seq = 16;
  c.batch = 4;
  return c;
}

std::shared_ptr<engine::Device> small_cpu() {
  return engine::Device::create(engine::DeviceType::cpu, size_t(64) << 20);
}

std::string valid_checkpoint(const std::string& dir) {
  engine::DeviceGuard guard(small_cpu());
  const engine::Generator saved = engine::generator();
  auto model = models::create_model(tiny_lm());
  model->train_step(1);
  const std::string path = dir + "/valid_checkpoint.safetensors";
  tools::save_checkpoint(path, *model, tiny_lm(), 1);
  engine::generator() = saved;
  return file_text(path);
}

std::string valid_batch_file(const std::string& dir) {
  auto cpu = small_cpu();
  std::vector<int64_t> ids(64), targets(64);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = int64_t(i % 7), targets[i] = int64_t((i + 1) % 7);
  const std::string path = dir + "/valid_batch.safetensors";
  engine::save_safetensors(path, {{"ids", ops::from_vector(ids, {4, 16}, engine::DType::i64, cpu)},
                                  {"targets", ops::from_vector(targets, {64}, engine::DType::i64, cpu)}});
  return file_text(path);
}

// A copy of a sample data set inside `dir`, made once.
std::string sample_copy(const std::string& dir, const std::string& set) {
  const std::string to = dir + "/" + set;
  if (!fs::exists(to)) fs::copy("tests/data/" + set, to, fs::copy_options::recursive);
  return to;
}

}  // namespace

std::vector<FormatSample> format_samples() {
  const std::string scratch = (fs::temp_directory_path() / ("hostile_samples_" + std::to_string(getpid()))).string();
  fs::create_directories(scratch);
  std::vector<FormatSample> s = {
      {InputFormat::checkpoint, "checkpoint", valid_checkpoint(scratch)},
      {InputFormat::batch_file, "batch_file", valid_batch_file(scratch)},
      {InputFormat::squad_json, "squad_json", file_text("tests/data/bert/squad_sample.json")},
      {InputFormat::glue_tsv, "glue_tsv", file_text("tests/data/glue/RTE/train.tsv")},
      {InputFormat::token_file, "token_file", file_text("tests/data/translation/sample.src")},
      {InputFormat::vocab, "vocab", file_text("tests/data/bert/vocab.txt")},
      {InputFormat::jpeg, "jpeg", file_text("tests/data/voc_sample/JPEGImages/2007_000001.jpg")},
      {InputFormat::png, "png", file_text("tests/data/voc_sample/SegmentationClass/2007_000001.png")},
      {InputFormat::png16, "png16",
       file_text("tests/data/cityscapes_sample/gtFine/train/testcity/testcity_000000_000001_gtFine_instanceIds.png")},
      {InputFormat::coco_json, "coco_json", file_text("tests/data/coco_sample/annotations/instances_train2017.json")},
      {InputFormat::byte_data, "byte_data", file_text("tests/data/bert/bytes_sample.txt")},
  };
  fs::remove_all(scratch);
  return s;
}

void read_input(InputFormat format, const std::string& bytes, const std::string& dir) {
  using namespace models::data;
  switch (format) {
    case InputFormat::checkpoint: {
      const std::string path = dir + "/input.safetensors";
      write_bytes(path, bytes);
      engine::DeviceGuard guard(small_cpu());
      const engine::Generator saved = engine::generator();
      models::ModelConfig c = tiny_lm();
      tools::fill_config_from_checkpoint(path, c, [](const std::string& f) { return f == "model"; });
      auto model = models::create_model(c);
      tools::load_checkpoint(path, *model);
      engine::generator() = saved;
      return;
    }
    case InputFormat::batch_file: {
      const std::string path = dir + "/input.safetensors";
      write_bytes(path, bytes);
      auto cpu = small_cpu();
      engine::DeviceGuard guard(cpu);
      const engine::Generator saved = engine::generator();
      auto model = models::create_model(tiny_lm());
      std::map<std::string, engine::Tensor> tensors = engine::load_safetensors(path, cpu);
      model->set_fixed_batch(models::Batch(tensors.begin(), tensors.end()));
      model->eval_step(1);
      engine::generator() = saved;
      return;
    }
    case InputFormat::squad_json: {
      write_bytes(dir + "/input.json", bytes);
      read_squad(dir + "/input.json");
      return;
    }
    case InputFormat::glue_tsv: {
      write_bytes(dir + "/input.tsv", bytes);
      read_glue_tsv(glue_task("rte"), dir + "/input.tsv");
      return;
    }
    case InputFormat::token_file: {
      write_bytes(dir + "/input.src", bytes);
      read_token_file(dir + "/input.src", read_vocabulary("tests/data/translation/sample.vocab"));
      return;
    }
    case InputFormat::vocab: {
      write_bytes(dir + "/vocab.txt", bytes);
      WordPieceTokenizer::from_file(dir + "/vocab.txt")->encode("Hello, unaffable world! 東京 ça va");
      return;
    }
    case InputFormat::jpeg: {
      decode_jpeg(bytes, "input.jpg");
      return;
    }
    case InputFormat::png: {  // as a label map of the VOC sample: decoded, then checked against its image
      const std::string set = sample_copy(dir, "voc_sample");
      write_bytes(set + "/SegmentationClass/2007_000001.png", bytes);
      SegmentationSet voc(set, 5);
      Image image, label;
      voc.load(0, image, label);
      return;
    }
    case InputFormat::png16: {  // as the first instance map of the Cityscapes sample: decoded whole, checked
      const std::string set = sample_copy(dir, "cityscapes_sample");
      write_bytes(set + "/gtFine/train/testcity/testcity_000000_000001_gtFine_instanceIds.png", bytes);
      CityscapesSet cityscapes(set, 5);
      cityscapes.batch(2, 64, 128, 1, 1);
      return;
    }
    case InputFormat::coco_json: {
      const std::string set = sample_copy(dir, "coco_sample");
      write_bytes(set + "/annotations/instances_train2017.json", bytes);
      DetectionSet coco(set, 3);
      if (coco.size() > 0) coco.batch(1, 64, 1, 1);
      return;
    }
    case InputFormat::byte_data: {
      write_bytes(dir + "/input.txt", bytes);
      ByteFileSource source(dir + "/input.txt", 16);
      std::mt19937_64 rng(1);
      std::vector<int64_t> a, b;
      source.sample_pair(rng, 8, 8, false, a, b);
      return;
    }
  }
}

}  // namespace testutil
