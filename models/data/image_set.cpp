// image_set.cpp: the unlabeled image folder of stylegan's --data (see image_set.h).
#include "models/data/image_set.h"

#include <algorithm>
#include <filesystem>

#include "engine/error.h"

namespace models::data {

ImageSet::ImageSet(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  ENGINE_CHECK(fs::is_directory(dir, ec), "--data ", dir, ": not a folder (stylegan reads a folder of .png / .jpg ",
               "images at any depth, as FFHQ's images1024x1024/)");
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
  ENGINE_CHECK(!ec, "--data ", dir, ": cannot list the folder (", ec.message(), ")");
  for (; it != end; it.increment(ec)) {
    ENGINE_CHECK(!ec, "--data ", dir, ": listing failed (", ec.message(), ")");
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {  // hidden: skipped, and not entered
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec) && is_image_name(name)) paths_.push_back(it->path().string());
  }
  std::sort(paths_.begin(), paths_.end());
  ENGINE_CHECK(!paths_.empty(), "--data ", dir, ": no .png, .jpg or .jpeg image under it");
}

std::string ImageSet::describe() const { return engine::str(dir_, " (", paths_.size(), " images)"); }

std::vector<float> ImageSet::batch(int64_t n, int64_t size, uint64_t seed, int64_t step) const {
  std::vector<float> out(size_t(n * size * size * 3));
  const std::vector<int64_t> ids = order_.items((step - 1) * n, n, this->size(), seed);
  parallel_for(n, [&](int64_t j) {
    const Image image = to_rgb(read_image(paths_[size_t(ids[size_t(j)])]));
    std::mt19937_64 rng = item_rng(seed, (step - 1) * n + j);
    resample_rgb(image, size, size, uniform01(rng) < 0.5, out.data() + j * size * size * 3);  // mirrored or not
  });
  return out;
}

}  // namespace models::data
