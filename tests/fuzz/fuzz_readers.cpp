// fuzz_readers.cpp: one libFuzzer target for every input format the engine reads (`make fuzz`). The format
// comes from FUZZ_FORMAT (a name of testutil::format_samples(): checkpoint, squad_json, png, ...); the
// corpus starts from that format's valid sample. Each input goes through testutil::read_input, which must
// return or throw engine::Error: any other exception aborts, and AddressSanitizer and UBSan report the rest.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

#include "engine/error.h"
#include "tests/util/hostile_util.h"

namespace {
testutil::InputFormat g_format;
std::string g_dir;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("FUZZ_FORMAT");
  std::string known;
  for (const testutil::FormatSample& s : testutil::format_samples()) {
    known += std::string(known.empty() ? "" : ", ") + s.name;
    if (name && s.name == std::string(name)) {
      g_format = s.format;
      // The corpus folder (the first argument libFuzzer is given) starts from the valid sample.
      const std::string corpus = std::string("build-fuzz/corpus_") + s.name;
      std::filesystem::create_directories(corpus);
      std::FILE* f = std::fopen((corpus + "/valid").c_str(), "wb");
      if (f) std::fwrite(s.valid.data(), 1, s.valid.size(), f), std::fclose(f);
      g_dir = std::filesystem::temp_directory_path() / ("fuzz_" + std::string(s.name));
      std::filesystem::create_directories(g_dir);
      return 0;
    }
  }
  std::fprintf(stderr, "set FUZZ_FORMAT to one of: %s\n", known.c_str());
  std::exit(2);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    testutil::read_input(g_format, std::string(reinterpret_cast<const char*>(data), size), g_dir);
  } catch (const engine::Error&) {  // a clear error is a fine answer
  } catch (const std::exception& e) {
    std::fprintf(stderr, "not an engine::Error: %s\n", e.what());
    std::abort();
  }
  return 0;
}
