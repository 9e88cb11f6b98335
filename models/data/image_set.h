// image_set.h: an unlabeled image folder (FFHQ-style) for stylegan's --data DIR, read as StyleGAN's training loop
// feeds FFHQ (mirror_augment on, the drange [0, 255] mapped to [-1, 1]).
//
//   layout     every file under DIR (at any depth: FFHQ's images1024x1024/<thousands>/<id>.png) whose name ends in
//              .png, .jpg or .jpeg (any case; read by their signature, as read_image does), hidden entries (a
//              leading '.') skipped, sorted by path. Opening lists them (no pixels): no folder or no image is an
//              Error naming DIR and the layout; a file that is not a readable JPEG or PNG is an Error naming it when
//              a batch decodes it.
//   transform  RGB (grey repeated, alpha dropped), resized to the model's S x S by pixel-centre bilinear sampling
//              (none at FFHQ's own 1024 x 1024; image_io.h), mirrored left to right with probability 0.5, values
//              v / 127.5 - 1.
//   order      an epoch is a permutation of the images seeded by (seed, epoch); step k >= 1 takes positions
//              (k - 1) N ... k N - 1 of the endless sequence of epochs; image i's mirror is the first draw of its own
//              generator item_rng(seed, position), so a batch does not depend on the decoding threads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/data/image_io.h"

namespace models::data {

class ImageSet {
 public:
  explicit ImageSet(const std::string& dir);  // lists and checks DIR (see above)
  int64_t size() const { return int64_t(paths_.size()); }
  const std::vector<std::string>& paths() const { return paths_; }
  // Step `step`'s batch of n images [n, size, size, 3] (NHWC floats in [-1, 1]).
  std::vector<float> batch(int64_t n, int64_t size, uint64_t seed, int64_t step) const;
  std::string describe() const;  // for the model's summary line

 private:
  std::string dir_;
  std::vector<std::string> paths_;
  mutable EpochOrder order_;
};

}  // namespace models::data
