// safetensors.cpp: the safetensors writer and the validating loader.
//
// The header is parsed by engine/json.h; what JSON allows but safetensors does not (duplicate names,
// invalid UTF-8, non-string metadata, non-integer offsets) is refused here. The file is written through
// engine/io.h's atomic writer, one tensor at a time, so a checkpoint is never held in host memory whole.
#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "engine/error.h"
#include "engine/io.h"
#include "engine/json.h"

namespace engine {

namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;  // the reference implementation's limit

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {{DType::f32, "F32"}, {DType::f64, "F64"}, {DType::f16, "F16"},
                                     {DType::bf16, "BF16"}, {DType::i32, "I32"}, {DType::i64, "I64"},
                                     {DType::u8, "U8"}, {DType::boolean, "BOOL"}};

}  // namespace

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  throw Error(str("safetensors: dtype ", dtype_name(t), " has no safetensors name"));
}

DType dtype_from_safetensors_name(const std::string& name) {
  for (const auto& d : kDTypeNames)
    if (name == d.name) return d.dtype;
  throw Error(str("unknown dtype '", name, "' (supported: F32, F64, F16, BF16, I32, I64, U8, BOOL)"));
}

// ---------------------------------------------------------------------------------------------------
// Reading: a descriptor that closes itself, and reads that finish or throw.

namespace {

struct File {
  int fd = -1;
  explicit File(const std::string& path) {
    do fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC); while (fd < 0 && errno == EINTR);
    ENGINE_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  }
  ~File() { ::close(fd); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
};

// Reads exactly `bytes` at `offset`, or throws naming the file (a short read means the file is shorter).
void read_at(int fd, void* data, size_t bytes, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, bytes, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    ENGINE_CHECK(n >= 0, path, ": read failed: ", std::strerror(errno));
    ENGINE_CHECK(n > 0, path, ": file is truncated: it ends at byte ", offset, " but ", bytes,
                 " more bytes were expected there");
    p += n;
    bytes -= size_t(n);
    offset += uint64_t(n);
  }
}

// Per-tensor checksums of the files this engine writes: zlib's CRC-32 of the tensor's bytes, 8 hex digits.
constexpr const char* kChecksumKey = "engine.crc32";
std::string crc_hex(const void* data, size_t bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {  // zlib takes 32-bit lengths
    const uInt n = uInt(std::min<size_t>(bytes, size_t(1) << 30));
    crc = crc32(crc, p, n);
    p += n;
    bytes -= n;
  }
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08lx", static_cast<unsigned long>(crc & 0xffffffffUL));
  return buf;
}

bool little_endian_host() {
  const uint16_t one = 1;
  uint8_t first;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Reading the header

namespace {

using json::Value;

using json::type_name;

// JSON allows repeated keys; safetensors does not (a repeated tensor name would be ambiguous).
void check_unique_keys(const Value& object, const std::string& what, const std::string& path) {
  std::set<std::string> seen;
  for (const auto& [k, v] : object.members)
    ENGINE_CHECK(seen.insert(k).second, path, ": duplicate ", what, " '", k, "' in the header");
}

// The header must be UTF-8 (the reference implementation refuses anything else): overlong forms,
// surrogates and code points past U+10FFFF are refused, with the byte position.
void check_utf8(const std::string& s, const std::string& path) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  for (size_t k = 0; k < s.size();) {
    unsigned c = p[k];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && k + len <= s.size();
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t j = 1; ok && j < len; j++) {
      ok = (p[k + j] & 0xC0) == 0x80;
      cp = (cp << 6) | (p[k + j] & 0x3F);
    }
    ok = ok && cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp < 0xE000);
    ENGINE_CHECK(ok, path, ": the header is not valid UTF-8: bad byte 0x", std::hex, c, std::dec, " at byte ", k,
                 " of the header (file offset ", 8 + k, ")");
    k += len;
  }
}

// A JSON number that must be a non-negative integer (shape dimensions, offsets).
uint64_t as_count(const Value& v, const std::string& what, const std::string& path) {
  ENGINE_CHECK(v.is_number() && !v.text.empty() && v.text.find_first_not_of("0123456789") == std::string::npos,
               path, ": ", what, " must be a non-negative integer, found ",
               v.is_number() ? v.text : std::string(type_name(v.type)));
  uint64_t x = 0;
  for (char c : v.text) {
    ENGINE_CHECK(x <= (UINT64_MAX - uint64_t(c - '0')) / 10, path, ": ", what, " = ", v.text, " is too large");
    x = x * 10 + uint64_t(c - '0');
  }
  return x;
}

SafetensorsEntry parse_entry(const std::string& name, const Value& v, const std::string& path) {
  std::string what = "tensor '" + name + "'";
  ENGINE_CHECK(v.is_object(), path, ": ", what, " must be described by an object, found ", type_name(v.type));
  check_unique_keys(v, "key of " + what, path);
  // Unknown keys are ignored, as the reference implementation does.
  const Value *dtype = v.find("dtype"), *shape = v.find("shape"), *offsets = v.find("data_offsets");
  ENGINE_CHECK(dtype && shape && offsets, path, ": ", what, " lacks ",
               !dtype ? "\"dtype\"" : !shape ? "\"shape\"" : "\"data_offsets\"");
  SafetensorsEntry e;
  e.name = name;
  ENGINE_CHECK(dtype->is_string(), path, ": ", what, ": dtype must be a string, found ", type_name(dtype->type));
  try {
    e.dtype = dtype_from_safetensors_name(dtype->text);
  } catch (const Error& err) {
    throw Error(str(path, ": ", what, ": ", err.what()));
  }
  ENGINE_CHECK(shape->is_array(), path, ": ", what, ": shape must be an array, found ", type_name(shape->type));
  uint64_t numel = 1;
  bool overflow = false;
  for (const Value& d : shape->items) {
    uint64_t n = as_count(d, what + " shape dimension", path);
    ENGINE_CHECK(n <= uint64_t(INT64_MAX), path, ": ", what, ": shape dimension ", n, " is too large");
    if (n != 0 && numel > UINT64_MAX / n) overflow = true;
    numel *= n;
    e.shape.push_back(int64_t(n));
  }
  ENGINE_CHECK(offsets->is_array() && offsets->items.size() == 2, path, ": ", what,
               ": data_offsets must be an array [begin, end]");
  e.begin = as_count(offsets->items[0], what + " data_offsets begin", path);
  e.end = as_count(offsets->items[1], what + " data_offsets end", path);
  ENGINE_CHECK(e.begin <= e.end, path, ": ", what, ": data_offsets [", e.begin, ", ", e.end, "] end before they begin");
  uint64_t es = dtype_size(e.dtype);
  overflow = overflow || numel > UINT64_MAX / es;
  ENGINE_CHECK(!overflow && numel * es == e.end - e.begin, path, ": ", what, ": shape ", shape_str(e.shape), " of ",
               dtype->text, " needs ", overflow ? std::string("more than 2^64") : std::to_string(numel * es),
               " bytes but data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin);
  return e;
}

}  // namespace

SafetensorsHeader read_safetensors_header(const std::string& path) {
  ENGINE_CHECK(little_endian_host(), "safetensors: this engine reads and writes little-endian hosts only");
  check_input_file(path, "safetensors file", SIZE_MAX);  // not a FIFO (whose open would wait for a writer)
  File f(path);
  struct stat st;
  ENGINE_CHECK(::fstat(f.fd, &st) == 0, path, ": cannot stat: ", std::strerror(errno));
  SafetensorsHeader h;
  h.file_size = uint64_t(st.st_size);
  ENGINE_CHECK(h.file_size >= 8, path, ": file too short (", h.file_size,
               " bytes): a safetensors file starts with an 8-byte header length");
  unsigned char len_bytes[8];
  read_at(f.fd, len_bytes, 8, 0, path);
  uint64_t n = 0;
  for (int k = 7; k >= 0; k--) n = (n << 8) | len_bytes[k];
  ENGINE_CHECK(n <= h.file_size - 8, path, ": header length ", n, " is larger than the file (", h.file_size,
               " bytes, so at most ", h.file_size - 8, " bytes of header)");
  ENGINE_CHECK(n <= kMaxHeaderBytes, path, ": header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  h.data_start = 8 + n;
  std::string text(size_t(n), '\0');
  read_at(f.fd, text.data(), size_t(n), 8, path);

  check_utf8(text, path);
  // Byte positions in JSON errors count from the header's first byte, which is file offset 8.
  Value root = json::parse_json(text, path + " (header; file offset = byte + 8)");
  ENGINE_CHECK(root.is_object(), path, ": the header must be a JSON object, found ", type_name(root.type));
  check_unique_keys(root, "tensor name", path);
  for (const auto& [name, v] : root.members) {
    if (name == "__metadata__") {
      ENGINE_CHECK(v.is_object(), path, ": __metadata__ must be an object of strings, found ", type_name(v.type));
      check_unique_keys(v, "__metadata__ key", path);
      for (const auto& [k, m] : v.members) {
        ENGINE_CHECK(m.is_string(), path, ": __metadata__ value of '", k, "' must be a string, found ",
                     type_name(m.type));
        h.metadata[k] = m.text;
      }
      continue;
    }
    h.entries.push_back(parse_entry(name, v, path));
  }

  // The data: every byte of the buffer belongs to exactly one tensor, in offset order.
  std::stable_sort(h.entries.begin(), h.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t available = h.file_size - h.data_start;
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : h.entries) {
    ENGINE_CHECK(e.begin >= covered, path, ": tensors '", prev ? prev->name : "", "' [", prev ? prev->begin : 0, ", ",
                 covered, ") and '", e.name, "' [", e.begin, ", ", e.end, ") overlap in the data buffer");
    if (e.begin > covered) {
      ENGINE_CHECK(e.end <= available, path, ": tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
                   "] are out of range: the data buffer holds ", available, " bytes");
      throw Error(str(path, ": bytes [", covered, ", ", e.begin, ") of the data buffer belong to no tensor ",
                      "(data_offsets must cover the buffer without gaps)"));
    }
    covered = e.end;
    prev = &e;
  }
  ENGINE_CHECK(covered <= available, path, ": file is truncated: the header describes ", covered,
               " bytes of tensor data but only ", available, " bytes follow the header (file size ", h.file_size,
               ")");
  ENGINE_CHECK(covered == available, path, ": ", available, " bytes follow the header but the tensors cover only ",
               covered, ": data_offsets do not cover the data buffer");
  return h;
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  std::map<std::string, std::string> m = read_safetensors_header(path).metadata;
  m.erase(kChecksumKey);  // the engine's own bookkeeping, checked by load_safetensors
  return m;
}

std::map<std::string, Tensor> load_safetensors(const std::string& path, std::shared_ptr<Device> device) {
  SafetensorsHeader h = read_safetensors_header(path);
  if (!device) device = default_device();
  // A file this engine wrote carries a CRC-32 per tensor (in data order); other writers' files carry none.
  auto crc_it = h.metadata.find(kChecksumKey);
  const std::string* crcs = crc_it == h.metadata.end() ? nullptr : &crc_it->second;
  ENGINE_CHECK(!crcs || crcs->size() == 8 * h.entries.size(), path, ": metadata '", kChecksumKey, "' holds ",
               crcs ? crcs->size() : 0, " characters for ", h.entries.size(), " tensors (8 each): the file is corrupt");
  File f(path);
  std::map<std::string, Tensor> out;
  std::vector<char> host;
  for (size_t i = 0; i < h.entries.size(); i++) {
    const SafetensorsEntry& e = h.entries[i];
    Tensor t = Tensor::empty(e.shape, e.dtype, device);
    t.set_name(e.name);
    if (device->type() != DeviceType::meta) {
      host.resize(size_t(e.end - e.begin));
      if (!host.empty()) read_at(f.fd, host.data(), host.size(), h.data_start + e.begin, path);
      ENGINE_CHECK(!crcs || crcs->compare(8 * i, 8, crc_hex(host.data(), host.size())) == 0, path, ": tensor '",
                   e.name, "' does not match its checksum (CRC-32 ", crcs->substr(8 * i, 8), " in the header, ",
                   crc_hex(host.data(), host.size()), " in the data): the file is corrupt");
      if (!host.empty()) t.copy_from_host(host.data(), host.size());
    }
    out.emplace(e.name, t);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Writing

namespace {

}  // namespace

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  ENGINE_CHECK(little_endian_host(), "safetensors: this engine reads and writes little-endian hosts only");
  // The header: metadata first (with the per-tensor checksums), then the tensors in the order given, their
  // data back to back.
  std::map<std::string, std::string> meta = metadata;
  ENGINE_CHECK(!meta.count(kChecksumKey), "save_safetensors ", path, ": the metadata key '", kChecksumKey,
               "' is the engine's");
  meta[kChecksumKey] = std::string(8 * tensors.size(), '0');
  std::string header = "{";
  {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : meta) {
      if (!first) header += ',';
      first = false;
      header += json::quote(k) + ':' + json::quote(v);
    }
    header += '}';
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    ENGINE_CHECK(!name.empty() && name != "__metadata__", "save_safetensors ", path, ": invalid tensor name '",
                 name, "'");
    ENGINE_CHECK(names.insert(name).second, "save_safetensors ", path, ": tensor name '", name, "' appears twice");
    ENGINE_CHECK(t.defined(), "save_safetensors ", path, ": tensor '", name, "' is undefined");
    ENGINE_CHECK(!t.is_meta(), "save_safetensors ", path, ": tensor '", name,
                 "' is on a meta device, which holds no data to save");
    if (header.size() > 1) header += ',';
    header += json::quote(name);
    header += str(":{\"dtype\":\"", safetensors_dtype_name(t.dtype()), "\",\"shape\":[");
    for (int64_t d = 0; d < t.dim(); d++) header += str(d ? "," : "", t.shape()[d]);
    header += str("],\"data_offsets\":[", offset, ",", offset + t.nbytes(), "]}");
    offset += t.nbytes();
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');  // the data buffer starts 8-byte aligned

  // The checksums' placeholder: 8 hex digits per tensor, patched once the data is written.
  const size_t crc_at = header.find(json::quote(kChecksumKey) + ":\"") + json::quote(kChecksumKey).size() + 2;
  write_file_atomic(path, [&](const ByteSink& write, const BytePatch& patch) {
    unsigned char len_bytes[8];
    for (int k = 0; k < 8; k++) len_bytes[k] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * k));
    write(len_bytes, 8);
    write(header.data(), header.size());
    std::string crcs;
    for (const auto& [name, t] : tensors) {
      std::vector<char> bytes = t.to_host_bytes();
      write(bytes.data(), bytes.size());
      crcs += crc_hex(bytes.data(), bytes.size());
    }
    patch(8 + crc_at, crcs.data(), crcs.size());
  });
}

}  // namespace engine
