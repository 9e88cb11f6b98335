// detection.cpp: reading a COCO-style instances JSON, decoding its images and ultralytics' letterbox + flip.
#include "models/data/detection.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "engine/error.h"
#include "engine/io.h"
#include "engine/json.h"

namespace models::data {

namespace fs = std::filesystem;
using engine::json::Value;

// ---------------------------------------------------------------------------------------------------
// Transform

Letterbox letterbox_geometry(int64_t h, int64_t w, int64_t size) {
  const double r = std::min(double(size) / double(h), double(size) / double(w));
  Letterbox g;
  g.new_w = std::min<int64_t>(size, std::llround(double(w) * r));
  g.new_h = std::min<int64_t>(size, std::llround(double(h) * r));
  // Python's round(dh - 0.1): dh is a multiple of 0.5, so dh - 0.1 is never a tie and llround agrees.
  g.top = std::llround(double(size - g.new_h) / 2.0 - 0.1);
  g.left = std::llround(double(size - g.new_w) / 2.0 - 0.1);
  return g;
}

void apply_letterbox(const Image& image, const Letterbox& g, int64_t size, bool flip, float* out) {
  for (int64_t y = 0; y < size; y++)
    for (int64_t x = 0; x < size; x++) {
      float* pixel = out + (y * size + x) * 3;    // [3]
      const int64_t lx = flip ? size - 1 - x : x;  // the column of the unflipped letterbox
      const int64_t ry = y - g.top, rx = lx - g.left;  // in the resized image
      const bool inside = ry >= 0 && ry < g.new_h && rx >= 0 && rx < g.new_w;
      for (int64_t c = 0; c < 3; c++)
        pixel[c] = imagenet_normalize(inside ? sample_bilinear(image, resize_source(ry, image.height, g.new_h),
                                                               resize_source(rx, image.width, g.new_w), c)
                                             : 127.5f,  // grey 0.5
                                      c);
    }
}

std::array<float, 4> letterbox_box(const DetectionBox& b, int64_t h, int64_t w, const Letterbox& g, int64_t size,
                                   bool flip) {
  const double sx = double(g.new_w) / double(w), sy = double(g.new_h) / double(h), s = double(size);
  const double cx = (double(b.x) + double(b.w) / 2) * sx + double(g.left);
  const double cy = (double(b.y) + double(b.h) / 2) * sy + double(g.top);
  return {float((flip ? s - cx : cx) / s), float(cy / s), float(double(b.w) * sx / s), float(double(b.h) * sy / s)};
}

// ---------------------------------------------------------------------------------------------------
// Reading the JSON

namespace {

using engine::json::member;

// A COCO id, size or count: a whole number in int64's positive range (a JSON number is a double).
int64_t integer(const Value& v, const char* key, const std::string& where) {
  return engine::json::integer_member(v, key, 0, int64_t(1) << 53, where);
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

DetectionSet::DetectionSet(const std::string& dir, int64_t classes, int64_t max_boxes)
    : dir_(dir), max_boxes_(max_boxes) {
  const char* layout = "a COCO-style set has annotations/instances_<split>.json and its images in <split>/";
  ENGINE_CHECK(fs::is_directory(dir), "--data '", dir, "': no such directory (", layout, ")");
  const fs::path annotations = fs::path(dir) / "annotations";
  ENGINE_CHECK(fs::is_directory(annotations), "--data '", dir, "': missing the sub-directory annotations/ (", layout,
               ")");
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(annotations)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("instances_", 0) == 0 && entry.path().extension() == ".json") found.push_back(name);
  }
  std::sort(found.begin(), found.end());
  ENGINE_CHECK(found.size() == 1, "--data '", dir, "': expected exactly one annotations/instances_<split>.json, found ",
               found.size(), found.empty() ? "" : ": " + join(found),
               found.empty() ? "" : " (keep one: the split to train on)");
  json_path_ = (annotations / found[0]).string();
  const std::string split = found[0].substr(10, found[0].size() - 10 - 5);  // instances_<split>.json
  const fs::path image_dir = fs::path(dir) / split;
  ENGINE_CHECK(fs::is_directory(image_dir), "--data '", dir, "': missing the image directory ", split, "/ that ",
               found[0], " names (", layout, ")");

  const std::string source = "COCO file '" + json_path_ + "'";
  const Value root = engine::json::parse_json(engine::read_file(json_path_, "COCO file", 4 * engine::kGiB), source);
  ENGINE_CHECK(root.is_object(), source, ": the top level must be an object with images, annotations, categories");

  // Categories: ascending ids -> 0..K-1.
  const Value& categories = member(root, "categories", Value::Type::array, source);
  for (size_t k = 0; k < categories.items.size(); k++)
    category_ids_.push_back(integer(categories.items[k], "id", engine::str(source, ": categories[", k, "]")));
  std::sort(category_ids_.begin(), category_ids_.end());
  ENGINE_CHECK(int64_t(category_ids_.size()) == classes, source, " has ", category_ids_.size(),
               " categories but the model has ", classes, " classes: use a --size whose classes match the set");
  std::map<int64_t, int64_t> class_of;
  for (size_t k = 0; k < category_ids_.size(); k++) class_of[category_ids_[k]] = int64_t(k);

  const Value& images = member(root, "images", Value::Type::array, source);
  std::unordered_map<int64_t, size_t> item_of;  // COCO image id -> items_ index
  for (size_t i = 0; i < images.items.size(); i++) {
    const Value& im = images.items[i];
    const std::string where = engine::str(source, ": images[", i, "]");
    DetectionItem item;
    item.file = (image_dir / member(im, "file_name", Value::Type::string, where).text).string();
    item.width = integer(im, "width", where), item.height = integer(im, "height", where);
    ENGINE_CHECK(item.width > 0 && item.height > 0 && item.width <= 65535 && item.height <= 65535, where,
                 ": width and height must be from 1 to 65535 pixels (JPEG's limit), got ", item.width, "x",
                 item.height);
    ENGINE_CHECK(fs::is_regular_file(item.file), where, " names '", item.file, "', which does not exist: add it or ",
                 "remove the image from the JSON");
    item_of[integer(im, "id", where)] = items_.size();
    items_.push_back(std::move(item));
  }
  ENGINE_CHECK(!items_.empty(), source, ": no images");

  const Value& annotation_list = member(root, "annotations", Value::Type::array, source);
  int64_t clipped = 0, emptied = 0, crowds = 0, dropped = 0, crowded_images = 0;
  std::vector<int64_t> boxes_seen(items_.size());
  for (size_t a = 0; a < annotation_list.items.size(); a++) {
    const Value& an = annotation_list.items[a];
    const std::string where = engine::str(source, ": annotations[", a, "]");
    const Value* crowd = an.find("iscrowd");
    if (crowd && crowd->is_number() && crowd->number != 0) {
      crowds++;
      continue;
    }
    const int64_t image_id = integer(an, "image_id", where), category = integer(an, "category_id", where);
    auto item_it = item_of.find(image_id);
    ENGINE_CHECK(item_it != item_of.end(), where, ": image_id ", image_id, " is not in images[]");
    auto class_it = class_of.find(category);
    ENGINE_CHECK(class_it != class_of.end(), where, ": category_id ", category, " is not in categories[]");
    const Value& bbox = member(an, "bbox", Value::Type::array, where);
    ENGINE_CHECK(bbox.items.size() == 4, where, ".bbox has ", bbox.items.size(), " numbers, expected [x, y, w, h]");
    double v[4];
    for (int k = 0; k < 4; k++) {
      ENGINE_CHECK(bbox.items[size_t(k)].is_number(), where, ".bbox[", k, "] is not a number");
      v[k] = bbox.items[size_t(k)].number;
      ENGINE_CHECK(std::isfinite(v[k]) && std::fabs(v[k]) <= 1e9, where, ".bbox[", k, "] is ",
                   bbox.items[size_t(k)].text, ": a box coordinate must be a finite number of pixels");
    }
    ENGINE_CHECK(v[2] >= 0 && v[3] >= 0, where, ".bbox is [", v[0], ", ", v[1], ", ", v[2], ", ", v[3],
                 "]: COCO boxes are [x, y, width, height] with width and height >= 0");
    DetectionItem& item = items_[item_it->second];
    // Clipped to the image: [x0, x1) x [y0, y1).
    const double x0 = std::clamp(v[0], 0.0, double(item.width)), x1 = std::clamp(v[0] + v[2], 0.0, double(item.width));
    const double y0 = std::clamp(v[1], 0.0, double(item.height)),
                 y1 = std::clamp(v[1] + v[3], 0.0, double(item.height));
    if (x0 != v[0] || y0 != v[1] || x1 != v[0] + v[2] || y1 != v[1] + v[3]) clipped++;
    if (x1 <= x0 || y1 <= y0) {
      emptied++;
      continue;
    }
    if (++boxes_seen[item_it->second] > max_boxes) {
      dropped++;
      if (boxes_seen[item_it->second] == max_boxes + 1) crowded_images++;
      continue;
    }
    DetectionBox box{float(x0), float(y0), float(x1 - x0), float(y1 - y0), class_it->second, {}};
    // Polygons (a list of lists); an RLE object or no segmentation leaves none.
    const Value* segmentation = an.find("segmentation");
    if (segmentation && segmentation->type == Value::Type::array)
      for (size_t k = 0; k < segmentation->items.size(); k++) {
        const Value& polygon = segmentation->items[k];
        const std::string at = engine::str(where, ".segmentation[", k, "]");
        ENGINE_CHECK(polygon.type == Value::Type::array && polygon.items.size() >= 6 && polygon.items.size() % 2 == 0,
                     at, " must be a polygon [x0, y0, x1, y1, ...] of at least 3 points, got ",
                     polygon.type == Value::Type::array ? engine::str(polygon.items.size(), " numbers") : "no list");
        std::vector<float> xy;
        for (const Value& v : polygon.items) {
          ENGINE_CHECK(v.is_number() && std::isfinite(v.number) && std::fabs(v.number) <= 1e9, at,
                       ": a polygon coordinate must be a finite number of pixels, got '", v.text, "'");
          xy.push_back(float(v.number));
        }
        box.polygons.push_back(std::move(xy));
      }
    item.boxes.push_back(std::move(box));
  }
  if (crowds) notes_.push_back(engine::str(crowds, " iscrowd boxes skipped"));
  if (clipped)
    notes_.push_back(engine::str(clipped, " boxes reached outside their image and were clipped to it",
                                 emptied ? engine::str(" (", emptied, " had nothing left and were dropped)") : ""));
  if (dropped)
    notes_.push_back(engine::str(crowded_images, " images have more than ", max_boxes, " boxes: the first ", max_boxes,
                                 " kept, ", dropped, " boxes dropped"));
}

std::string DetectionSet::describe() const {
  int64_t boxes = 0, empty = 0;
  for (const auto& item : items_) boxes += int64_t(item.boxes.size()), empty += item.boxes.empty();
  std::string out = engine::str("COCO-style '", json_path_, "': ", items_.size(), " images (", empty,
                                " without boxes), ", boxes, " boxes");
  for (const auto& note : notes_) out += "; " + note;
  return out;
}

Image DetectionSet::load(int64_t i) const {
  const DetectionItem& item = items_[size_t(i)];
  Image image = to_rgb(read_image(item.file));
  ENGINE_CHECK(image.width == item.width && image.height == item.height, "image '", item.file, "' decodes to ",
               image.width, "x", image.height, " but '", json_path_, "' says ", item.width, "x", item.height,
               ": fix the JSON's width and height (the boxes are in its pixels)");
  return image;
}

std::shared_ptr<const DetectionSet> DetectionSet::open_shared(const std::string& dir, int64_t classes,
                                                             int64_t max_boxes) {
  static std::map<std::tuple<std::string, int64_t, int64_t>, std::shared_ptr<const DetectionSet>> opened;
  static std::mutex lock;
  std::lock_guard<std::mutex> hold(lock);
  auto& set = opened[{dir, classes, max_boxes}];
  if (!set) set = std::make_shared<const DetectionSet>(dir, classes, max_boxes);  // an Error leaves no entry set
  return set;
}

void DetectionSet::each_item(int64_t n, uint64_t seed, int64_t step,
                             const std::function<void(int64_t, const DetectionItem&, const Image&, bool)>& f) const {
  const int64_t first = std::max<int64_t>(step - 1, 0) * n;
  const std::vector<int64_t> ids = order_.items(first, n, this->size(), seed);
  parallel_for(n, [&](int64_t j) {
    const int64_t i = ids[size_t(j)];
    std::mt19937_64 rng = item_rng(seed, first + j);
    const bool flip = uniform01(rng) < 0.5;
    f(j, items_[size_t(i)], load(i), flip);
  });
}

DetectionData DetectionSet::batch(int64_t n, int64_t size, uint64_t seed, int64_t step) const {
  DetectionData b;
  b.images.resize(size_t(n * size * size * 3));
  b.boxes.assign(size_t(n * max_boxes_ * 4), 0.f);
  b.labels.assign(size_t(n * max_boxes_), -1);
  each_item(n, seed, step, [&](int64_t j, const DetectionItem& item, const Image& image, bool flip) {
    const Letterbox g = letterbox_geometry(image.height, image.width, size);
    apply_letterbox(image, g, size, flip, b.images.data() + j * size * size * 3);
    for (size_t m = 0; m < item.boxes.size(); m++) {
      const auto box = letterbox_box(item.boxes[m], image.height, image.width, g, size, flip);
      std::copy(box.begin(), box.end(), b.boxes.begin() + (j * max_boxes_ + int64_t(m)) * 4);
      b.labels[size_t(j * max_boxes_) + m] = item.boxes[m].label;
    }
  });
  return b;
}

// ---------------------------------------------------------------------------------------------------
// Instance segmentation (Mask R-CNN)

std::array<int64_t, 2> instance_resize(int64_t h, int64_t w, int64_t min_size, int64_t max_size) {
  // torchvision: scale = min(min_size / short side, max_size / long side), then F.interpolate(scale_factor=scale,
  // recompute_scale_factor=True): floor(side * scale), the scale and the product in f32 as torch computes them
  // (480 x 800/480 is 799.99998 in f64 but 800 in f32: torchvision gives 800).
  const float scale = std::min(float(min_size) / float(std::min(h, w)), float(max_size) / float(std::max(h, w)));
  const float rh = float(h) * scale, rw = float(w) * scale;
  return {std::max<int64_t>(1, int64_t(std::floor(rh))), std::max<int64_t>(1, int64_t(std::floor(rw)))};
}

std::array<int64_t, 2> instance_fit(int64_t h, int64_t w, const InstanceGeometry& g) {
  std::array<int64_t, 2> size = instance_resize(h, w, g.min_size, g.max_size);
  if (size[0] <= g.padded_h && size[1] <= g.padded_w) return size;
  // Larger than the batch's fixed size (a portrait image on a landscape canvas): the largest that fits instead.
  const float scale = std::min(float(g.padded_h) / float(h), float(g.padded_w) / float(w));
  const float rh = float(h) * scale, rw = float(w) * scale;
  return {std::min(g.padded_h, std::max<int64_t>(1, int64_t(std::floor(rh)))),
          std::min(g.padded_w, std::max<int64_t>(1, int64_t(std::floor(rw))))};
}

namespace {

// Polygon k of an object under the limits: the first `parts` polygons, each thinned to at most `vertices` points.
std::vector<float> limited_polygon(const std::vector<float>& xy, int64_t vertices) {
  const int64_t n = int64_t(xy.size() / 2);
  if (n <= vertices) return xy;
  std::vector<float> out;
  for (int64_t k = 0; k < vertices; k++) {
    const int64_t i = k * n / vertices;
    out.insert(out.end(), {xy[size_t(2 * i)], xy[size_t(2 * i + 1)]});
  }
  return out;
}

}  // namespace

std::string DetectionSet::instance_notes(const InstanceGeometry& g) const {
  int64_t cut = 0, thinned = 0, none = 0, fitted = 0;
  for (const auto& item : items_) {
    fitted +=
        instance_fit(item.height, item.width, g) != instance_resize(item.height, item.width, g.min_size, g.max_size);
    for (const auto& box : item.boxes) {
      none += box.polygons.empty();
      cut += int64_t(box.polygons.size()) > g.parts;
      for (const auto& p : box.polygons) thinned += int64_t(p.size() / 2) > g.vertices;
    }
  }
  std::string out;
  auto add = [&](int64_t count, const std::string& what) {
    if (count) out += (out.empty() ? "" : "; ") + engine::str(count, " ", what);
  };
  add(cut, engine::str("objects with more than ", g.parts, " polygons (the first ", g.parts, " kept)"));
  add(thinned, engine::str("polygons of more than ", g.vertices, " points (thinned to ", g.vertices, ")"));
  add(none, "objects without polygons (their box is their mask)");
  add(fitted, engine::str("images resized to fit the batch's ", g.padded_h, "x", g.padded_w, " instead (portrait)"));
  return out;
}

InstanceData DetectionSet::instance_batch(int64_t n, const InstanceGeometry& g, uint64_t seed, int64_t step) const {
  const int64_t H = g.padded_h, W = g.padded_w, G = g.truths, P = g.parts, V = g.vertices;
  InstanceData b;
  b.images.assign(size_t(n * H * W * 3), 0.f);
  b.image_hw.assign(size_t(n * 2), 0.f);
  b.boxes.assign(size_t(n * G * 4), 0.f);
  b.labels.assign(size_t(n * G), 0);
  b.valid.assign(size_t(n * G), 0.f);
  b.polygons.assign(size_t(n * G * P * V * 2), 0.f);
  b.counts.assign(size_t(n * G * P), 0);
  each_item(n, seed, step, [&](int64_t j, const DetectionItem& item, const Image& image, bool flip) {
    const auto [rh, rw] = instance_fit(image.height, image.width, g);
    b.image_hw[size_t(j * 2)] = float(rh), b.image_hw[size_t(j * 2 + 1)] = float(rw);
    float* out = b.images.data() + j * H * W * 3;
    for (int64_t y = 0; y < rh; y++)
      for (int64_t x = 0; x < rw; x++) {
        const int64_t sx = flip ? rw - 1 - x : x;  // the flip before the resize, as the references order them
        for (int64_t c = 0; c < 3; c++)
          out[(y * W + x) * 3 + c] = imagenet_normalize(
              sample_bilinear(image, resize_source(y, image.height, rh), resize_source(sx, image.width, rw), c), c);
      }
    const double fx = double(rw) / double(image.width), fy = double(rh) / double(image.height);
    auto map_x = [&](double x) { return float(flip ? double(rw) - x * fx : x * fx); };
    auto map_y = [&](double y) { return float(y * fy); };
    for (size_t m = 0; m < item.boxes.size() && int64_t(m) < G; m++) {
      const DetectionBox& box = item.boxes[m];
      const size_t slot = size_t(j * G) + m;
      const float x1 = map_x(box.x), x2 = map_x(double(box.x) + double(box.w));
      float* bx = b.boxes.data() + slot * 4;
      bx[0] = std::min(x1, x2), bx[1] = map_y(box.y), bx[2] = std::max(x1, x2), bx[3] = map_y(double(box.y) + box.h);
      b.labels[slot] = box.label + 1;
      b.valid[slot] = 1.f;
      std::vector<std::vector<float>> polygons = box.polygons;
      if (polygons.empty())  // no polygon: the box is the mask
        polygons.push_back({box.x, box.y, box.x + box.w, box.y, box.x + box.w, box.y + box.h, box.x, box.y + box.h});
      for (int64_t p = 0; p < P && p < int64_t(polygons.size()); p++) {
        const std::vector<float> xy = limited_polygon(polygons[size_t(p)], V);
        b.counts[slot * size_t(P) + size_t(p)] = int64_t(xy.size() / 2);
        float* v = b.polygons.data() + (slot * size_t(P) + size_t(p)) * size_t(V) * 2;
        for (size_t k = 0; k < xy.size() / 2; k++) v[2 * k] = map_x(xy[2 * k]), v[2 * k + 1] = map_y(xy[2 * k + 1]);
      }
    }
  });
  return b;
}

}  // namespace models::data
