// safetensors.h: checkpoints in the safetensors format (Hugging Face), written and read without any library.
//
// Layout of a file:
//   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
//   bytes [8, 8 + N)    a JSON object (UTF-8): for each tensor
//                         "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
//                       and optionally "__metadata__": {"key": "value", ...} (strings only)
//   bytes [8 + N, end)  the data buffer: each tensor's elements, contiguous, row-major, little-endian, at
//                       [begin, end) relative to the buffer's start; together they cover it exactly.
// dtypes: F32 F64 F16 BF16 I32 I64 U8 BOOL (the engine's types; files with others are refused by name).
//
// Saving writes a temporary file (engine/io.h: write_file_atomic), fsyncs it, and renames it over `path`, so a
// crash leaves either the old file or the new one, never half of one. Each file this engine writes carries a
// CRC-32 (zlib) of every tensor's bytes in its metadata ("engine.crc32": 8 hex digits per tensor, in data
// order); loading checks it, so a flipped byte is an error, not a silently different weight (files of other
// writers have none; read_safetensors_metadata leaves the key out). Loading validates the whole header against the
// file size
// before it allocates anything, and every error names the file and what is wrong (bad JSON with its byte
// position, unknown dtype, offsets out of range, overlapping or leaving gaps, size mismatch, duplicate
// names, truncated file). Loaded tensors are allocated in the order of their data, with the category of
// the current context (engine::CategoryScope); on a meta device they are allocated and nothing is read.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/device.h"
#include "engine/tensor.h"

namespace engine {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // sorted by begin (the order of the data)
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data buffer: 8 + N
  uint64_t file_size = 0;
};

// "F32", "BF16", ... for a dtype; and back (Error listing the supported names).
const char* safetensors_dtype_name(DType t);
DType dtype_from_safetensors_name(const std::string& name);

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

std::map<std::string, Tensor> load_safetensors(const std::string& path, std::shared_ptr<Device> device);

// The validated header alone (reads only the first 8 + N bytes, plus the file size).
SafetensorsHeader read_safetensors_header(const std::string& path);
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

}  // namespace engine
