// classification.cpp: opening an ImageFolder-style set, torchvision's RandomResizedCrop + flip, and the batches.
#include "models/data/classification.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <utility>

#include "engine/error.h"
#include "engine/io.h"

namespace models::data {

namespace fs = std::filesystem;

namespace {
const char* kLayout =
    "an ImageFolder-style set has DIR/<class>/<image>, one folder per class (ImageNet's train/), "
    "images named *.jpg, *.jpeg or *.png";

// RandomResizedCrop's defaults (torchvision, as timm and the reference ImageNet script use them).
constexpr double kMinScale = 0.08, kMaxScale = 1.0, kMinRatio = 3.0 / 4.0, kMaxRatio = 4.0 / 3.0;
constexpr int kAttempts = 10;

// Python's random.randint(lo, hi), inclusive at both ends (as segmentation.cpp draws it).
int64_t randint(std::mt19937_64& rng, int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); }

// Python's round() of a non-negative value: to nearest, ties to even (nearbyint in the default rounding mode).
int64_t round_half_even(double v) { return int64_t(std::nearbyint(v)); }

struct Entry {
  std::string name;
  bool directory;
};
// The entries of `folder` other than hidden ones (a leading '.'); a folder that cannot be listed is an Error.
std::vector<Entry> list_folder(const std::string& dir, const fs::path& folder) {
  std::vector<Entry> entries;
  try {
    for (const auto& entry : fs::directory_iterator(folder)) {
      std::string name = entry.path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      const bool directory = entry.is_directory();  // follows symbolic links, as ImageFolder's scandir does
      entries.push_back({std::move(name), directory});
    }
  } catch (const fs::filesystem_error& e) {
    throw engine::Error(engine::str("--data '", dir, "': cannot list '", folder.string(), "' (", e.code().message(),
                                    "): make it readable"));
  }
  return entries;
}
}  // namespace

// ---------------------------------------------------------------------------------------------------
// Transform

ResizedCrop resized_crop_fallback(int64_t h, int64_t w) {
  ResizedCrop t;
  const double in_ratio = double(w) / double(h);
  if (in_ratio < kMinRatio) {
    t.width = w, t.height = round_half_even(double(w) / kMinRatio);
  } else if (in_ratio > kMaxRatio) {
    t.height = h, t.width = round_half_even(double(h) * kMaxRatio);
  } else {
    t.width = w, t.height = h;
  }
  t.top = (h - t.height) / 2, t.left = (w - t.width) / 2;
  return t;
}

ResizedCrop draw_resized_crop(int64_t h, int64_t w, std::mt19937_64& rng) {
  ENGINE_CHECK(h > 0 && w > 0, "RandomResizedCrop: an image of ", w, "x", h, " pixels; it needs at least one pixel");
  const double area = double(h) * double(w), log_min = std::log(kMinRatio), log_max = std::log(kMaxRatio);
  ResizedCrop t;
  bool found = false;
  for (int attempt = 0; attempt < kAttempts && !found; attempt++) {
    const double target_area = area * (kMinScale + (kMaxScale - kMinScale) * uniform01(rng));  // first draw
    const double aspect = std::exp(log_min + (log_max - log_min) * uniform01(rng));            // second draw
    const int64_t cw = round_half_even(std::sqrt(target_area * aspect));
    const int64_t ch = round_half_even(std::sqrt(target_area / aspect));
    if (0 < cw && cw <= w && 0 < ch && ch <= h) {
      t.height = ch, t.width = cw;
      t.top = randint(rng, 0, h - ch);  // torchvision draws the row first, then the column
      t.left = randint(rng, 0, w - cw);
      found = true;
    }
  }
  if (!found) t = resized_crop_fallback(h, w);
  t.flip = uniform01(rng) < 0.5;  // RandomHorizontalFlip: torch.rand(1) < p
  return t;
}

void apply_resized_crop(const Image& image, const ResizedCrop& t, int64_t size, float* out) {
  ENGINE_CHECK(image.channels == 3, "RandomResizedCrop: the image has ", image.channels,
               " channels; expected RGB (decode it with to_rgb)");
  ENGINE_CHECK(t.height > 0 && t.width > 0 && t.top >= 0 && t.left >= 0 && t.top + t.height <= image.height &&
                   t.left + t.width <= image.width,
               "RandomResizedCrop: the crop (top ", t.top, ", left ", t.left, ", ", t.width, "x", t.height,
               ") is not inside the ", image.width, "x", image.height, " image");
  for (int64_t y = 0; y < size; y++) {
    // Crop, then resize: the source position is clamped to the crop's edges, not the image's.
    const double fy = double(t.top) + std::clamp(resize_source(y, t.height, size), 0.0, double(t.height - 1));
    for (int64_t x = 0; x < size; x++) {
      const int64_t rx = t.flip ? size - 1 - x : x;  // the flip comes after the resize: column x shows size - 1 - x
      const double fx = double(t.left) + std::clamp(resize_source(rx, t.width, size), 0.0, double(t.width - 1));
      float* pixel = out + (y * size + x) * 3;  // [3]
      for (int64_t c = 0; c < 3; c++) pixel[c] = inception_normalize(sample_bilinear(image, fy, fx, c));
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// The set

ClassificationSet::ClassificationSet(const std::string& dir, int64_t classes) : dir_(dir), classes_(classes) {
  ENGINE_CHECK(fs::is_directory(dir), "--data '", dir, "': no such directory (", kLayout, ")");
  int64_t loose_images = 0;  // images directly in DIR: not part of the set, but worth saying when there is no class
  for (const Entry& e : list_folder(dir, dir)) {
    if (e.directory) {
      class_names_.push_back(e.name);
    } else {
      loose_images += is_image_name(e.name);
    }
  }
  std::sort(class_names_.begin(), class_names_.end());
  const std::string loose =
      loose_images ? engine::str(" (", loose_images, " images directly in it: move them into one folder per class)")
                   : "";
  ENGINE_CHECK(!class_names_.empty(), "--data '", dir, "': no class folders", loose, "; ", kLayout);
  ENGINE_CHECK(folders() <= classes, "--data '", dir, "': ", folders(), " class folders but the model has ", classes,
               " classes: remove folders, or use a model with at least ", folders(), " classes");
  label_offset_ = classes == folders() + 1 ? 1 : 0;
  for (int64_t k = 0; k < folders(); k++) {
    const std::string& name = class_names_[size_t(k)];
    std::vector<std::string> images;
    for (const Entry& e : list_folder(dir, fs::path(dir) / name))
      if (!e.directory && is_image_name(e.name)) images.push_back(e.name);
    ENGINE_CHECK(!images.empty(), "--data '", dir, "': class folder '", name,
                 "' has no image (no file named *.jpg, *.jpeg or *.png): add its images or remove the folder; ",
                 kLayout);
    std::sort(images.begin(), images.end());
    for (std::string& file : images) files_.push_back(std::move(file)), folder_.push_back(k);
  }
}

std::shared_ptr<const ClassificationSet> ClassificationSet::open_shared(const std::string& dir, int64_t classes) {
  static std::map<std::pair<std::string, int64_t>, std::shared_ptr<const ClassificationSet>> opened;
  static std::mutex lock;
  std::lock_guard<std::mutex> hold(lock);
  auto& set = opened[{dir, classes}];
  if (!set) set = std::make_shared<const ClassificationSet>(dir, classes);  // an Error leaves no entry set
  return set;
}

std::string ClassificationSet::path(int64_t i) const {
  return (fs::path(dir_) / class_names_[size_t(folder_[size_t(i)])] / files_[size_t(i)]).string();
}

Image ClassificationSet::load(int64_t i) const { return to_rgb(read_image(path(i))); }

std::string ClassificationSet::describe() const {
  std::string labels;
  if (label_offset_ == 1) {
    labels = engine::str("labels 1..", folders(), ", 0 the model's background class");
  } else if (folders() == classes_) {
    labels = engine::str("labels 0..", folders() - 1);
  } else {
    labels = engine::str("labels 0..", folders() - 1, " of the model's ", classes_, " classes");
  }
  return engine::str("ImageFolder-style '", dir_, "': ", size(), " images in ", folders(), " class folders (", labels,
                     ")");
}

ClassificationData ClassificationSet::batch(int64_t n, int64_t size, uint64_t seed, int64_t step) const {
  ClassificationData b;
  b.images.resize(size_t(n * size * size * 3));
  b.labels.resize(size_t(n));
  const int64_t first = std::max<int64_t>(step - 1, 0) * n;
  const std::vector<int64_t> ids = order_.items(first, n, this->size(), seed);
  parallel_for(n, [&](int64_t j) {
    const int64_t index = first + j, i = ids[size_t(j)];
    const Image image = load(i);
    std::mt19937_64 rng = item_rng(seed, index);
    const ResizedCrop t = draw_resized_crop(image.height, image.width, rng);
    apply_resized_crop(image, t, size, b.images.data() + j * size * size * 3);
    b.labels[size_t(j)] = label(i);
  });
  return b;
}

}  // namespace models::data
