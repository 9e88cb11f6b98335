// detection.h: a COCO-style detection set (--data DIR for yolov3) and its letterbox transform, as
// ultralytics/yolov3 prepares training images (utils/datasets.py: letterbox, then a random left-right flip).
//
//   layout     DIR/annotations/instances_<split>.json (exactly one such file) and the images under DIR/<split>/
//              (the JSON's file_name). The JSON's images[] {id, file_name, width, height}, annotations[]
//              {image_id, category_id, bbox [x, y, w, h] in pixels, iscrowd} and categories[] {id} are read
//              with engine/json.h; a syntax error, a missing or mistyped key, an unknown image or category id
//              is an Error naming the file and the entry. Categories map to 0..K-1 in ascending id order and
//              K must equal the model's classes. iscrowd boxes are skipped; a box reaching outside its image is
//              clipped to it (and dropped if nothing is left); an image with more than max_boxes boxes keeps
//              the first max_boxes; images without boxes are used too. What was clipped or dropped is
//              counted once, in notes() (the model's summary line shows them).
//   transform  letterbox to S x S: scale r = min(S / h, S / w), resized to round(w r) x round(h r) (bilinear,
//              pixel-centre; ultralytics uses OpenCV's INTER_LINEAR or INTER_AREA), centred with the padding
//              split as ultralytics (top = round(dh - 0.1), left = round(dw - 0.1)) and filled with grey 0.5;
//              then a horizontal flip with p 0.5 (cx -> 1 - cx). Pixels: ImageNet normalization, as the
//              segmentation set (image_io.h). Boxes follow the pixels exactly: x * (new_w / w) + left.
//   output     images [N, S, S, 3], boxes [N, max_boxes, 4] (cx, cy, w, h as fractions of S; 0 in padded
//              slots), labels [N, max_boxes] (class, or -1 in padded slots): what yolov3's make_batch makes.
//   order      as the segmentation set: seeded epochs, step k >= 1 takes positions (k - 1) N ... k N - 1, each
//              item's flip drawn from its own generator. Decoding checks the image's size against the JSON.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/data/image_io.h"

namespace models::data {

struct DetectionBox {
  float x = 0, y = 0, w = 0, h = 0;  // top-left corner and size in the original image's pixels (clipped)
  int64_t label = 0;                 // 0..K-1
};

struct DetectionItem {
  std::string file;  // DIR/<split>/<file_name>
  int64_t width = 0, height = 0;
  std::vector<DetectionBox> boxes;  // at most max_boxes, crowds left out
};

// Where an h x w image lands in an S x S letterbox.
struct Letterbox {
  int64_t new_h = 0, new_w = 0, top = 0, left = 0;
};
Letterbox letterbox_geometry(int64_t h, int64_t w, int64_t size);
// Writes the normalized letterboxed image [size, size, 3], mirrored left-right when `flip`.
void apply_letterbox(const Image& image, const Letterbox& g, int64_t size, bool flip, float* out);
// A box of an h x w image as (cx, cy, w, h) fractions of the letterboxed (and maybe flipped) image.
std::array<float, 4> letterbox_box(const DetectionBox& box, int64_t h, int64_t w, const Letterbox& g, int64_t size,
                                   bool flip);

struct DetectionData {
  std::vector<float> images, boxes;  // [N, S, S, 3], [N, max_boxes, 4]
  std::vector<int64_t> labels;       // [N, max_boxes]
};

class DetectionSet {
 public:
  // Opens DIR, reads and checks the JSON and that every image file exists (the pixels are read per batch).
  DetectionSet(const std::string& dir, int64_t classes, int64_t max_boxes = 100);
  // The set for (dir, classes, max_boxes), opened once per process and shared: COCO's instances JSON takes
  // seconds and GiBs to parse (136 MB: 6 s, 1.5 GiB here), and a max-batch search builds the model once per probe.
  static std::shared_ptr<const DetectionSet> open_shared(const std::string& dir, int64_t classes, int64_t max_boxes);
  int64_t size() const { return int64_t(items_.size()); }
  const std::vector<DetectionItem>& items() const { return items_; }
  const std::vector<int64_t>& category_ids() const { return category_ids_; }  // class k's COCO id
  const std::vector<std::string>& notes() const { return notes_; }
  // Item i decoded as RGB; a size other than the JSON's is an Error.
  Image load(int64_t i) const;
  DetectionData batch(int64_t n, int64_t size, uint64_t seed, int64_t step) const;
  std::string describe() const;  // for the model's summary line: the set, its counts and notes

 private:
  std::string dir_, json_path_;
  int64_t max_boxes_;
  std::vector<DetectionItem> items_;
  std::vector<int64_t> category_ids_;
  std::vector<std::string> notes_;
  mutable EpochOrder order_;  // batch() is const: the cached epoch permutation is not the set's state
};

}  // namespace models::data
