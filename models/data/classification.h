// classification.h: an ImageNet-style image classification set (--data DIR for nasnet_large) and its training
// transform, torchvision's ImageNet recipe (RandomResizedCrop, RandomHorizontalFlip) with the [-1, 1]
// normalization of slim's inception preprocessing and timm's config for nasnetalarge (mean 0.5, std 0.5).
//
//   layout     torchvision's ImageFolder: DIR/<class>/<image>. The classes are DIR's sub-directories, sorted by
//              name as byte strings (ImageFolder's sorted()); the images are the entries of each class folder
//              whose names end in .jpg, .jpeg or .png (any case; read by their signature, as read_image does),
//              sorted by name; items are (path, class) with the classes in order. Hidden entries (a leading '.')
//              are ignored, class folders included (ImageFolder would make ".ipynb_checkpoints" a class), and so
//              are other files and anything nested deeper (ImageFolder walks sub-folders of a class; ImageNet's
//              train/ has none). Opening checks the layout, not the pixels: no directory, no class folder, or a
//              class folder without an image is an Error naming the directory and the layout expected; a file
//              that is not a readable JPEG or PNG is an Error naming it when a batch decodes it.
//   labels     the class folder's index, plus 1 when the model has exactly one more class than there are folders:
//              slim's ImageNet models have 1001 classes, 0 being "background", a class no image has. More folders
//              than the model's classes is an Error naming both counts; fewer is allowed (a small sample for a
//              1000-class model: its other classes are never a target).
//   transform  RandomResizedCrop(S, scale (0.08, 1), ratio (3/4, 4/3)) -> RandomHorizontalFlip(0.5) -> the
//              values (v / 255 - 0.5) / 0.5, in [-1, 1]. The crop is torchvision's get_params: up to 10 attempts of
//              target area = H W uniform(0.08, 1) and aspect = exp(uniform(log 3/4, log 4/3)), w = round(sqrt(area
//              aspect)), h = round(sqrt(area / aspect)) (round half to even, as Python), taken when 0 < w <= W and
//              0 < h <= H, at top = randint(0, H - h), left = randint(0, W - w); after 10 failures the central crop
//              of the whole image clamped to the ratio range (resized_crop_fallback). The crop is resized to S x S
//              by pixel-centre bilinear sampling of the crop (its edges clamped) without antialiasing when it
//              shrinks (torchvision's PIL and tensor paths antialias; image_io.h). Draws, all from the item's own
//              generator, in this order: per attempt uniform01 for the area, then for the log-ratio; on success
//              randint for top, then for left (rng() % range, as segmentation.cpp's); last uniform01 < 0.5 for the
//              flip. uniform01 is 53-bit (image_io.h), so no standard library's distributions are involved.
//   output     images [N, S, S, 3] (NHWC, as the other vision sets), labels [N].
//   order      as the segmentation set: an epoch is a permutation of the items seeded by (seed, epoch); step k >= 1
//              takes positions (k - 1) N ... k N - 1 of the endless sequence of epochs; each image's draws come from
//              item_rng(seed, position), and images decode in parallel, so a batch does not depend on the threads.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "models/data/image_io.h"

namespace models::data {

// The normalization of slim's inception preprocessing (timm's nasnetalarge: mean = std = 0.5 per channel).
constexpr float kInceptionMean = 0.5f, kInceptionStd = 0.5f;
inline float inception_normalize(float value_0_255) { return (value_0_255 / 255.f - kInceptionMean) / kInceptionStd; }

// The random draws of one RandomResizedCrop + RandomHorizontalFlip: the crop's corner and size in the image.
struct ResizedCrop {
  int64_t top = 0, left = 0, height = 0, width = 0;
  bool flip = false;
};
// The draws for an h x w image (h, w >= 1), in the order the file comment states.
ResizedCrop draw_resized_crop(int64_t h, int64_t w, std::mt19937_64& rng);
// The crop when all 10 attempts fail: the whole image, its long side cut to the ratio range (3/4 .. 4/3), centred.
// No flip (that is drawn after it).
ResizedCrop resized_crop_fallback(int64_t h, int64_t w);
// Applies `t` to an RGB image: writes the normalized size x size crop [size, size, 3], mirrored when t.flip.
void apply_resized_crop(const Image& image, const ResizedCrop& t, int64_t size, float* out);

struct ClassificationData {
  std::vector<float> images;    // [N, S, S, 3] NHWC, normalized to [-1, 1]
  std::vector<int64_t> labels;  // [N]: the class folder's index + label_offset()
};

class ClassificationSet {
 public:
  // Opens DIR and checks its layout against a model of `classes` classes (not the pixels: see the file comment).
  ClassificationSet(const std::string& dir, int64_t classes);
  // The set for (dir, classes), opened once per process and shared: listing ImageNet's 1.28M files takes a while,
  // and a max-batch search builds the model once per probe.
  static std::shared_ptr<const ClassificationSet> open_shared(const std::string& dir, int64_t classes);
  int64_t size() const { return int64_t(files_.size()); }
  int64_t folders() const { return int64_t(class_names_.size()); }
  int64_t label_offset() const { return label_offset_; }                        // 1 with a background class, else 0
  const std::vector<std::string>& class_names() const { return class_names_; }  // the folders, sorted
  std::string path(int64_t i) const;                                            // DIR/<class>/<file> of item i
  int64_t label(int64_t i) const { return folder_[size_t(i)] + label_offset_; }
  // Item i decoded as RGB.
  Image load(int64_t i) const;
  // Step `step`'s batch of n crops of `size` pixels.
  ClassificationData batch(int64_t n, int64_t size, uint64_t seed, int64_t step) const;
  std::string describe() const;  // for the model's summary line

 private:
  std::string dir_;
  int64_t classes_, label_offset_ = 0;
  std::vector<std::string> class_names_;
  std::vector<std::string> files_;  // [size()]: file names inside their class folder
  std::vector<int64_t> folder_;     // [size()]: the class folder's index
  mutable EpochOrder order_;        // batch() is const: the cached epoch permutation is not the set's state
};

}  // namespace models::data
