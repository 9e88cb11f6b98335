// cityscapes.cpp: the Cityscapes-style triples of pix2pixhd's --data (see cityscapes.h).
#include "models/data/cityscapes.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "engine/error.h"
#include "engine/io.h"

namespace models::data {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The one map of `kind` (stripped names -> path, the suffix "_<kind>.png" cut off) for `key`: a stripped name equal
// to the key or starting with key + "_" (Cityscapes' "<key>_gtFine").
std::string map_for(const std::map<std::string, std::string>& maps, const std::string& key, const std::string& kind,
                    const std::string& dir) {
  std::vector<std::string> found;
  for (auto it = maps.lower_bound(key); it != maps.end() && it->first.compare(0, key.size(), key) == 0; ++it)
    if (it->first.size() == key.size() || it->first[key.size()] == '_') found.push_back(it->second);
  ENGINE_CHECK(found.size() == 1, "--data ", dir, ": image '", key, "_leftImg8bit.png' has ", found.size(), " ", kind,
               " maps (", found.empty() ? std::string("expected ") + key + "*_" + kind + ".png" : found[0],
               found.size() > 1 ? ", " + found[1] : std::string(), "); each image needs exactly one");
  return found[0];
}

}  // namespace

CityscapesSet::CityscapesSet(const std::string& dir, int64_t classes) : dir_(dir), classes_(classes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  ENGINE_CHECK(fs::is_directory(dir, ec), "--data ", dir, ": not a folder (pix2pixhd reads a Cityscapes-style folder ",
               "of *_leftImg8bit.png images with their *_labelIds.png and *_instanceIds.png maps)");
  std::map<std::string, std::string> images, labels, instances;  // key or stripped name -> path
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
  ENGINE_CHECK(!ec, "--data ", dir, ": cannot list the folder (", ec.message(), ")");
  for (; it != end; it.increment(ec)) {
    ENGINE_CHECK(!ec, "--data ", dir, ": listing failed (", ec.message(), ")");
    if (!it->is_regular_file(ec)) continue;
    const std::string name = it->path().filename().string(), path = it->path().string();
    for (auto [suffix, into] :
         {std::pair<const char*, std::map<std::string, std::string>*>{"_leftImg8bit.png", &images},
          {"_labelIds.png", &labels},
          {"_instanceIds.png", &instances}})
      if (ends_with(name, suffix)) {
        const std::string key = name.substr(0, name.size() - std::string(suffix).size());
        ENGINE_CHECK(into->emplace(key, path).second, "--data ", dir, ": two files are named ", name, " (",
                     into->at(key), " and ", path, "); keep one");
      }
  }
  ENGINE_CHECK(!images.empty(), "--data ", dir, ": no *_leftImg8bit.png image under it (a Cityscapes-style set: ",
               "leftImg8bit/<split>/<city>/<key>_leftImg8bit.png with gtFine/<split>/<city>/<key>_gtFine_labelIds.png ",
               "and _instanceIds.png)");
  for (const auto& [key, path] : images) {
    keys_.push_back(key);
    items_.push_back({path, map_for(labels, key, "labelIds", dir), map_for(instances, key, "instanceIds", dir)});
  }
}

std::string CityscapesSet::describe() const {
  return engine::str(dir_, " (", keys_.size(), " Cityscapes-style images with label and instance maps)");
}

CityscapesBatch CityscapesSet::batch(int64_t n, int64_t height, int64_t width, uint64_t seed, int64_t step) const {
  const int64_t pixels = height * width;
  CityscapesBatch b;
  b.labels.resize(size_t(n * pixels));
  b.instances.resize(size_t(n * pixels));
  b.images.resize(size_t(n * pixels * 3));
  const std::vector<int64_t> ids = order_.items((step - 1) * n, n, size(), seed);
  parallel_for(n, [&](int64_t j) {
    const Item& item = items_[size_t(ids[size_t(j)])];
    const Image image = to_rgb(read_image(item.image));
    const Image label = read_image(item.label);
    const Image inst = read_image(item.instance, true);
    for (const auto& [what, im] :
         {std::pair<const std::string*, const Image*>{&item.label, &label}, {&item.instance, &inst}}) {
      ENGINE_CHECK(im->height == image.height && im->width == image.width, "--data: ", *what, " is ", im->width, "x",
                   im->height, " but its image ", item.image, " is ", image.width, "x", image.height);
      ENGINE_CHECK(im->channels == 1, "--data: ", *what, " has ", im->channels,
                   " channels; a label or instance map is a grey PNG");
    }
    std::mt19937_64 rng = item_rng(seed, (step - 1) * n + j);
    const bool flip = uniform01(rng) < 0.5;
    float* lab = b.labels.data() + j * pixels;
    float* ins = b.instances.data() + j * pixels;
    float* img = b.images.data() + j * pixels * 3;
    for (int64_t y = 0; y < height; y++) {
      const int64_t sy = resize_nearest(y, image.height, height);
      for (int64_t x = 0; x < width; x++) {
        const int64_t ox = flip ? width - 1 - x : x;  // the output column this source column lands in
        const int64_t sx = resize_nearest(x, image.width, width);
        const uint32_t id = label.value(sy, sx);
        ENGINE_CHECK(int64_t(id) < classes_, "--data: ", item.label, " has label id ", id, " at (", sx, ", ", sy,
                     "); the model has ", classes_, " classes (ids 0 to ", classes_ - 1, ")");
        lab[y * width + ox] = float(id);
        ins[y * width + ox] = float(inst.value(sy, sx));
      }
    }
    resample_rgb(image, height, width, flip, img);
  });
  return b;
}

}  // namespace models::data
