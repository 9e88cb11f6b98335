// classification_data_test.cpp: the ImageNet-style classification set (--data for nasnet_large,
// models/data/classification.h): the ImageFolder layout (class and file order, the labels and their background
// offset, every layout error), RandomResizedCrop's draws against numbers from an independent restatement, its
// central-crop fallback, crop + resize + flip on images whose output is known, and seeded batches of
// tests/data/imagenet_sample (make_vision_samples.py; its classes, colours and ramps are restated here).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "models/data/classification.h"
#include "models/data/image_io.h"
#include "tests/util/error_util.h"
#include "tests/util/temp_dir.h"

namespace fs = std::filesystem;
using namespace models::data;

namespace {

std::string sample() {
  const std::string here = __FILE__;
  return here.substr(0, here.find_last_of('/')) + "/../data/imagenet_sample";
}

// make_vision_samples.py's ImageNet-style set: folders (sorted), their colours, their images (sorted) and sizes.
struct SampleImage {
  const char* file;
  int64_t w, h;
};
struct SampleClass {
  const char* name;
  int colour[3];
  std::vector<SampleImage> images;
};
const std::vector<SampleClass> kSample = {
    {"n01440764", {200, 40, 40}, {{"n01440764_10026.JPEG", 80, 60}, {"n01440764_10042.png", 50, 90}}},
    {"n01443537", {40, 200, 40}, {{"n01443537_1.jpg", 64, 64}, {"n01443537_2.PNG", 120, 30}}},
    {"n01484850", {40, 40, 200}, {{"n01484850_7.jpeg", 30, 200}}},
    {"n01491361", {128, 128, 128}, {{"n01491361_3.png", 40, 40}, {"n01491361_4.JPEG", 60, 45}}}};
constexpr int64_t kSampleImages = 7;

// The generator's pixel: the class colour times the left-to-right ramp 0.5 .. 1 (no ties to round there).
int ramp(int colour, int64_t x, int64_t w) {
  return int(std::lround(colour * (0.5 + 0.5 * double(x) / double(w - 1))));
}

// The recipe's normalization, restated: (v / 255 - 0.5) / 0.5.
double normalized(double v) { return (v / 255.0 - 0.5) / 0.5; }
double denormalized(float v) { return (double(v) * 0.5 + 0.5) * 255.0; }

using namespace std::string_literals;
using testutil::error_of;

// An RGB image of w x h pixels whose colour at (y, x) is f(y, x, c).
template <typename F>
Image rgb_image(int64_t h, int64_t w, F f) {
  Image im;
  im.height = h, im.width = w, im.channels = 3;
  im.pixels.resize(size_t(h * w * 3));
  for (int64_t y = 0; y < h; y++)
    for (int64_t x = 0; x < w; x++)
      for (int64_t c = 0; c < 3; c++) im.pixels[size_t((y * w + x) * 3 + c)] = uint8_t(f(y, x, c));
  return im;
}

ResizedCrop crop(int64_t top, int64_t left, int64_t height, int64_t width, bool flip = false) {
  ResizedCrop t;
  t.top = top, t.left = left, t.height = height, t.width = width, t.flip = flip;
  return t;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Layout and labels

TEST(ClassificationData, SampleFoldersFilesAndLabels) {
  // 4 folders: labels 0..3 for 4 classes, 1..4 for 5 (slim's background class 0), 0..3 again for more.
  for (int64_t classes : {4, 5, 6, 1001}) {
    ClassificationSet set(sample(), classes);
    const int64_t offset = classes == 5 ? 1 : 0;
    EXPECT_EQ(set.folders(), 4);
    EXPECT_EQ(set.label_offset(), offset) << classes;
    ASSERT_EQ(set.size(), kSampleImages);  // notes.txt is not an image
    std::vector<std::string> names;
    for (const SampleClass& c : kSample) names.push_back(c.name);
    EXPECT_EQ(set.class_names(), names);
    int64_t i = 0;
    for (size_t k = 0; k < kSample.size(); k++)
      for (const SampleImage& image : kSample[k].images) {
        EXPECT_EQ(set.path(i), sample() + "/" + kSample[k].name + "/" + image.file);
        EXPECT_EQ(set.label(i), int64_t(k) + offset) << set.path(i) << " classes " << classes;
        i++;
      }
  }
  const std::string four = ClassificationSet(sample(), 4).describe();
  for (const char* part : {"imagenet_sample", "7 images in 4 class folders", "labels 0..3)"})
    EXPECT_NE(four.find(part), std::string::npos) << four;
  const std::string five = ClassificationSet(sample(), 5).describe();
  EXPECT_NE(five.find("labels 1..4, 0 the model's background class"), std::string::npos) << five;
  const std::string many = ClassificationSet(sample(), 1001).describe();
  EXPECT_NE(many.find("labels 0..3 of the model's 1001 classes"), std::string::npos) << many;
  // More folders than the model has classes.
  EXPECT_ERROR_HAS(ClassificationSet(sample(), 3), sample(), "4 class folders"s, "3 classes"s);
}

// Pixels: the PNGs (RGB, RGBA, grey) decode exactly to the generator's ramps, the JPEGs (RGB, grey) within 3 levels.
TEST(ClassificationData, SampleImagesDecodeToTheirRamps) {
  ClassificationSet set(sample(), 4);
  int64_t i = 0;
  for (const SampleClass& c : kSample)
    for (const SampleImage& s : c.images) {
      const Image im = set.load(i++);
      ASSERT_EQ(im.channels, 3) << s.file;
      ASSERT_EQ(im.width, s.w) << s.file;
      ASSERT_EQ(im.height, s.h) << s.file;
      const std::string file = s.file;
      const bool png = file.find(".png") != std::string::npos || file.find(".PNG") != std::string::npos;
      for (int64_t y = 0; y < s.h; y++)
        for (int64_t x = 0; x < s.w; x++)
          for (int64_t ch = 0; ch < 3; ch++)
            ASSERT_NEAR(int(im.at(y, x, ch)), ramp(c.colour[ch], x, s.w), png ? 0 : 3)
                << s.file << " y " << y << " x " << x << " c " << ch;
    }
}

// ImageFolder's order: folders sorted as byte strings ("B" before "a10" before "a2" before "b"), files sorted within
// each; hidden entries, other files, nested folders and images directly in DIR are not items. Opening reads no
// pixels, so the files here are empty.
TEST(ClassificationData, ImageFolderOrderAndIgnoredEntries) {
  testutil::TempDir t;
  const std::string d = t.file("set");
  for (const char* folder : {"b", "B", "a10", "a2", ".hidden", "b/sub.jpg"}) fs::create_directories(d + "/" + folder);
  for (const char* file : {"b/x.JPEG", "b/W.Png", "b/photo.jpeg", "b/z.jpg.txt", "b/.hidden.jpg", "b/jpg",
                           "b/sub.jpg/deep.jpg", "B/1.png", "a10/0.jpg", "a2/0.jpg", ".hidden/0.jpg", "loose.jpg"})
    t.write("set/" + std::string(file), "");
  ClassificationSet set(d, 4);
  EXPECT_EQ(set.class_names(), (std::vector<std::string>{"B", "a10", "a2", "b"}));
  EXPECT_EQ(set.label_offset(), 0);
  const std::vector<std::pair<std::string, int64_t>> expected = {{"B/1.png", 0}, {"a10/0.jpg", 1},    {"a2/0.jpg", 2},
                                                                 {"b/W.Png", 3}, {"b/photo.jpeg", 3}, {"b/x.JPEG", 3}};
  ASSERT_EQ(set.size(), int64_t(expected.size()));
  for (size_t i = 0; i < expected.size(); i++) {
    EXPECT_EQ(set.path(int64_t(i)), d + "/" + expected[i].first);
    EXPECT_EQ(set.label(int64_t(i)), expected[i].second);
  }
  // The empty "images" are an Error naming the file when a batch decodes them (from a decoding thread).
  EXPECT_ERROR_HAS(set.batch(2, 8, 1, 1), "image '" + d + "/", "neither a JPEG nor a PNG"s);
}

TEST(ClassificationData, LayoutErrorsNameTheDirectoryAndTheFix) {
  const std::string layout = "DIR/<class>/<image>";
  EXPECT_ERROR_HAS(ClassificationSet("/no/such/imagenet", 1000), "--data '/no/such/imagenet'"s, "no such directory"s,
                   layout);
  testutil::TempDir t;
  const std::string d = t.file("set");
  fs::create_directories(d);
  EXPECT_ERROR_HAS(ClassificationSet(d, 1000), "--data '" + d + "'", "no class folders"s, layout);
  // Images directly in DIR: said so.
  t.write("set/a.jpg", "");
  t.write("set/b.png", "");
  EXPECT_ERROR_HAS(ClassificationSet(d, 1000), "no class folders", "2 images directly in it", "one folder per class");
  // A regular file given as DIR.
  EXPECT_ERROR_HAS(ClassificationSet(d + "/a.jpg", 1000), "a.jpg", "no such directory");
  // A class folder with no image (only a hidden one and a text file), after a good one.
  fs::create_directories(d + "/cat");
  t.write("set/cat/0.jpg", "");
  fs::create_directories(d + "/dog");
  t.write("set/dog/.0.jpg", "");
  t.write("set/dog/readme.txt", "");
  EXPECT_ERROR_HAS(ClassificationSet(d, 1000), "--data '" + d + "'", "class folder 'dog' has no image"s,
                   "add its images or remove the folder"s, layout);
  t.write("set/dog/1.jpeg", "");
  EXPECT_EQ(ClassificationSet(d, 1000).size(), 2);
  EXPECT_ERROR_HAS(ClassificationSet(d, 1), "2 class folders", "the model has 1 classes");
}

// open_shared: one set per (dir, classes) and process; a failed open is not kept.
TEST(ClassificationData, SharedSetsAreOpenedOnce) {
  auto a = ClassificationSet::open_shared(sample(), 1001), b = ClassificationSet::open_shared(sample(), 1001);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), ClassificationSet::open_shared(sample(), 5).get());
  EXPECT_EQ(ClassificationSet::open_shared(sample(), 5)->label_offset(), 1);
  for (int attempt = 0; attempt < 2; attempt++)
    EXPECT_ERROR_HAS(ClassificationSet::open_shared(sample(), 2), "4 class folders", "2 classes");
}

// ---------------------------------------------------------------------------------------------------
// RandomResizedCrop

// The expected crops come from a Python restatement (not this code): mt19937_64 written out from the C++ standard's
// definition (from the default seed: first output 14514284786278117030, 10000th 9981545732273789042, as the standard
// says), uniform01 = (rng() >> 11) 2^-53, and torchvision's get_params with Python's round. The draws, in order: per
// attempt the area's uniform and the log-ratio's, then on success top = rng() % (H - h + 1), left = rng() % (W - w +
// 1); the flip's uniform last.
TEST(ClassificationData, ResizedCropDrawsAreTorchvisionsAlgorithm) {
  struct Case {
    int64_t h, w;
    uint64_t seed;
    int64_t top, left, height, width;
    bool flip;
    int64_t draws;  // rng() calls: 2 per attempt, 2 for the corner when one fits, 1 for the flip
  };
  const Case cases[] = {
      // 300 x 40, seed 2: attempt 1 has target area 10935.79 and aspect 1.22325 -> 116 x 95, taller than 40, and so
      // do attempts 2 to 4; attempt 5: 1203.85 and 1.11285 -> 37 x 33, which fits: top 6 of 0..7, left 123 of 0..263.
      {40, 300, 2, 6, 123, 33, 37, false, 5 * 2 + 2 + 1},
      // 80 x 60, seed 7: attempt 1 fits (3715.37, aspect 1.29500 -> 69 x 54), flipped.
      {60, 80, 7, 1, 6, 54, 69, true, 2 + 2 + 1},
      // 300 x 40, seed 1: no attempt fits; the central crop 53 x 40 (round(40 * 4/3)) at left (300 - 53) / 2 = 123.
      {40, 300, 1, 0, 123, 40, 53, true, 10 * 2 + 1},
  };
  for (const Case& c : cases) {
    std::mt19937_64 rng(c.seed), probe(c.seed);
    const ResizedCrop t = draw_resized_crop(c.h, c.w, rng);
    EXPECT_EQ(t.top, c.top) << c.seed;
    EXPECT_EQ(t.left, c.left) << c.seed;
    EXPECT_EQ(t.height, c.height) << c.seed;
    EXPECT_EQ(t.width, c.width) << c.seed;
    EXPECT_EQ(t.flip, c.flip) << c.seed;
    probe.discard(uint64_t(c.draws));
    EXPECT_EQ(rng(), probe()) << "seed " << c.seed << ": the draw did not take exactly " << c.draws << " numbers";
  }
  // Many draws on a 100 x 100 image: inside the image, area and ratio within the ranges (up to the rounding of w
  // and h), about half of them flipped.
  std::mt19937_64 rng(11);
  int64_t flips = 0;
  const int64_t n = 4000;
  for (int64_t k = 0; k < n; k++) {
    const ResizedCrop t = draw_resized_crop(100, 100, rng);
    ASSERT_GE(t.top, 0);
    ASSERT_GE(t.left, 0);
    ASSERT_LE(t.top + t.height, 100);
    ASSERT_LE(t.left + t.width, 100);
    const double ratio = double(t.width) / double(t.height), area = double(t.width * t.height) / 1e4;
    ASSERT_GE(area, 0.08 * 0.8);
    ASSERT_LE(ratio, 4.0 / 3.0 * 1.1);
    ASSERT_GE(ratio, 3.0 / 4.0 / 1.1);
    flips += t.flip;
  }
  EXPECT_NEAR(double(flips) / double(n), 0.5, 0.03);
}

// When no attempt fits, the crop is the whole image with its long side cut to the ratio range, centred.
TEST(ClassificationData, FallbackIsTheCentralCrop) {
  struct Case {
    int64_t h, w, top, left, height, width;
  };
  const Case cases[] = {
      {100, 50, 16, 0, 67, 50},  // 50 / 100 < 3/4: h = round(50 / (3/4)) = round(66.67) = 67, top (100 - 67) / 2
      {30, 100, 0, 30, 30, 40},  // 100 / 30 > 4/3: w = round(30 * 4/3) = 40, left (100 - 40) / 2
      {90, 100, 0, 0, 90, 100},  // within the range: the whole image
      {3, 4, 0, 0, 3, 4},        // exactly 4/3 and exactly 3/4: the whole image
      {4, 3, 0, 0, 4, 3},        // (both directions)
      {1, 1000, 0, 499, 1, 1},   // round(1 * 4/3) = 1 wide, left (1000 - 1) / 2
      {1000, 1, 499, 0, 1, 1},
  };
  for (const Case& c : cases) {
    const ResizedCrop t = resized_crop_fallback(c.h, c.w);
    EXPECT_EQ(t.top, c.top) << c.h << "x" << c.w;
    EXPECT_EQ(t.left, c.left) << c.h << "x" << c.w;
    EXPECT_EQ(t.height, c.height) << c.h << "x" << c.w;
    EXPECT_EQ(t.width, c.width) << c.h << "x" << c.w;
  }
  // A 1 x 1000 image can take no attempt from any generator: its target area is at least 0.08 * 1000 = 80, so h is
  // at least round(sqrt(80 / (4/3))) = 8 rows, more than it has (and the same with w for 1000 x 1). All 10 attempts
  // fail (20 numbers), the fallback is taken, then the flip (1 number).
  for (uint64_t seed = 1; seed <= 20; seed++)
    for (auto [h, w] : {std::pair<int64_t, int64_t>{1, 1000}, {1000, 1}}) {
      std::mt19937_64 rng(seed), probe(seed);
      const ResizedCrop t = draw_resized_crop(h, w, rng);
      EXPECT_EQ(t.height, 1);
      EXPECT_EQ(t.width, 1);
      EXPECT_EQ(t.top, h == 1 ? 0 : 499);
      EXPECT_EQ(t.left, w == 1 ? 0 : 499);
      probe.discard(20);
      EXPECT_EQ(t.flip, double(probe() >> 11) * 0x1.0p-53 < 0.5) << seed;
      EXPECT_EQ(rng(), probe()) << seed;
    }
  std::mt19937_64 rng(1);
  EXPECT_ERROR_HAS(draw_resized_crop(0, 5, rng), "5x0", "at least one pixel");
}

TEST(ClassificationData, FlatColourCropsGiveTheNormalizedColour) {
  const int colour[3] = {255, 0, 51};
  const Image im = rgb_image(7, 5, [&](int64_t, int64_t, int64_t c) { return colour[c]; });
  for (const ResizedCrop& t : {crop(0, 0, 7, 5), crop(1, 2, 3, 2, true), crop(6, 4, 1, 1), crop(2, 0, 5, 5, true)})
    for (int64_t size : {1, 3, 8}) {
      std::vector<float> out(size_t(size * size * 3), 99.f);
      apply_resized_crop(im, t, size, out.data());
      for (int64_t p = 0; p < size * size; p++)
        for (int64_t c = 0; c < 3; c++)
          ASSERT_NEAR(out[size_t(p * 3 + c)], normalized(colour[c]), 1e-5) << "size " << size << " pixel " << p;
    }
  // (1, -1, -0.6): the [-1, 1] range of the recipe, not ImageNet's mean and std.
  EXPECT_NEAR(normalized(51), -0.6, 1e-12);
  std::vector<float> out(3 * 3 * 3);
  Image grey;
  grey.height = grey.width = 4, grey.channels = 1, grey.pixels.assign(16, 0);
  EXPECT_ERROR_HAS(apply_resized_crop(grey, crop(0, 0, 4, 4), 3, out.data()), "1 channels", "to_rgb");
  EXPECT_ERROR_HAS(apply_resized_crop(im, crop(5, 0, 3, 5), 3, out.data()), "not inside the 5x7 image");
}

TEST(ClassificationData, FlipMirrorsATwoColourImage) {
  // 6 x 2 pixels: red left half, blue right half; the whole image resized to 6 x 6.
  const int red[3] = {255, 0, 0}, blue[3] = {0, 0, 255};
  const Image im = rgb_image(2, 6, [&](int64_t, int64_t x, int64_t c) { return x < 3 ? red[c] : blue[c]; });
  for (bool flip : {false, true}) {
    std::vector<float> out(6 * 6 * 3);
    apply_resized_crop(im, crop(0, 0, 2, 6, flip), 6, out.data());  // rows stretched 2 -> 6, columns as they are
    for (int64_t y = 0; y < 6; y++)
      for (int64_t x = 0; x < 6; x++) {
        const int* expected = (x < 3) != flip ? red : blue;
        for (int64_t c = 0; c < 3; c++)
          EXPECT_NEAR(out[size_t((y * 6 + x) * 3 + c)], normalized(expected[c]), 1e-6)
              << "flip " << flip << " y " << y << " x " << x;
      }
  }
}

// Crop, then resize, then flip, on an image whose channels are linear in x and y (bilinear is then exact): R = 10 x,
// G = 20 y. The 4 x 2 crop at (top 1, left 2) resized to 8 x 8: output column x samples crop column
// clamp((x + 0.5) 4 / 8 - 0.5, 0, 3), i.e. image column 2 + that; row y crop row clamp((y + 0.5) 2 / 8 - 0.5, 0, 1).
// The clamps are the crop's edges: column 0 reads R = 20, not 17.5 (a blend with the image's column 1), column 7
// R = 50, not 52.5. Flipped, output column x shows unflipped column 7 - x.
TEST(ClassificationData, CropResizeAndFlipHandComputed) {
  const Image im = rgb_image(3, 8, [](int64_t y, int64_t x, int64_t c) {
    return c == 0 ? 10 * x : c == 1 ? 20 * y : 7;
  });
  for (bool flip : {false, true}) {
    std::vector<float> out(8 * 8 * 3);
    apply_resized_crop(im, crop(1, 2, 2, 4, flip), 8, out.data());
    for (int64_t y = 0; y < 8; y++)
      for (int64_t x = 0; x < 8; x++) {
        const int64_t rx = flip ? 7 - x : x;
        const double sx = 2 + std::clamp((double(rx) + 0.5) * 4 / 8 - 0.5, 0.0, 3.0);
        const double sy = 1 + std::clamp((double(y) + 0.5) * 2 / 8 - 0.5, 0.0, 1.0);
        const float* p = out.data() + (y * 8 + x) * 3;
        EXPECT_NEAR(denormalized(p[0]), 10 * sx, 1e-3) << "flip " << flip << " y " << y << " x " << x;
        EXPECT_NEAR(denormalized(p[1]), 20 * sy, 1e-3) << "flip " << flip << " y " << y << " x " << x;
        EXPECT_NEAR(denormalized(p[2]), 7, 1e-3);
      }
    auto red = [&](int64_t y, int64_t x) { return denormalized(out[size_t((y * 8 + x) * 3)]); };
    EXPECT_NEAR(red(0, flip ? 7 : 0), 20, 1e-3);
    EXPECT_NEAR(red(0, flip ? 0 : 7), 50, 1e-3);
    EXPECT_NEAR(red(0, flip ? 6 : 1), 22.5, 1e-3);  // crop column 0.25: 2.25 in the image
  }
}

// ---------------------------------------------------------------------------------------------------
// Batches

// The sample's batches: seeded (same seed and step, same bytes; another step or seed, other bytes), every image of its
// label's hue, each item what the documented composition gives on one thread (so not the decoding threads'), and
// step 1 of batch size 7 one whole epoch.
TEST(ClassificationData, BatchesAreSeededAndMatchTheirLabels) {
  ClassificationSet set(sample(), 5);  // with the background class: labels 1..4
  const int64_t n = 3, s = 24;
  const ClassificationData a = set.batch(n, s, 1, 2), b = set.batch(n, s, 1, 2), c = set.batch(n, s, 1, 3),
                           d = set.batch(n, s, 2, 2);
  ASSERT_EQ(a.images.size(), size_t(n * s * s * 3));
  ASSERT_EQ(a.labels.size(), size_t(n));
  EXPECT_EQ(a.images, b.images);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.images, c.images);
  EXPECT_NE(a.images, d.images);
  for (const ClassificationData* batch : {&a, &c, &d})
    for (int64_t j = 0; j < n; j++) {
      const int64_t label = batch->labels[size_t(j)];
      ASSERT_TRUE(label >= 1 && label <= 4) << label;
      const int* colour = kSample[size_t(label - 1)].colour;
      for (int64_t p = 0; p < s * s; p++) {
        const float* px = batch->images.data() + (j * s * s + p) * 3;
        double v[3];
        for (int64_t ch = 0; ch < 3; ch++) {
          ASSERT_GE(px[ch], -1.f);
          ASSERT_LE(px[ch], 1.f);
          v[ch] = denormalized(px[ch]);
          // The ramp runs from half the colour to all of it (JPEG: a few levels more either way).
          ASSERT_GE(v[ch], 0.5 * colour[ch] - 4) << "label " << label << " pixel " << p;
          ASSERT_LE(v[ch], colour[ch] + 4) << "label " << label << " pixel " << p;
        }
        const double hi = std::max({v[0], v[1], v[2]}), lo = std::min({v[0], v[1], v[2]});
        if (colour[0] == colour[1] && colour[1] == colour[2]) {
          ASSERT_LT(hi - lo, 8) << "grey, pixel " << p;
        } else {  // one channel leads
          const int64_t main = std::max_element(colour, colour + 3) - colour;
          ASSERT_EQ(v[main], hi) << "label " << label << " pixel " << p;
          ASSERT_GT(hi - lo, 40) << "label " << label << " pixel " << p;
        }
      }
    }
  // Item j of step 2 is position 3 + j of the seeded epochs, drawn from item_rng(seed, position).
  for (int64_t j = 0; j < n; j++) {
    const int64_t position = n + j, id = epoch_item(position, set.size(), 1);
    std::mt19937_64 rng = item_rng(1, position);
    const Image im = to_rgb(read_image(set.path(id)));
    const ResizedCrop t = draw_resized_crop(im.height, im.width, rng);
    std::vector<float> expected(size_t(s * s * 3));
    apply_resized_crop(im, t, s, expected.data());
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), a.images.begin() + j * s * s * 3)) << j;
    EXPECT_EQ(a.labels[size_t(j)], set.label(id));
  }
  // One epoch: every item once.
  const ClassificationData e = set.batch(kSampleImages, 8, 3, 1);
  std::vector<int64_t> labels = e.labels, all;
  for (int64_t i = 0; i < set.size(); i++) all.push_back(set.label(i));
  std::sort(labels.begin(), labels.end());
  EXPECT_EQ(labels, all);
}
