// safetensors_test.cpp: round trips of every dtype, metadata, meta-device loads, one file written by the
// Python `safetensors` package (tests/data/reference.safetensors), and one hand-made file per corruption
// that the loader must refuse with a message naming the problem and the file.
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>

#include "engine/error.h"
#include "engine/safetensors.h"
#include "ops/factory.h"
#include "ops/view.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/safetensors_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const std::string& f : files()) std::remove((dir_ + "/" + f).c_str());
    rmdir(dir_.c_str());
  }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = opendir(dir_.c_str())) {
      while (dirent* e = readdir(d))
        if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
      closedir(d);
    }
    return out;
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // A file made by hand: the 8-byte length, the header text as given, then `data_bytes` bytes.
  std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes,
                        int64_t header_length = -1) {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    uint64_t n = header_length < 0 ? header.size() : uint64_t(header_length);
    for (int k = 0; k < 8; k++) f.put(char((n >> (8 * k)) & 0xff));
    f << header << std::string(data_bytes, '\0');
    return p;
  }

  // Loading `p` must fail with a message containing each of `words` and the file's path.
  void expect_load_error(const std::string& p, const std::vector<std::string>& words) {
    try {
      engine::load_safetensors(p, engine::default_device());
      ADD_FAILURE() << "loading " << p << " should have failed";
    } catch (const engine::Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
    }
  }

  std::string dir_;
};

std::string tensor_json(const std::string& name, const std::string& dtype, const std::string& shape, int b, int e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Round trips

TEST_F(Safetensors, RoundTripOfEveryDtypeAndShape) {
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"f32", ops::from_vector(std::vector<double>{1.5, -2, 3.25, 1e-30, -0.0, 7}, {2, 3}, DType::f32)},
      {"f64", ops::from_vector(std::vector<double>{1.0 / 3, -1e300, 5e-324, 2}, {4}, DType::f64)},
      {"bf16", ops::from_vector(std::vector<double>{1.0, -3.140625, 256}, {3}, DType::bf16)},
      {"f16", ops::from_vector(std::vector<double>{0.5, -65504, 6e-8, 1}, {2, 1, 2}, DType::f16)},
      {"i32", ops::from_vector(std::vector<double>{-2147483648.0, 0, 2147483647.0}, {3}, DType::i32)},
      {"i64", ops::from_vector(std::vector<int64_t>{(int64_t(1) << 62) + 1, -5}, {2}, DType::i64)},
      {"u8", ops::from_vector(std::vector<double>{0, 128, 255}, {3}, DType::u8)},
      {"bool", ops::from_vector(std::vector<double>{1, 0, 1}, {3}, DType::boolean)},
      {"scalar", ops::scalar(-4.5)},
      {"empty", ops::zeros({0, 5})},
      // A non-contiguous view is stored contiguous (row-major order of its own shape).
      {"transposed", ops::transpose(ops::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}), 0, 1)},
      {"name \"with\" \\ escapes\n\u00e9", ops::ones({2})},
  };
  std::string p = path("all.safetensors");
  engine::save_safetensors(p, tensors);
  EXPECT_EQ(files(), std::vector<std::string>{"all.safetensors"});  // no temporary left behind

  auto loaded = engine::load_safetensors(p, engine::default_device());
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_EQ(loaded.count(name), 1u);
    const Tensor& l = loaded.at(name);
    EXPECT_EQ(l.dtype(), t.dtype());
    EXPECT_EQ(l.shape(), t.shape());
    EXPECT_TRUE(l.is_contiguous());
    std::vector<double> a = t.to_double(), b = l.to_double();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); i++) {
      EXPECT_EQ(a[i], b[i]) << i;
      EXPECT_EQ(std::signbit(a[i]), std::signbit(b[i])) << i;  // -0.0 stays -0.0
    }
  }
  EXPECT_EQ(loaded.at("i64").data<int64_t>()[0], (int64_t(1) << 62) + 1);  // exact beyond 2^53
  EXPECT_EQ(loaded.at("transposed").to_double(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(loaded.at("f32").name(), "f32");
}

TEST_F(Safetensors, MetadataRoundTripAndHeaderOnly) {
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "12"}, {"odd \"key\"", "tab\tand\\"}};
  std::string p = path("meta.safetensors");
  engine::save_safetensors(p, {{"b", ops::zeros({3})}, {"a", ops::zeros({2, 2}, DType::f64)}}, meta);
  EXPECT_EQ(engine::read_safetensors_metadata(p), meta);
  engine::SafetensorsHeader h = engine::read_safetensors_header(p);
  ASSERT_EQ(h.entries.size(), 2u);
  EXPECT_EQ(h.entries[0].name, "b");  // data order = the order given
  EXPECT_EQ(h.entries[0].end, 12u);
  EXPECT_EQ(h.entries[1].dtype, DType::f64);
  EXPECT_EQ(h.entries[1].shape, (Shape{2, 2}));
  EXPECT_EQ(h.data_start % 8, 0u);  // the header is padded so the data is 8-byte aligned
  EXPECT_EQ(h.file_size, h.data_start + 12 + 32);
  // Saving again replaces the file atomically.
  engine::save_safetensors(p, {{"c", ops::ones({1})}});
  EXPECT_TRUE(engine::read_safetensors_metadata(p).empty());
  EXPECT_EQ(files().size(), 1u);
}

TEST_F(Safetensors, MetaDeviceAllocatesTheSameBytesAndReadsNothing) {
  std::string p = path("m.safetensors");
  engine::save_safetensors(p, {{"w", ops::ones({100, 7})}, {"ids", ops::zeros({13}, DType::i64)}});
  auto cpu = engine::Device::create(engine::DeviceType::cpu, 1 << 22);
  auto meta = engine::Device::create(engine::DeviceType::meta, 1 << 22);
  auto on_cpu = engine::load_safetensors(p, cpu);
  auto on_meta = engine::load_safetensors(p, meta);
  EXPECT_TRUE(on_meta.at("w").is_meta());
  EXPECT_EQ(on_meta.at("w").shape(), (Shape{100, 7}));
  EXPECT_EQ(meta->ledger().live_bytes(), cpu->ledger().live_bytes());
  EXPECT_GT(meta->ledger().live_bytes(), 2800u);
  EXPECT_EQ(on_cpu.at("w").to_double()[699], 1.0);
}

TEST_F(Safetensors, SavingMetaTensorsOrDuplicateNamesIsAnError) {
  auto meta = engine::Device::create(engine::DeviceType::meta, 1 << 20);
  Tensor m = Tensor::empty({2}, DType::f32, meta);
  EXPECT_THROW(engine::save_safetensors(path("x.safetensors"), {{"m", m}}), engine::Error);
  EXPECT_THROW(engine::save_safetensors(path("x.safetensors"), {{"a", ops::ones({1})}, {"a", ops::ones({1})}}),
               engine::Error);
  EXPECT_TRUE(files().empty());  // nothing written, no temporary left
}

// ---------------------------------------------------------------------------------------------------
// A file from the reference implementation (tests/data/make_reference_safetensors.py)

TEST_F(Safetensors, LoadsFileWrittenByPythonSafetensors) {
  std::string here = __FILE__;
  std::string p = here.substr(0, here.find_last_of('/')) + "/../data/reference.safetensors";
  auto t = engine::load_safetensors(p, engine::default_device());
  ASSERT_EQ(t.size(), 10u);
  EXPECT_EQ(t.at("encoder.layer.0.weight").shape(), (Shape{2, 3}));
  EXPECT_EQ(t.at("encoder.layer.0.weight").to_double(), (std::vector<double>{-1, -0.5, 0, 0.5, 1, 1.5}));
  std::vector<double> bias = t.at("encoder.layer.0.bias").to_double();
  EXPECT_EQ(t.at("encoder.layer.0.bias").dtype(), DType::f64);
  EXPECT_EQ(bias, (std::vector<double>{1.0 / 3.0, -2.5, 1e-300}));
  EXPECT_EQ(t.at("half").dtype(), DType::f16);
  // f16 nearest values: 0.1 -> 0.0999755859375, 6e-8 -> 2^-24 (the smallest subnormal)
  EXPECT_EQ(t.at("half").to_double(), (std::vector<double>{0.0999755859375, -2, 65504, std::ldexp(1.0, -24)}));
  EXPECT_EQ(t.at("ids").to_double(), (std::vector<double>{-7, 0, 2147483647.0}));
  const int64_t* big = t.at("big").data<int64_t>();
  EXPECT_EQ(big[0], (int64_t(1) << 40) + 1);
  EXPECT_EQ(big[1], -(int64_t(1) << 62));
  EXPECT_EQ(t.at("bytes").to_double(), (std::vector<double>{0, 1, 255}));
  EXPECT_EQ(t.at("mask").dtype(), DType::boolean);
  EXPECT_EQ(t.at("mask").to_double(), (std::vector<double>{1, 0, 1, 1}));
  EXPECT_EQ(t.at("scalar").shape(), Shape{});
  EXPECT_EQ(t.at("scalar").item(), 3.25);
  EXPECT_EQ(t.at("empty").shape(), (Shape{0, 3}));
  EXPECT_EQ(t.at("unicode name \u00e9\u4e2d \"quoted\"").item(), 42.0);
  auto meta = engine::read_safetensors_metadata(p);
  EXPECT_EQ(meta.at("format"), "np");
  EXPECT_EQ(meta.at("escaped"), "line\nbreak \"q\" \\");
}

// ---------------------------------------------------------------------------------------------------
// Corrupt files: each refused with a message that names the problem

TEST_F(Safetensors, FileTooShort) {
  std::string p = path("short.safetensors");
  std::ofstream(p, std::ios::binary) << "abc";
  expect_load_error(p, {"too short", "3 bytes"});
}

TEST_F(Safetensors, HeaderLengthLargerThanFile) {
  std::string h = "{" + tensor_json("a", "F32", "[1]", 0, 4) + "}";
  expect_load_error(write_raw("len.safetensors", h, 4, 1000000), {"header length 1000000", "larger than the file"});
}

TEST_F(Safetensors, BadJsonWithBytePosition) {
  std::string h = "{" + tensor_json("a", "F32", "[1]", 0, 4) + ",}";  // trailing comma
  expect_load_error(write_raw("json.safetensors", h, 4),
                    {"JSON syntax error", "at byte " + std::to_string(h.size() - 1), "a string key"});
  expect_load_error(write_raw("json2.safetensors", "{\"a\":{\"dtype\":\"F32\" \"shape\":[1]}}", 0),
                    {"JSON syntax error", "at byte 20", "expected '}'"});
  expect_load_error(write_raw("json3.safetensors", "{\"a\":tru}", 0), {"JSON syntax error", "at byte 5"});
  expect_load_error(write_raw("json4.safetensors", "[1, 2]", 0), {"must be a JSON object"});
  expect_load_error(write_raw("utf8.safetensors", "{\"\xff\":1}", 0), {"not valid UTF-8", "at byte 2"});
}

TEST_F(Safetensors, UnknownDtype) {
  std::string h = "{" + tensor_json("a", "I16", "[2]", 0, 4) + "}";
  expect_load_error(write_raw("dtype.safetensors", h, 4), {"tensor 'a'", "unknown dtype 'I16'"});
}

TEST_F(Safetensors, OffsetsOutOfRange) {
  std::string h = "{" + tensor_json("a", "F32", "[1]", 0, 4) + "," + tensor_json("b", "F32", "[1]", 40, 44) + "}";
  expect_load_error(write_raw("range.safetensors", h, 8), {"tensor 'b'", "out of range", "8 bytes"});
}

TEST_F(Safetensors, OverlappingOffsets) {
  std::string h = "{" + tensor_json("a", "F32", "[2]", 0, 8) + "," + tensor_json("b", "F32", "[1]", 4, 8) + "}";
  expect_load_error(write_raw("overlap.safetensors", h, 8), {"'a'", "'b'", "overlap"});
}

TEST_F(Safetensors, OffsetsNotCoveringTheBuffer) {
  std::string gap = "{" + tensor_json("a", "F32", "[1]", 0, 4) + "," + tensor_json("b", "F32", "[1]", 8, 12) + "}";
  expect_load_error(write_raw("gap.safetensors", gap, 12), {"bytes [4, 8)", "belong to no tensor"});
  std::string tail = "{" + tensor_json("a", "F32", "[1]", 0, 4) + "}";
  expect_load_error(write_raw("tail.safetensors", tail, 12), {"12 bytes follow the header", "cover only 4"});
}

TEST_F(Safetensors, ShapeTimesDtypeDiffersFromByteRange) {
  std::string h = "{" + tensor_json("a", "F64", "[2,3]", 0, 24) + "}";
  expect_load_error(write_raw("size.safetensors", h, 24), {"tensor 'a'", "needs 48 bytes", "hold 24"});
}

TEST_F(Safetensors, DuplicateNames) {
  std::string h = "{" + tensor_json("a", "F32", "[1]", 0, 4) + "," + tensor_json("a", "F32", "[1]", 4, 8) + "}";
  expect_load_error(write_raw("dup.safetensors", h, 8), {"duplicate tensor name 'a'"});
}

TEST_F(Safetensors, TruncatedFile) {
  std::string p = path("trunc.safetensors");
  engine::save_safetensors(p, {{"w", ops::ones({10})}, {"v", ops::ones({3})}});
  engine::SafetensorsHeader h = engine::read_safetensors_header(p);
  ASSERT_EQ(truncate(p.c_str(), off_t(h.file_size - 5)), 0);
  expect_load_error(p, {"truncated", "52 bytes of tensor data", "only 47"});
}

TEST_F(Safetensors, BadMetadataAndFieldTypes) {
  std::string h = "{\"__metadata__\":{\"step\":12}," + tensor_json("a", "F32", "[1]", 0, 4) + "}";
  expect_load_error(write_raw("meta.safetensors", h, 4), {"__metadata__", "'step'", "must be a string"});
  std::string neg = "{" + tensor_json("a", "F32", "[-1]", 0, 4) + "}";
  expect_load_error(write_raw("neg.safetensors", neg, 4), {"shape dimension", "non-negative integer"});
  expect_load_error(write_raw("missing.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 0),
                    {"tensor 'a'", "data_offsets"});
}
