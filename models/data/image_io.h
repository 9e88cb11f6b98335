// image_io.h: decoding JPEG (libjpeg-turbo's libjpeg API) and PNG (libpng) files into 8-bit pixels, and the
// resampling the vision data sets share (bilinear for images, nearest for label maps).
//
// Decoders return uint8 [H, W, C]. JPEGs always come back as RGB (grey JPEGs are expanded, CMYK is an error).
// PNGs keep their colour type: palette PNGs give their palette INDICES (1 channel; what VOC label maps store),
// grey 1 channel, grey + alpha 2, RGB 3, RGBA 4; 16-bit samples are reduced to 8 (or, asked for, kept whole in
// Image::wide: Cityscapes' instance maps hold ids like 26001) and 1/2/4-bit ones unpacked (palette: still indices;
// grey: scaled to 0..255 by libpng). A corrupt, truncated or unsupported file is an
// engine::Error naming the file and what was wrong: both libraries report through a longjmp to the decoder
// (never exit()), and libjpeg's "corrupt data" warnings (a truncated file is one) are errors too.
//
// Also here, for both vision sets: ImageNet normalization, the seeded epoch order, per-item generators and a
// small thread pool for decoding.
//
// Resampling uses pixel-centre alignment (align_corners false, as PIL, OpenCV and torch): destination pixel i
// of a `dst`-long axis sits at source coordinate (i + 0.5) * src / dst - 0.5.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace models::data {

struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;  // [height, width, channels]
  int source_bits = 8;          // bits per channel in the file (a 16-bit PNG's values are reduced to 8 bits)
  std::vector<uint16_t> wide;   // instead of pixels: a 16-bit PNG decoded with keep_16_bits, its full values
  uint8_t at(int64_t y, int64_t x, int64_t c = 0) const { return pixels[size_t((y * width + x) * channels + c)]; }
  // Sample (y, x, c) whatever the depth: wide's value for a 16-bit PNG kept whole, else pixels'.
  uint32_t value(int64_t y, int64_t x, int64_t c = 0) const {
    const size_t i = size_t((y * width + x) * channels + c);
    return wide.empty() ? pixels[i] : wide[i];
  }
};

// `source` names the data (a file name) in errors.
Image decode_jpeg(const std::string& bytes, const std::string& source);
Image decode_png(const std::string& bytes, const std::string& source, bool keep_16_bits = false);
// Reads a file and decodes it by its signature (JPEG FF D8 FF, PNG 89 'PNG'); anything else is an Error.
// keep_16_bits: a 16-bit PNG's samples go to Image::wide unreduced.
Image read_image(const std::string& path, bool keep_16_bits = false);
// 3 channels: grey is repeated, alpha dropped (images the models read are RGB).
Image to_rgb(Image image);

// ---------------------------------------------------------------------------------------------------
// Resampling

// Source coordinate of destination pixel i when an axis of `src` pixels is resized to `dst`.
inline double resize_source(int64_t i, int64_t src, int64_t dst) {
  return (double(i) + 0.5) * double(src) / double(dst) - 0.5;
}
// Nearest source pixel of destination pixel i (PIL's NEAREST: floor of the centre's position).
int64_t resize_nearest(int64_t i, int64_t src, int64_t dst);
// Bilinear value of channel c at source position (y, x), edges clamped (replicated).
float sample_bilinear(const Image& image, double y, double x, int64_t c);
// An RGB `image` at height x width into out [height, width, 3] as v / 127.5 - 1 (the [-1, 1] of pix2pixHD's and
// StyleGAN's images), mirrored left to right when `mirror`: pixel-centre bilinear sampling, or the pixels
// themselves when the size is the image's own.
void resample_rgb(const Image& image, int64_t height, int64_t width, bool mirror, float* out);

// ---------------------------------------------------------------------------------------------------
// Shared by the vision sets (segmentation.h, detection.h)

// Whether a file name ends in .jpg, .jpeg or .png, in any case (ImageFolder's test; the image folders' too).
bool is_image_name(const std::string& name);

// ImageNet's statistics, for every vision data set here (jfzhang95's Normalize; deeplabv3 and yolov3 alike).
constexpr float kImageNetMean[3] = {0.485f, 0.456f, 0.406f}, kImageNetStd[3] = {0.229f, 0.224f, 0.225f};
inline float imagenet_normalize(float value_0_255, int64_t c) {
  return (value_0_255 / 255.f - kImageNetMean[c]) / kImageNetStd[c];
}

// Position `index` (0, 1, ...) of the endless sequence of seeded epochs over `count` items: the item id.
int64_t epoch_item(int64_t index, int64_t count, uint64_t seed);
// The same sequence, keeping the last epoch's permutation: a set asks for its batch's ids on one thread each
// step, and shuffles `count` ids once per epoch instead of once per item (COCO: 118k ids).
class EpochOrder {
 public:
  // The ids at positions first .. first + n - 1, for `count` items and `seed`.
  std::vector<int64_t> items(int64_t first, int64_t n, int64_t count, uint64_t seed);

 private:
  int64_t epoch_ = -1, count_ = 0;
  uint64_t seed_ = 0;
  std::vector<int64_t> order_;  // [count_]: epoch_'s permutation
};
// The generator for the random draws of the item at `index` (its transform).
std::mt19937_64 item_rng(uint64_t seed, int64_t index);
// A uniform draw in [0, 1) with 53 random bits (Python's random.random(); std's distributions differ
// between standard libraries).
inline double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }
// Runs f(i) for i in [0, n) on up to `threads` std::threads (0: min(4, the hardware's)); the first
// exception is rethrown.
void parallel_for(int64_t n, const std::function<void(int64_t)>& f, int64_t threads = 0);

}  // namespace models::data
