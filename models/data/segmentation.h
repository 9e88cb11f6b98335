// segmentation.h: a PASCAL VOC-style semantic segmentation set (--data DIR for deeplabv3) and its training
// transform, jfzhang95/pytorch-deeplab-xception's VOC recipe (dataloaders/datasets/pascal.py, custom_transforms.py).
//
//   layout     DIR/JPEGImages/<id>.jpg, DIR/SegmentationClass/<id>.png (a palette PNG, whose indices are the
//              classes, or a grey PNG; 255 = ignore), ids from DIR/ImageSets/Segmentation/train.txt, else
//              every PNG in SegmentationClass (sorted). Opening checks the layout and that every listed id has
//              both files; decoding (per batch) checks the pixels: a label value >= classes other than 255,
//              or an image and a label map of different sizes, is an Error naming the file.
//   transform  RandomHorizontalFlip (p 0.5) -> RandomScaleCrop(base_size, crop_size, fill 255): the short side
//              is scaled to randint(base/2, 2 base) (the long side int(long * short_new / short)), bilinear for
//              the image and nearest for the label map, padded at the right and bottom to crop_size (image 0,
//              label 255), then a random crop_size square -> Normalize with ImageNet's mean and std (x / 255 -
//              mean) / std. RandomGaussianBlur (p 0.5 in the recipe) is left out. base = crop = the model's
//              image size (513 for voc, 64 for tiny). Bilinear is pixel-centre bilinear without PIL's
//              antialiasing filter when shrinking (image_io.h).
//   order      an epoch is a permutation of the ids seeded by (seed, epoch); step k >= 1 takes positions
//              (k - 1) N ... k N - 1 of the endless sequence of epochs; each image's random draws come from its
//              own generator seeded by (seed, position), so a batch does not depend on the decoding threads.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "models/data/image_io.h"

namespace models::data {

// The random draws of one RandomHorizontalFlip + RandomScaleCrop.
struct ScaleCrop {
  bool flip = false;
  int64_t scaled_h = 0, scaled_w = 0;  // the image's size after the random scale
  int64_t top = 0, left = 0;           // the crop's corner in the scaled (and padded) image
};
// The draws for an h x w image, in the recipe's order (flip, short side, crop x, crop y).
ScaleCrop draw_scale_crop(int64_t h, int64_t w, int64_t base, int64_t crop, std::mt19937_64& rng);
// Applies `t` to an RGB image and its label map (same size): writes the normalized crop [crop, crop, 3] and
// its labels [crop, crop] (ignore_index in the padding).
void apply_scale_crop(const Image& image, const Image& label, const ScaleCrop& t, int64_t crop, int64_t ignore_index,
                      float* out_image, int64_t* out_labels);

struct SegmentationData {
  std::vector<float> images;    // [N, S, S, 3] normalized
  std::vector<int64_t> labels;  // [N * S * S] class or ignore_index
};

class SegmentationSet {
 public:
  // Opens and checks DIR (not the pixels: see the file comment).
  SegmentationSet(const std::string& dir, int64_t classes, int64_t ignore_index = 255);
  int64_t size() const { return int64_t(ids_.size()); }
  const std::vector<std::string>& ids() const { return ids_; }
  std::string image_path(int64_t i) const;
  std::string label_path(int64_t i) const;
  // Decodes item i: RGB image and label map (values checked against the classes).
  void load(int64_t i, Image& image, Image& label) const;
  // Step `step`'s batch of n crops of `size` pixels (base size = crop size = size).
  SegmentationData batch(int64_t n, int64_t size, uint64_t seed, int64_t step) const;
  std::string describe() const;  // for the model's summary line

 private:
  std::string dir_, ids_source_;
  int64_t classes_, ignore_index_;
  std::vector<std::string> ids_;
  mutable EpochOrder order_;  // batch() is const: the cached epoch permutation is not the set's state
};

}  // namespace models::data
