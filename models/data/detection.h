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
//
// Instance segmentation (maskrcnn --data): each box also keeps its annotation's polygons (segmentation's lists of
// x0, y0, x1, y1, ... in pixels; a list of fewer than 3 points or a non-finite number is an Error naming it; an
// RLE segmentation, or none, leaves the object without polygons, and its box is then its mask: counted in
// notes()). instance_batch transforms as torchvision's detection references do: a horizontal flip with p 0.5,
// then GeneralizedRCNNTransform: ImageNet normalization, a bilinear resize by s = min(min_size / min(h, w),
// max_size / max(h, w)) to floor(h s) x floor(w s) (pixel-centre), zero padding below and to the right up to the
// batch's fixed size. Boxes (x1, y1, x2, y2) and polygons follow the pixels. An object keeps its first `parts`
// polygons, each at most `vertices` points (a longer one keeps points floor(k n / vertices)): counted in
// instance_notes().
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/data/image_io.h"

namespace models::data {

struct DetectionBox {
  float x = 0, y = 0, w = 0, h = 0;  // top-left corner and size in the original image's pixels (clipped)
  int64_t label = 0;                 // 0..K-1
  std::vector<std::vector<float>> polygons;  // x0, y0, x1, y1, ... each (original pixels); empty: none given
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

// Mask R-CNN's batch (instance_batch): G truth slots, P polygons of V vertices per truth.
struct InstanceGeometry {
  int64_t min_size = 800, max_size = 1333;  // the resize
  int64_t padded_h = 800, padded_w = 1344;  // the batch's one size (at least the largest resized image)
  int64_t truths = 100, parts = 4, vertices = 64;
};
struct InstanceData {
  std::vector<float> images;    // [N, padded_h, padded_w, 3], normalized, zero padding
  std::vector<float> image_hw;  // [N, 2]: each resized image's height and width
  std::vector<float> boxes;     // [N, G, 4] (x1, y1, x2, y2) resized pixels; 0 in padding
  std::vector<int64_t> labels;  // [N, G] class + 1 (0 is the background); 0 in padding
  std::vector<float> valid;     // [N, G] 1 for a truth, 0 for padding
  std::vector<float> polygons;  // [N, G, P, V, 2]
  std::vector<int64_t> counts;  // [N, G, P] vertices per polygon (0: none)
};
// The resized size of an h x w image (torchvision's GeneralizedRCNNTransform.resize), and the size instance_batch
// uses: that one, unless it exceeds the batch's fixed padded size (a portrait image on a landscape canvas: COCO's
// 640 x 427 fits, 427 x 640 would be 1199 x 800), then the largest floor(side s) that fits, s = min(padded_h / h,
// padded_w / w): one fixed size for every batch, so that memory does not depend on the images.
std::array<int64_t, 2> instance_resize(int64_t h, int64_t w, int64_t min_size, int64_t max_size);
std::array<int64_t, 2> instance_fit(int64_t h, int64_t w, const InstanceGeometry& g);

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
  InstanceData instance_batch(int64_t n, const InstanceGeometry& g, uint64_t seed, int64_t step) const;
  // What instance_batch leaves out of the set under g's limits ("" when nothing): objects whose polygons were cut to
  // g.parts or thinned to g.vertices, and objects with no polygon (their box is their mask).
  std::string instance_notes(const InstanceGeometry& g) const;
  std::string describe() const;  // for the model's summary line: the set, its counts and notes

 private:
  // Item j < n of step `step`'s batch, decoded, with its flip (p 0.5 from the item's own generator), in parallel:
  // the order and the draws both batch functions share.
  void each_item(int64_t n, uint64_t seed, int64_t step,
                 const std::function<void(int64_t j, const DetectionItem&, const Image&, bool flip)>& f) const;
  std::string dir_, json_path_;
  int64_t max_boxes_;
  std::vector<DetectionItem> items_;
  std::vector<int64_t> category_ids_;
  std::vector<std::string> notes_;
  mutable EpochOrder order_;  // batch() is const: the cached epoch permutation is not the set's state
};

}  // namespace models::data
