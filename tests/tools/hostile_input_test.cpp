// hostile_input_test.cpp: the hostile and careless inputs that once crashed, hung or passed silently, each run
// as a user would (the programs) or through the reader it reaches, and each now a clear error naming the
// flag or file: sizes that wrapped around int64, a SQuAD offset near 2^63, data paths that are FIFOs or
// devices, malformed memory sizes, non-finite COCO boxes, a float checkpoint relabelled int32, a flipped byte
// in a checkpoint, a checkpoint naming the data to read, a 16-bit label map, an empty batch file, and a
// training run whose loss turns non-finite. Also: the same seed gives the same bits on 1 and 2 threads.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "engine/device.h"
#include "engine/format.h"
#include "engine/io.h"
#include "engine/safetensors.h"
#include "models/data/detection.h"
#include "models/data/segmentation.h"
#include "models/data/squad.h"
#include "ops/factory.h"
#include "tests/tools/bench_test_util.h"
#include "tests/tools/shell_util.h"
#include "tests/util/error_util.h"

namespace {

using testutil::error_of;

namespace fs = std::filesystem;
using testutil::program;
using testutil::shell;

const std::string kTiny = " --model bert_base --size tiny --steps 1 ";

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_bytes(const std::string& path) { return engine::read_file(path, "test file", engine::kGiB); }

// A PNG chunk: length, type, data, CRC-32 of type + data (the PNG specification, section 5.3).
std::string png_chunk(const std::string& type, const std::string& data) {
  auto be32 = [](uint32_t v) {
    return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  };
  const std::string body = type + data;
  return be32(uint32_t(data.size())) + body +
         be32(uint32_t(crc32(0, reinterpret_cast<const Bytef*>(body.data()), uInt(body.size()))));
}

// A grey PNG of `width` x `height` with `bits` (8 or 16) bits per pixel, every pixel `value`.
std::string grey_png(int width, int height, int bits, int value) {
  std::string ihdr{char(0), char(0), char(width >> 8), char(width), char(0), char(0), char(height >> 8), char(height),
                   char(bits), 0, 0, 0, 0};
  std::string raw;
  for (int y = 0; y < height; y++) {
    raw += char(0);  // filter: none
    for (int x = 0; x < width; x++) {
      if (bits == 16) raw += char(value >> 8);
      raw += char(value);
    }
  }
  uLongf n = compressBound(uLong(raw.size()));
  std::string z(n, 0);
  compress(reinterpret_cast<Bytef*>(z.data()), &n, reinterpret_cast<const Bytef*>(raw.data()), uLong(raw.size()));
  z.resize(n);
  return std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr) + png_chunk("IDAT", z) + png_chunk("IEND", "");
}

}  // namespace

// Sizes that multiplied past 2^63 wrapped to small numbers; now the limits are named where they enter.
TEST(HostileInput, HugeSizesAreRefusedByName) {
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {kTiny + "--batch 288230376151711744", "--batch 288230376151711744: expected 0 (the model's default) to"},
           {kTiny + "--batch 144115188075855872 --seq 128", "--batch 144115188075855872"},
           {kTiny + "--device meta --batch 1048576 --seq 2048", "tokens per step: at most"},
           {" --model bert_squad --size tiny --steps 1 --batch 144115188075855872", "--batch 144115188075855872"},
           {kTiny + "--batch 99999999999999999999", "--batch 99999999999999999999 is out of range"},
           {kTiny + "--memory 1..5GB", "cannot read a memory size from '1..5GB'"},
           {kTiny + "--memory 1e30GB", "unknown memory unit 'e30GB' in '1e30GB'"},
           {kTiny + "--memory 99999999999999999999TB", "larger than a 64-bit size holds"},
       }) {
    auto [code, out] = shell(program("engine_train") + c.args);
    EXPECT_EQ(code, 2) << c.args << "\n" << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << c.args << "\n" << out;
  }
  auto [code, out] =
      shell(program("engine_bench") + " trace --model bert_base --size tiny --batch 288230376151711744 --out /tmp");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--batch 288230376151711744"), std::string::npos) << out;
}

// A data path is read only when it is a regular file of a sane size: a FIFO blocked the run forever,
// /dev/zero read without end.
TEST(HostileInput, DataPathsMustBeRegularFiles) {
  testutil::TempDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero")}) {
    auto [code, out] = shell("timeout 20 " + program("engine_train") + kTiny + "--data " + path);
    EXPECT_EQ(code, 2) << path << "\n" << out;
    EXPECT_NE(out.find("is not a regular file"), std::string::npos) << out;
  }
  auto [code, out] = shell("timeout 20 " + program("engine_train") + kTiny + "--data " + dir.path.string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("is a folder"), std::string::npos) << out;
  EXPECT_NE(error_of([&] { engine::load_safetensors(fifo, nullptr); }).find("not a regular file"), std::string::npos);
}

// answer_start near 2^63 made `offset + length` wrap and pass the bounds check (a SIGSEGV on every run).
TEST(HostileInput, SquadOffsetsNearTheLimitsAreErrors) {
  testutil::TempDir dir;
  std::string good = read_bytes("tests/data/bert/squad_sample.json");
  for (const char* start : {"9223372036854775807", "9.3e18", "1e400", "-1"}) {
    std::string bad = good;
    const size_t at = bad.find("\"answer_start\": ") + 16;
    bad.replace(at, bad.find_first_of(",}", at) - at, start);
    write_bytes(dir.file("s.json"), bad);
    const std::string e = error_of([&] { models::data::read_squad(dir.file("s.json")); });
    EXPECT_NE(e.find("answer_start"), std::string::npos) << start << ": " << e;
  }
}

// A COCO box of [1e400, 5, -1e400, 10] made the loss NaN and training ran on.
TEST(HostileInput, NonFiniteOrNegativeCocoBoxesAreErrors) {
  testutil::TempDir dir;
  fs::copy("tests/data/coco_sample", dir.file("coco"), fs::copy_options::recursive);
  const std::string json_path = dir.file("coco/annotations/instances_train2017.json");
  const std::string good = read_bytes(json_path);
  const size_t at = good.find("\"bbox\"");
  ASSERT_NE(at, std::string::npos);
  const size_t open = good.find('[', at), close = good.find(']', open);
  for (const char* box : {"[1e400, 5, -1e400, 10]", "[-1e300, 0, 1e300, 5]", "[1, 2, -3, 4]"}) {
    std::string bad = good;
    bad.replace(open, close - open + 1, box);
    write_bytes(json_path, bad);
    const std::string e = error_of([&] { models::data::DetectionSet set(dir.file("coco"), 3); });
    EXPECT_NE(e.find("bbox"), std::string::npos) << box << ": " << e;
  }
}

// A 16-bit label PNG lost its classes above 255 when its low byte was stripped.
TEST(HostileInput, SixteenBitLabelMapsAreRefused) {
  testutil::TempDir dir;
  fs::copy("tests/data/voc_sample", dir.file("voc"), fs::copy_options::recursive);
  models::data::SegmentationSet voc(dir.file("voc"), 5);
  models::data::Image image, label;
  voc.load(0, image, label);
  write_bytes(dir.file("voc/SegmentationClass/2007_000001.png"),
              grey_png(int(image.width), int(image.height), 16, 258));
  const std::string e = error_of([&] { voc.load(0, image, label); });
  EXPECT_NE(e.find("16-bit PNG"), std::string::npos) << e;
  write_bytes(dir.file("voc/SegmentationClass/2007_000001.png"), grey_png(int(image.width), int(image.height), 8, 2));
  voc.load(0, image, label);  // the same map in 8 bits reads
  EXPECT_EQ(label.at(0, 0), 2);
}

// An ImageNet-style folder (nasnet_large --data): a truncated JPEG, a text file named like an image, an emptied
// class folder, more folders than classes: each an exit 2 naming the file or folder, never a crash or a hang.
TEST(HostileInput, BrokenImageFoldersAreErrorsNamingTheFile) {
  testutil::TempDir dir;
  const std::string set = dir.file("imagenet");
  fs::copy("tests/data/imagenet_sample", set, fs::copy_options::recursive);
  const std::string run = "timeout 60 " + program("engine_train") +
                          " --model nasnet_large --size tiny --batch 7 --steps 1 --data " + set;
  auto [code, out] = shell(run);
  ASSERT_EQ(code, 0) << out;  // the sample itself trains (7 images: one whole epoch)
  const std::string jpeg = set + "/n01443537/n01443537_1.jpg";
  const std::string good = read_bytes(jpeg);
  write_bytes(jpeg, good.substr(0, good.size() / 2));
  std::tie(code, out) = shell(run);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("n01443537_1.jpg"), std::string::npos) << out;
  write_bytes(jpeg, "not an image at all");
  std::tie(code, out) = shell(run);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("n01443537_1.jpg"), std::string::npos) << out;
  fs::remove_all(set + "/n01443537");
  fs::create_directory(set + "/n01443537");
  std::tie(code, out) = shell(run);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("n01443537"), std::string::npos) << out;
  fs::remove_all(set + "/n01443537");
  for (int k = 0; k < 3; k++) fs::copy(set + "/n01484850", set + "/n0999000" + std::to_string(k));
  std::tie(code, out) = shell(run);  // 6 folders for the tiny model's 5 classes
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("6 class folders"), std::string::npos) << out;
}

// Checkpoints: a float stored as int32 was converted into the weights; a flipped byte changed a weight
// silently; the metadata chose the data file to read.
TEST(HostileInput, CheckpointsAreCheckedNotTrusted) {
  testutil::TempDir dir;
  const std::string ckpt = dir.file("run.safetensors");
  auto [code, out] = shell(program("engine_train") + kTiny + "--save " + ckpt);
  ASSERT_EQ(code, 0) << out;
  // One data byte flipped: the tensor's CRC-32 no longer matches.
  std::string bytes = read_bytes(ckpt);
  bytes[bytes.size() - 100] ^= 0x01;
  write_bytes(dir.file("flipped.safetensors"), bytes);
  std::tie(code, out) = shell(program("engine_train") + " --load " + dir.file("flipped.safetensors") + " --steps 1");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("does not match its checksum"), std::string::npos) << out;
  // A float tensor relabelled I32 in the header (same byte count, so the file is otherwise valid).
  bytes = read_bytes(ckpt);
  const size_t f32 = bytes.find("\"F32\"");
  ASSERT_NE(f32, std::string::npos);
  bytes.replace(f32, 5, "\"I32\"");
  write_bytes(dir.file("relabelled.safetensors"), bytes);
  std::tie(code, out) = shell(program("engine_train") + " --load " + dir.file("relabelled.safetensors") + " --steps 1");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("loads only from a floating-point one"), std::string::npos) << out;
  // A checkpoint trained on --data does not make the resumed run read that file.
  std::tie(code, out) = shell(program("engine_train") + kTiny + "--data tests/data/bert/bytes_sample.txt --save " +
                              dir.file("data.safetensors"));
  ASSERT_EQ(code, 0) << out;
  std::tie(code, out) = shell(program("engine_train") + " --load " + dir.file("data.safetensors") + " --steps 1");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("a checkpoint does not name the files a run reads"), std::string::npos) << out;
  std::tie(code, out) = shell(program("engine_train") + " --load " + dir.file("data.safetensors") +
                              " --data tests/data/bert/bytes_sample.txt --steps 1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("config from the checkpoint"), std::string::npos) << "what the checkpoint set is shown: " << out;
  // Nothing is left beside the checkpoints: no temporary files.
  for (const auto& entry : fs::directory_iterator(dir.path))
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
}

// A temporary file never outlives a failed write, and one being written is removed on SIGTERM.
TEST(HostileInput, AtomicWritesLeaveNoTemporaryBehind) {
  testutil::TempDir dir;
  const std::string path = dir.file("out.bin");
  EXPECT_THROW(engine::write_file_atomic(path, [](const engine::ByteSink& write) {
                 write("abc", 3);
                 throw engine::Error("the producer failed");
               }),
               engine::Error);
  EXPECT_TRUE(fs::is_empty(dir.path));
  const pid_t child = fork();
  if (child == 0) {  // writes forever until the signal
    engine::write_file_atomic(path, [](const engine::ByteSink& write) {
      for (;;) {
        write("x", 1);
        usleep(1000);
      }
    });
    _exit(0);
  }
  bool temp_seen = false;
  for (int i = 0; i < 500 && !temp_seen; i++) {
    usleep(10000);
    for (const auto& e : fs::directory_iterator(dir.path))
      temp_seen |= e.path().string().find(".tmp.") != std::string::npos;
  }
  kill(child, SIGTERM);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(temp_seen);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "the signal still ends the process";
  EXPECT_TRUE(fs::is_empty(dir.path)) << "the temporary file was left behind";
}

// An empty batch file trained on zero gradients with loss 0.
TEST(HostileInput, AnEmptyBatchFileIsRefused) {
  testutil::TempDir dir;
  auto cpu = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 24);
  engine::save_safetensors(dir.file("empty.safetensors"), {});
  engine::save_safetensors(dir.file("zero.safetensors"), {{"ids", ops::zeros({0, 16}, engine::DType::i64, cpu)},
                                                          {"targets", ops::zeros({0}, engine::DType::i64, cpu)}});
  const std::string lm = program("engine_train") + " --model transformer_lm --size tiny --seq 16 --batch 4 --steps 1 ";
  auto [code, out] = shell(lm + "--batch-file " + dir.file("empty.safetensors"));
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("the fixed batch holds no tensors"), std::string::npos) << out;
  std::tie(code, out) = shell(lm + "--batch-file " + dir.file("zero.safetensors"));
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("is empty"), std::string::npos) << out;
}

// A loss that turns NaN stops the run with the step, the loss terms and the first non-finite parameter,
// and no checkpoint is written. (NaN images through yolov3: its leaky ReLU passes NaN on, where a ReLU
// would turn it into 0.)
TEST(HostileInput, ANonFiniteLossStopsTraining) {
  testutil::TempDir dir;
  auto cpu = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 26);
  const int64_t N = 2, S = 64, M = 100;
  std::vector<float> images(size_t(N * S * S * 3), std::numeric_limits<float>::quiet_NaN()),
      boxes(size_t(N * M * 4), 0);
  std::vector<int64_t> labels(size_t(N * M), -1);
  for (int64_t n = 0; n < N; n++) {  // one real box per image
    float* b = boxes.data() + n * M * 4;
    b[0] = 0.5f, b[1] = 0.5f, b[2] = 0.25f, b[3] = 0.25f;
    labels[size_t(n * M)] = 1;
  }
  engine::save_safetensors(dir.file("nan.safetensors"),
                           {{"images", ops::from_vector(images, {N, S, S, 3}, engine::DType::f32, cpu)},
                            {"boxes", ops::from_vector(boxes, {N, M, 4}, engine::DType::f32, cpu)},
                            {"labels", ops::from_vector(labels, {N, M}, engine::DType::i64, cpu)}});
  auto [code, out] = shell(program("engine_train") + " --model yolov3 --size tiny --batch 2 --steps 3 --batch-file " +
                           dir.file("nan.safetensors") + " --save " + dir.file("run.safetensors"));
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("step 1: the loss is not finite (box "), std::string::npos) << out;
  EXPECT_NE(out.find("nothing was saved"), std::string::npos) << out;
  EXPECT_NE(out.find("The first parameter the update made non-finite: "), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir.file("run.safetensors")));
}

// cpu results do not depend on the thread count: the same seed, the same checkpoint bytes.
TEST(HostileInput, CpuResultsAreTheSameOnOneAndTwoThreads) {
  testutil::TempDir dir;
  for (const char* model : {"bert_base", "deeplabv3"}) {
    for (int threads : {1, 2}) {
      auto [code, out] = shell("OMP_NUM_THREADS=" + std::to_string(threads) + " " + program("engine_train") +
                               " --model " + model + " --size tiny --steps 2 --save " +
                               dir.file(std::string(model) + std::to_string(threads) + ".safetensors"));
      ASSERT_EQ(code, 0) << out;
    }
    EXPECT_EQ(read_bytes(dir.file(std::string(model) + "1.safetensors")),
              read_bytes(dir.file(std::string(model) + "2.safetensors")))
        << model << ": the weights after 2 steps differ between 1 and 2 threads";
  }
}

// The default cpu arena is what this machine (or its container's cgroup) may use, and the header says which.
TEST(HostileInput, TheDefaultCpuArenaNamesItsLimit) {
  std::string why;
  const size_t limit = engine::cpu_memory_limit(&why);
  EXPECT_GT(limit, size_t(0));
  EXPECT_TRUE(why.rfind("physical memory", 0) == 0 || why.rfind("the cgroup memory limit", 0) == 0) << why;
  auto [code, out] = shell(program("engine_train") + kTiny);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("| arena " + engine::format_bytes(limit) + " (" + why + ")"), std::string::npos) << out;
}
