// segmentation.cpp: opening a VOC-style set, decoding its items and jfzhang95's flip + scale-crop transform.
#include "models/data/segmentation.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "engine/error.h"
#include "engine/io.h"

namespace models::data {

namespace fs = std::filesystem;

namespace {
const char* kLayout = "a VOC-style set has JPEGImages/<id>.jpg, SegmentationClass/<id>.png and (optionally) "
                      "ImageSets/Segmentation/train.txt";

// Python's random.randint(lo, hi): inclusive at both ends.
int64_t randint(std::mt19937_64& rng, int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); }
}  // namespace

// ---------------------------------------------------------------------------------------------------
// Transform

ScaleCrop draw_scale_crop(int64_t h, int64_t w, int64_t base, int64_t crop, std::mt19937_64& rng) {
  ScaleCrop t;
  t.flip = uniform01(rng) < 0.5;  // RandomHorizontalFlip: random.random() < 0.5
  const int64_t short_size = randint(rng, base / 2, base * 2);
  if (h > w) {
    t.scaled_w = short_size, t.scaled_h = int64_t(double(h) * double(short_size) / double(w));
  } else {
    t.scaled_h = short_size, t.scaled_w = int64_t(double(w) * double(short_size) / double(h));
  }
  // Padded (right and bottom) to at least crop, then a random crop: x first, as the recipe draws them.
  t.left = randint(rng, 0, std::max(t.scaled_w, crop) - crop);
  t.top = randint(rng, 0, std::max(t.scaled_h, crop) - crop);
  return t;
}

void apply_scale_crop(const Image& image, const Image& label, const ScaleCrop& t, int64_t crop, int64_t ignore_index,
                      float* out_image, int64_t* out_labels) {
  const int64_t h = image.height, w = image.width;
  for (int64_t y = 0; y < crop; y++) {
    const int64_t sy = y + t.top;  // row in the scaled image
    for (int64_t x = 0; x < crop; x++) {
      const int64_t sx = x + t.left;
      float* pixel = out_image + (y * crop + x) * 3;  // [3]
      int64_t& l = out_labels[y * crop + x];
      if (sy >= t.scaled_h || sx >= t.scaled_w) {  // the padding: black image, ignored label
        for (int64_t c = 0; c < 3; c++) pixel[c] = imagenet_normalize(0.f, c);
        l = ignore_index;
        continue;
      }
      // The flip comes first: the scaled image's column sx reads the flipped image, i.e. column w - 1 - x'.
      const double fy = resize_source(sy, h, t.scaled_h), fx = resize_source(sx, w, t.scaled_w);
      const int64_t ny = resize_nearest(sy, h, t.scaled_h), nx = resize_nearest(sx, w, t.scaled_w);
      for (int64_t c = 0; c < 3; c++)
        pixel[c] = imagenet_normalize(sample_bilinear(image, fy, t.flip ? double(w - 1) - fx : fx, c), c);
      l = label.at(ny, t.flip ? w - 1 - nx : nx);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// The set

SegmentationSet::SegmentationSet(const std::string& dir, int64_t classes, int64_t ignore_index)
    : dir_(dir), classes_(classes), ignore_index_(ignore_index) {
  ENGINE_CHECK(fs::is_directory(dir), "--data '", dir, "': no such directory (", kLayout, ")");
  for (const char* sub : {"JPEGImages", "SegmentationClass"})
    ENGINE_CHECK(fs::is_directory(fs::path(dir) / sub), "--data '", dir, "': missing the sub-directory ", sub,
                 "/ (", kLayout, ")");
  const fs::path list = fs::path(dir) / "ImageSets" / "Segmentation" / "train.txt";
  if (fs::exists(list)) {
    ids_source_ = list.string();
    engine::check_input_file(ids_source_, "image list", 256 * engine::kMiB);
    std::ifstream in(list);
    ENGINE_CHECK(in.good(), "--data: cannot read '", ids_source_, "'");
    std::string line;
    while (std::getline(in, line)) {
      const size_t b = line.find_first_not_of(" \t\r"), e = line.find_last_not_of(" \t\r");
      if (b != std::string::npos) ids_.push_back(line.substr(b, e - b + 1));
    }
  } else {
    ids_source_ = (fs::path(dir) / "SegmentationClass").string() + "/*.png (no ImageSets/Segmentation/train.txt)";
    for (const auto& entry : fs::directory_iterator(fs::path(dir) / "SegmentationClass"))
      if (entry.path().extension() == ".png") ids_.push_back(entry.path().stem().string());
    std::sort(ids_.begin(), ids_.end());
  }
  ENGINE_CHECK(!ids_.empty(), "--data '", dir, "': no ids in ", ids_source_, " (", kLayout, ")");
  for (int64_t i = 0; i < size(); i++)
    for (const std::string& path : {image_path(i), label_path(i)})
      ENGINE_CHECK(fs::is_regular_file(path), "--data '", dir, "': id '", ids_[size_t(i)], "' (from ", ids_source_,
                   ") has no file '", path, "': add it or remove the id from the list");
}

std::string SegmentationSet::image_path(int64_t i) const {
  return (fs::path(dir_) / "JPEGImages" / (ids_[size_t(i)] + ".jpg")).string();
}

std::string SegmentationSet::label_path(int64_t i) const {
  return (fs::path(dir_) / "SegmentationClass" / (ids_[size_t(i)] + ".png")).string();
}

std::string SegmentationSet::describe() const {
  return engine::str("VOC-style '", dir_, "': ", ids_.size(), " images (", ids_source_, ")");
}

void SegmentationSet::load(int64_t i, Image& image, Image& label) const {
  const std::string label_file = label_path(i);
  image = to_rgb(read_image(image_path(i)));
  label = decode_png(engine::read_file(label_file, "label map", 256 * engine::kMiB), label_file);
  ENGINE_CHECK(label.channels == 1, "label map '", label_file, "': ", label.channels,
               " channels; expected a palette PNG (class indices) or a grey PNG");
  ENGINE_CHECK(label.source_bits <= 8, "label map '", label_file, "' is a ", label.source_bits,
               "-bit PNG: class indices are read from 8-bit palette or grey PNGs (16 bits would lose classes above "
               "255 silently); save it with 8 bits per pixel");
  ENGINE_CHECK(label.height == image.height && label.width == image.width, "label map '", label_file, "' is ",
               label.width, "x", label.height, " but its image '", image_path(i), "' is ", image.width, "x",
               image.height, ": they must be the same size");
  for (int64_t p = 0; p < label.height * label.width; p++) {
    const int64_t v = label.pixels[size_t(p)];
    ENGINE_CHECK(v < classes_ || v == ignore_index_, "label map '", label_file, "': pixel (x ", p % label.width,
                 ", y ", p / label.width, ") has class ", v, "; the model has ", classes_,
                 " classes (values 0..", classes_ - 1, ", or ", ignore_index_, " to ignore)");
  }
}

SegmentationData SegmentationSet::batch(int64_t n, int64_t size, uint64_t seed, int64_t step) const {
  SegmentationData b;
  b.images.resize(size_t(n * size * size * 3));
  b.labels.resize(size_t(n * size * size));
  const int64_t first = std::max<int64_t>(step - 1, 0) * n;
  const std::vector<int64_t> ids = order_.items(first, n, this->size(), seed);
  parallel_for(n, [&](int64_t j) {
    const int64_t index = first + j;
    Image image, label;
    load(ids[size_t(j)], image, label);
    std::mt19937_64 rng = item_rng(seed, index);
    const ScaleCrop t = draw_scale_crop(image.height, image.width, size, size, rng);
    apply_scale_crop(image, label, t, size, ignore_index_, b.images.data() + j * size * size * 3,
                     b.labels.data() + j * size * size);
  });
  return b;
}

}  // namespace models::data
