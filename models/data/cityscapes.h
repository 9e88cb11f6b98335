// cityscapes.h: Cityscapes-style label-to-image triples for pix2pixhd (--data DIR), read as pix2pixHD's aligned data
// set reads them (data/aligned_dataset.py, data/base_dataset.py with --resize_or_crop scale_width).
//
//   layout     any folders under DIR holding, for each image, three PNGs named by one key: <key>_leftImg8bit.png
//              (RGB), <key>*_labelIds.png (8-bit grey: class ids, each below the model's label count) and
//              <key>*_instanceIds.png (8- or 16-bit grey: Cityscapes' instance ids, class * 1000 + k for objects,
//              the class id for stuff; kept whole). Cityscapes itself: leftImg8bit/<split>/<city>/<key>_leftImg8bit.png
//              beside gtFine/<split>/<city>/<key>_gtFine_labelIds.png and _instanceIds.png, so DIR may be the
//              data set's root or one split. Opening lists DIR recursively (keys sorted) and checks every image has
//              exactly one label map and one instance map; decoding (per batch) checks the pixels: a label id at or
//              above the label count, or three files of different sizes, is an Error naming the file.
//   transform  each resized to the model's W x H (nearest for both maps, pixel-centre bilinear for the image:
//              image_io.h; none at Cityscapes' own 2048 x 1024, pix2pixHD's 1024p), flipped left to right with
//              probability 0.5 (all three alike), the image mapped to [-1, 1] by v / 127.5 - 1 (image_io.h's
//              resample_rgb).
//   order      an epoch is a permutation of the keys seeded by (seed, epoch); step k >= 1 takes positions
//              (k - 1) N ... k N - 1 of the endless sequence of epochs; item i's flip is the first draw of its own
//              generator item_rng(seed, position), so a batch does not depend on the decoding threads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/data/image_io.h"

namespace models::data {

// One batch, NHWC floats: labels and instances [N, H, W, 1] (ids), images [N, H, W, 3] in [-1, 1].
struct CityscapesBatch {
  std::vector<float> labels, instances, images;
};

class CityscapesSet {
 public:
  // Opens and checks DIR (not the pixels: see the file comment); `classes` is the model's label count.
  CityscapesSet(const std::string& dir, int64_t classes);
  int64_t size() const { return int64_t(keys_.size()); }
  const std::vector<std::string>& keys() const { return keys_; }
  // Step `step`'s batch of n triples at height x width.
  CityscapesBatch batch(int64_t n, int64_t height, int64_t width, uint64_t seed, int64_t step) const;
  std::string describe() const;  // for the model's summary line

 private:
  struct Item {
    std::string image, label, instance;  // paths
  };
  std::string dir_;
  int64_t classes_;
  std::vector<std::string> keys_;
  std::vector<Item> items_;
  mutable EpochOrder order_;
};

}  // namespace models::data
