// image_io.cpp: JPEG and PNG decoding through the C libraries' error longjmp, and bilinear / nearest sampling.
//
// Both libraries report errors by calling a handler that must not return. Ours copy the message and longjmp
// back to the decoder, which frees the library's state and throws engine::Error. Between setjmp and a
// longjmp the decoders modify nothing that lives on their own stack frame (the pixels and the libraries' state are on
// the heap, libpng's handles are set before setjmp), so nothing read after the jump is indeterminate.
#include "models/data/image_io.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

#include <jpeglib.h>
#include <png.h>

#include "engine/error.h"
#include "engine/io.h"

namespace models::data {

// ---------------------------------------------------------------------------------------------------
// JPEG

namespace {

struct JpegErrors {
  jpeg_error_mgr mgr;  // first: libjpeg passes &mgr, which is then also a JpegErrors*
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr info) {
  auto* e = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings (msg_level -1) are corrupt-data reports, e.g. "Premature end of JPEG file" for a truncated file,
// after which libjpeg would fill the rest with grey: fail instead. Trace messages (level >= 0) are ignored.
void jpeg_message(j_common_ptr info, int level) {
  if (level < 0) jpeg_fail(info);
}

struct JpegState {
  jpeg_decompress_struct info;
  JpegErrors errors;
};

}  // namespace

// The most an image may decode to: a corrupt header's sizes are an Error, not an allocation of many GiB.
constexpr uint64_t kMaxImageBytes = uint64_t(1) << 30;

Image decode_jpeg(const std::string& bytes, const std::string& source) {
  auto image = std::make_unique<Image>();  // on the heap, as the library's state: see the file comment
  auto state = std::make_unique<JpegState>();
  jpeg_decompress_struct& info = state->info;
  JpegErrors& errors = state->errors;
  info.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpeg_fail;
  errors.mgr.emit_message = jpeg_message;
  errors.message[0] = 0;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&info);
    throw engine::Error(engine::str("JPEG '", source, "': corrupt or truncated (libjpeg: ", errors.message,
                                    "); re-encode or replace the file"));
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) {
    std::snprintf(errors.message, sizeof errors.message, "CMYK JPEGs are not supported: convert it to RGB");
    std::longjmp(errors.jump, 1);
  }
  if (uint64_t(info.image_width) * info.image_height * 3 > kMaxImageBytes) {  // a corrupt header's sizes
    std::snprintf(errors.message, sizeof errors.message, "%ux%u pixels is over the %llu MiB an image may decode to",
                  info.image_width, info.image_height, (unsigned long long)(kMaxImageBytes >> 20));
    std::longjmp(errors.jump, 1);
  }
  info.out_color_space = JCS_RGB;  // grey is expanded
  jpeg_start_decompress(&info);
  image->height = info.output_height, image->width = info.output_width, image->channels = info.output_components;
  image->pixels.resize(size_t(image->height * image->width * image->channels));
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = image->pixels.data() + size_t(info.output_scanline) * size_t(image->width * image->channels);
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return std::move(*image);
}

// ---------------------------------------------------------------------------------------------------
// PNG

namespace {

struct PngInput {
  const std::string* bytes;
  size_t offset;
  std::jmp_buf jump;
  char message[256];
};

[[noreturn]] void png_fail(png_structp png, png_const_charp message) {
  auto* in = static_cast<PngInput*>(png_get_error_ptr(png));
  std::snprintf(in->message, sizeof in->message, "%s", message);
  std::longjmp(in->jump, 1);
}

void png_warning_ignored(png_structp, png_const_charp) {}

void png_read_memory(png_structp png, png_bytep out, png_size_t count) {
  auto* in = static_cast<PngInput*>(png_get_io_ptr(png));
  if (in->offset + count > in->bytes->size()) png_error(png, "unexpected end of file (truncated)");
  std::memcpy(out, in->bytes->data() + in->offset, count);
  in->offset += count;
}

}  // namespace

Image decode_png(const std::string& bytes, const std::string& source, bool keep_16_bits) {
  ENGINE_CHECK(bytes.size() >= 8 && png_sig_cmp(reinterpret_cast<png_const_bytep>(bytes.data()), 0, 8) == 0,
               "PNG '", source, "': not a PNG file (bad signature)");
  auto image = std::make_unique<Image>();
  auto rows = std::make_unique<std::vector<png_bytep>>();
  auto input = std::make_unique<PngInput>();
  PngInput& in = *input;
  in.bytes = &bytes;
  in.offset = 0;
  in.message[0] = 0;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &in, png_fail, png_warning_ignored);
  ENGINE_CHECK(png, "PNG '", source, "': libpng could not start (out of memory?)");
  png_infop info = png_create_info_struct(png);
  if (!info) png_destroy_read_struct(&png, nullptr, nullptr);
  ENGINE_CHECK(info, "PNG '", source, "': libpng could not start (out of memory?)");
  if (setjmp(in.jump)) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw engine::Error(engine::str("PNG '", source, "': corrupt or truncated (libpng: ", in.message,
                                    "); re-encode or replace the file"));
  }
  png_set_read_fn(png, &in, png_read_memory);
  png_read_info(png, info);
  const int colour = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  image->source_bits = depth;
  const bool wide = depth == 16 && keep_16_bits;
  if (depth == 16 && !wide) png_set_strip_16(png);
  const uint16_t one = 1;
  const bool little_endian = *reinterpret_cast<const uint8_t*>(&one) == 1;
  if (wide && little_endian) png_set_swap(png);  // PNG stores 16-bit samples big-endian: to the host's order
  if (depth < 8) {
    if (colour == PNG_COLOR_TYPE_PALETTE) png_set_packing(png);  // one index per byte, values unchanged
    else png_set_expand_gray_1_2_4_to_8(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  image->height = png_get_image_height(png, info), image->width = png_get_image_width(png, info);
  image->channels = png_get_channels(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info), sample_bytes = wide ? 2 : 1;
  if (row_bytes != size_t(image->width * image->channels) * sample_bytes)
    png_error(png, "unexpected row size after unpacking");
  if (uint64_t(row_bytes) * uint64_t(image->height) > kMaxImageBytes)  // a corrupt header's sizes
    png_error(png, "the image is over the 1 GiB an image may decode to");
  unsigned char* base = nullptr;
  if (wide) {
    image->wide.resize(size_t(image->height * image->width * image->channels));
    base = reinterpret_cast<unsigned char*>(image->wide.data());
  } else {
    image->pixels.resize(size_t(image->height) * row_bytes);
    base = image->pixels.data();
  }
  rows->resize(size_t(image->height));
  for (int64_t y = 0; y < image->height; y++) (*rows)[size_t(y)] = base + size_t(y) * row_bytes;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return std::move(*image);
}

// ---------------------------------------------------------------------------------------------------
// Files and channels

Image read_image(const std::string& path, bool keep_16_bits) {
  const std::string bytes = engine::read_file(path, "image", 256 * engine::kMiB);
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return decode_jpeg(bytes, path);
  if (bytes.size() >= 4 && b[0] == 0x89 && b[1] == 'P' && b[2] == 'N' && b[3] == 'G')
    return decode_png(bytes, path, keep_16_bits);
  throw engine::Error(engine::str("image '", path, "': neither a JPEG nor a PNG file (", bytes.size(),
                                  " bytes, unknown signature); replace it with a JPEG or PNG"));
}

Image to_rgb(Image image) {
  if (image.channels == 3) return image;
  Image rgb;
  rgb.height = image.height, rgb.width = image.width, rgb.channels = 3;
  rgb.pixels.resize(size_t(image.height * image.width * 3));
  const bool grey = image.channels <= 2;  // grey, grey + alpha; else RGBA
  for (int64_t p = 0; p < image.height * image.width; p++)
    for (int64_t c = 0; c < 3; c++)
      rgb.pixels[size_t(p * 3 + c)] = image.pixels[size_t(p * image.channels + (grey ? 0 : c))];
  return rgb;
}

// ---------------------------------------------------------------------------------------------------
// Resampling

int64_t resize_nearest(int64_t i, int64_t src, int64_t dst) {
  return std::min<int64_t>(src - 1, int64_t(std::floor((double(i) + 0.5) * double(src) / double(dst))));
}

float sample_bilinear(const Image& image, double y, double x, int64_t c) {
  y = std::clamp(y, 0.0, double(image.height - 1));
  x = std::clamp(x, 0.0, double(image.width - 1));
  const int64_t y0 = int64_t(y), x0 = int64_t(x);
  const int64_t y1 = std::min(y0 + 1, image.height - 1), x1 = std::min(x0 + 1, image.width - 1);
  const float fy = float(y - double(y0)), fx = float(x - double(x0));
  const float top = image.at(y0, x0, c) * (1 - fx) + image.at(y0, x1, c) * fx;
  const float bottom = image.at(y1, x0, c) * (1 - fx) + image.at(y1, x1, c) * fx;
  return top * (1 - fy) + bottom * fy;
}

bool is_image_name(const std::string& name) {
  std::string lower = name;
  for (char& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  for (const std::string ext : {".jpg", ".jpeg", ".png"})
    if (lower.size() > ext.size() && lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0) return true;
  return false;
}

void resample_rgb(const Image& image, int64_t height, int64_t width, bool mirror, float* out) {
  const bool same = image.height == height && image.width == width;
  for (int64_t y = 0; y < height; y++) {
    const double fy = resize_source(y, image.height, height);
    for (int64_t x = 0; x < width; x++) {
      const double fx = resize_source(x, image.width, width);
      float* px = out + (y * width + (mirror ? width - 1 - x : x)) * 3;
      for (int64_t c = 0; c < 3; c++)
        px[c] = (same ? float(image.at(y, x, c)) : sample_bilinear(image, fy, fx, c)) / 127.5f - 1.f;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Order and threads

std::vector<int64_t> EpochOrder::items(int64_t first, int64_t n, int64_t count, uint64_t seed) {
  ENGINE_CHECK(count > 0 && first >= 0 && n >= 0, "epoch order: need items (got ", count, ") and positions >= 0 (got ",
               first, ", ", n, ")");
  std::vector<int64_t> ids;
  for (int64_t index = first; index < first + n; index++) {
    const int64_t epoch = index / count;
    if (epoch != epoch_ || count != count_ || seed != seed_) {
      // Fisher-Yates with the engine's own draws (std::shuffle differs between standard libraries).
      std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + uint64_t(epoch) * 0xBF58476D1CE4E5B9ull + 1);
      order_.resize(size_t(count));
      std::iota(order_.begin(), order_.end(), 0);
      for (int64_t i = count - 1; i > 0; i--) std::swap(order_[size_t(i)], order_[size_t(rng() % uint64_t(i + 1))]);
      epoch_ = epoch, count_ = count, seed_ = seed;
    }
    ids.push_back(order_[size_t(index % count)]);
  }
  return ids;
}

int64_t epoch_item(int64_t index, int64_t count, uint64_t seed) {
  return EpochOrder().items(index, 1, count, seed)[0];
}

std::mt19937_64 item_rng(uint64_t seed, int64_t index) {
  return std::mt19937_64(seed * 0x94D049BB133111EBull + uint64_t(index) * 0x2545F4914F6CDD1Dull + 7);
}

void parallel_for(int64_t n, const std::function<void(int64_t)>& f, int64_t threads) {
  if (threads <= 0) threads = std::min<int64_t>(4, std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max<int64_t>(1, std::min(threads, n));
  std::exception_ptr first_error;
  std::mutex error_lock;
  auto work = [&](int64_t t) {
    for (int64_t i = t; i < n; i += threads) {
      try {
        f(i);
      } catch (...) {
        std::lock_guard<std::mutex> hold(error_lock);
        if (!first_error) first_error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; t++) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace models::data
