// vision_data_test.cpp: the vision data sets (--data for deeplabv3 and yolov3): JPEG / PNG decoding against
// what tests/data/make_vision_samples.py wrote (its rectangles and colours are restated here), the transforms
// on hand-computed cases, seeded order, every error a broken set can cause (broken copies in a temp dir),
// and the tiny models training from the sample sets on cpu, with meta allocating exactly as the cpu.
#include <gtest/gtest.h>

#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/device.h"
#include "engine/error.h"
#include "engine/io.h"
#include "models/data/detection.h"
#include "models/data/image_io.h"
#include "models/data/segmentation.h"
#include "models/data/wordpiece.h"
#include "models/registry.h"
#include "tests/util/error_util.h"
#include "tests/util/temp_dir.h"

namespace fs = std::filesystem;
using namespace models::data;

namespace {

std::string sample(const std::string& name) {
  const std::string here = __FILE__;
  return here.substr(0, here.find_last_of('/')) + "/../data/" + name;
}

// make_vision_samples.py's VOC set: id -> width, height, rectangles (class, left, top, right, bottom).
struct Rect {
  int64_t cls, l, t, r, b;
};
struct VocItem {
  const char* id;
  int64_t w, h;
  std::vector<Rect> rects;
};
const std::vector<VocItem> kVoc = {{"2007_000001", 80, 60, {{1, 10, 8, 50, 40}, {3, 55, 20, 78, 58}}},
                                   {"2007_000002", 50, 90, {{2, 5, 10, 45, 50}, {4, 10, 60, 30, 85}}},
                                   {"2007_000003", 64, 64, {{3, 16, 16, 48, 48}}},
                                   {"2007_000004", 96, 48, {{4, 4, 4, 40, 44}, {1, 50, 10, 90, 40}}}};
const uint8_t kVocColours[5][3] = {{20, 20, 20}, {200, 40, 40}, {40, 200, 40}, {40, 40, 200}, {200, 200, 40}};

// The label map the generator drew: rectangles with a 255 border, later ones over earlier ones.
std::vector<int64_t> expected_labels(const VocItem& item) {
  std::vector<int64_t> l(size_t(item.w * item.h), 0);
  for (const Rect& r : item.rects)
    for (int64_t y = r.t; y < r.b; y++)
      for (int64_t x = r.l; x < r.r; x++)
        l[size_t(y * item.w + x)] = (y == r.t || y == r.b - 1 || x == r.l || x == r.r - 1) ? 255 : r.cls;
  return l;
}

// A copy of a sample set inside a fresh temp folder.
std::string copy_sample(const testutil::TempDir& t, const std::string& set) {
  const std::string to = t.file(set);
  fs::copy(sample(set), to, fs::copy_options::recursive);
  return to;
}

void write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

using testutil::error_of;

float denormalize(float v, int64_t c) { return (v * kImageNetStd[c] + kImageNetMean[c]) * 255.f; }

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Decoding

TEST(VisionData, PngLabelMapsDecodeExactly) {
  for (const VocItem& item : kVoc) {
    const std::string path = sample("voc_sample/SegmentationClass/") + item.id + ".png";
    Image label =
        decode_png(engine::read_file(path, "label", engine::kGiB), path);  // palette (3 of them) and grey (the 4th)
    ASSERT_EQ(label.channels, 1) << path;
    ASSERT_EQ(label.width, item.w);
    ASSERT_EQ(label.height, item.h);
    const auto expected = expected_labels(item);
    for (size_t p = 0; p < expected.size(); p++)
      ASSERT_EQ(int64_t(label.pixels[p]), expected[p]) << path << " pixel " << p;
  }
}

TEST(VisionData, RgbPngDecodesExactly) {
  Image im = read_image(sample("voc_sample/rgb_formula.png"));
  ASSERT_EQ(im.channels, 3);
  ASSERT_EQ(im.height, 12);
  ASSERT_EQ(im.width, 20);
  for (int64_t y = 0; y < 12; y++)
    for (int64_t x = 0; x < 20; x++) {
      EXPECT_EQ(im.at(y, x, 0), (x * 13) % 256);
      EXPECT_EQ(im.at(y, x, 1), (y * 21) % 256);
      EXPECT_EQ(im.at(y, x, 2), (x * y * 7) % 256);
    }
}

// A header whose sizes would decode to more than 1 GiB is an Error naming the file, not an allocation: a PNG
// (valid CRCs, so libpng itself accepts it) of 100000 x 100000 RGB pixels, cut after its first IDAT header.
TEST(VisionData, HugeImageHeadersAreErrors) {
  auto be32 = [](uint32_t v) { return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; };
  auto chunk = [&](const std::string& type, const std::string& data) {
    const std::string body = type + data;
    return be32(uint32_t(data.size())) + body +
           be32(uint32_t(crc32(0, reinterpret_cast<const Bytef*>(body.data()), uInt(body.size()))));
  };
  const std::string ihdr = be32(100000) + be32(100000) + std::string{8, 2, 0, 0, 0};  // 8-bit RGB
  const std::string png = std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + be32(16) + "IDAT";
  EXPECT_ERROR_HAS(decode_png(png, "huge.png"), "PNG 'huge.png'", "over the 1 GiB");
}

TEST(VisionData, JpegFlatColoursDecodeClose) {
  for (const VocItem& item : kVoc) {
    Image im = read_image(sample("voc_sample/JPEGImages/") + item.id + ".jpg");
    ASSERT_EQ(im.channels, 3);
    ASSERT_EQ(im.width, item.w);
    ASSERT_EQ(im.height, item.h);
    const auto labels = expected_labels(item);
    auto colour_of = [&](int64_t y, int64_t x) {
      const int64_t l = labels[size_t(y * item.w + x)];
      return l == 255 ? 0 : l;
    };
    int64_t checked = 0;
    // JPEG's 8 x 8 blocks of one colour (a block with an edge rings by up to ~20 levels even at quality 95).
    for (int64_t by = 0; by + 8 <= item.h; by += 8)
      for (int64_t bx = 0; bx + 8 <= item.w; bx += 8) {
        bool flat = true;
        for (int64_t y = by; y < by + 8 && flat; y++)
          for (int64_t x = bx; x < bx + 8 && flat; x++) flat = colour_of(y, x) == colour_of(by, bx);
        if (!flat) continue;
        checked++;
        for (int64_t y = by; y < by + 8; y++)
          for (int64_t x = bx; x < bx + 8; x++)
            for (int64_t c = 0; c < 3; c++)
              ASSERT_NEAR(int(im.at(y, x, c)), int(kVocColours[colour_of(y, x)][c]), 2)
                  << item.id << " y " << y << " x " << x;
      }
    EXPECT_GT(checked, 30);
  }
}

// ---------------------------------------------------------------------------------------------------
// Transforms

TEST(VisionData, LetterboxHandComputed) {
  // An 80 x 40 image into 64: r = 0.8, resized to 64 x 32, dh = 16 -> top = round(15.9) = 16, left 0.
  Letterbox g = letterbox_geometry(40, 80, 64);
  EXPECT_EQ(g.new_w, 64);
  EXPECT_EQ(g.new_h, 32);
  EXPECT_EQ(g.top, 16);
  EXPECT_EQ(g.left, 0);
  // Box x 10, y 5, w 20, h 10: centre (20, 10) * 0.8 + (0, 16) = (16, 24) -> (0.25, 0.375), size (16, 8) / 64.
  DetectionBox box{10, 5, 20, 10, 0, {}};
  auto b = letterbox_box(box, 40, 80, g, 64, false);
  EXPECT_FLOAT_EQ(b[0], 0.25f);
  EXPECT_FLOAT_EQ(b[1], 0.375f);
  EXPECT_FLOAT_EQ(b[2], 0.25f);
  EXPECT_FLOAT_EQ(b[3], 0.125f);
  auto f = letterbox_box(box, 40, 80, g, 64, true);  // the flip mirrors cx only
  EXPECT_FLOAT_EQ(f[0], 0.75f);
  EXPECT_FLOAT_EQ(f[1], 0.375f);
  EXPECT_FLOAT_EQ(f[2], 0.25f);
  // 60 wide, 90 high: r = 64 / 90, width round(42.67) = 43, dw = 10.5 -> left = round(10.4) = 10 (ultralytics').
  g = letterbox_geometry(90, 60, 64);
  EXPECT_EQ(g.new_w, 43);
  EXPECT_EQ(g.new_h, 64);
  EXPECT_EQ(g.left, 10);
  EXPECT_EQ(g.top, 0);

  // The pixels of the sample's 80 x 40 image: the car box (colour 220, 60, 60) lands at x 8..24, y 20..28, the
  // image's grey background (128) e.g. at (y 18, x 60), grey 0.5 padding above and below the image; flipped,
  // x becomes 63 - x.
  Image im = read_image(sample("coco_sample/train2017/000000000001.jpg"));
  g = letterbox_geometry(40, 80, 64);
  for (bool flip : {false, true}) {
    std::vector<float> out(64 * 64 * 3);
    apply_letterbox(im, g, 64, flip, out.data());
    auto pixel = [&](int64_t y, int64_t x, int64_t c) { return denormalize(out[size_t((y * 64 + x) * 3 + c)], c); };
    for (int64_t c = 0; c < 3; c++) {
      EXPECT_NEAR(pixel(5, 30, c), 127.5f, 0.01f);  // padding
      EXPECT_NEAR(pixel(60, 3, c), 127.5f, 0.01f);
      auto mirror = [&](int64_t x) { return flip ? 63 - x : x; };
      EXPECT_NEAR(pixel(24, mirror(16), c), c == 0 ? 220.f : 60.f, 12.f) << flip;  // inside the car box
      EXPECT_NEAR(pixel(18, mirror(60), c), 128.f, 12.f) << flip;                  // the image's background
    }
  }
}

TEST(VisionData, ScaleCropHandComputedAndAligned) {
  const VocItem& item = kVoc[0];  // 80 x 60
  Image image = read_image(sample("voc_sample/JPEGImages/2007_000001.jpg"));
  Image label = read_image(sample("voc_sample/SegmentationClass/2007_000001.png"));
  const auto expected = expected_labels(item);
  // Halved to 40 x 30 at the top-left of a 64 crop: nearest rows/columns 2y + 1, 2x + 1; the rest is padding.
  for (bool flip : {false, true}) {
    ScaleCrop t;
    t.flip = flip, t.scaled_h = 30, t.scaled_w = 40;
    std::vector<float> out(64 * 64 * 3);
    std::vector<int64_t> labels(64 * 64);
    apply_scale_crop(image, label, t, 64, 255, out.data(), labels.data());
    for (int64_t y = 0; y < 64; y++)
      for (int64_t x = 0; x < 64; x++) {
        const int64_t got = labels[size_t(y * 64 + x)];
        if (y >= 30 || x >= 40) {
          ASSERT_EQ(got, 255);
          for (int64_t c = 0; c < 3; c++) ASSERT_NEAR(denormalize(out[size_t((y * 64 + x) * 3 + c)], c), 0.f, 1e-3f);
        } else {
          const int64_t sx = flip ? 79 - (2 * x + 1) : 2 * x + 1;
          ASSERT_EQ(got, expected[size_t((2 * y + 1) * 80 + sx)]) << "y " << y << " x " << x << " flip " << flip;
        }
      }
  }
  // Random draws on every sample: the scale is the recipe's, and wherever a label's 5 x 5 neighbourhood is one
  // class, the pixel's colour is nearest that class's (image and label map moved together; JPEG's ringing
  // at edges moves colours by up to ~20 levels, the class colours are 160 or more apart).
  SegmentationSet set(sample("voc_sample"), 5);
  for (int64_t i = 0; i < set.size(); i++) {
    Image im, lab;
    set.load(i, im, lab);
    for (uint64_t seed = 1; seed <= 6; seed++) {
      std::mt19937_64 rng = item_rng(seed, i);
      const ScaleCrop t = draw_scale_crop(im.height, im.width, 64, 64, rng);
      EXPECT_GE(std::min(t.scaled_h, t.scaled_w), 32);
      EXPECT_LE(std::min(t.scaled_h, t.scaled_w), 128);
      EXPECT_LE(t.left, std::max<int64_t>(t.scaled_w - 64, 0));
      EXPECT_LE(t.top, std::max<int64_t>(t.scaled_h - 64, 0));
      std::vector<float> out(64 * 64 * 3);
      std::vector<int64_t> labels(64 * 64);
      apply_scale_crop(im, lab, t, 64, 255, out.data(), labels.data());
      int64_t checked = 0;
      for (int64_t y = 2; y < 62; y++)
        for (int64_t x = 2; x < 62; x++) {
          const int64_t l = labels[size_t(y * 64 + x)];
          bool flat = l != 255;
          for (int64_t dy = -2; dy <= 2 && flat; dy++)
            for (int64_t dx = -2; dx <= 2 && flat; dx++) flat = labels[size_t((y + dy) * 64 + x + dx)] == l;
          if (!flat) continue;
          checked++;
          int64_t nearest = 0;
          float best = 1e9f;
          for (int64_t k = 0; k < 5; k++) {
            float distance = 0;
            for (int64_t c = 0; c < 3; c++)
              distance += std::fabs(denormalize(out[size_t((y * 64 + x) * 3 + c)], c) - kVocColours[k][c]);
            if (distance < best) best = distance, nearest = k;
          }
          ASSERT_EQ(nearest, l) << set.ids()[size_t(i)] << " seed " << seed << " y " << y << " x " << x;
          ASSERT_LT(best, 3 * 24.f) << set.ids()[size_t(i)] << " seed " << seed << " y " << y << " x " << x;
        }
      EXPECT_GT(checked, 0);
    }
  }
}

TEST(VisionData, SeededOrderAndBatches) {
  // Each epoch visits every item once.
  for (int64_t epoch = 0; epoch < 3; epoch++) {
    std::vector<int64_t> seen;
    for (int64_t k = 0; k < 5; k++) seen.push_back(epoch_item(epoch * 5 + k, 5, 7));
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  }
  // The cached order (what the sets use) gives the same sequence, across epochs, seeds and counts.
  models::data::EpochOrder order;
  for (auto [first, n, count, seed] : {std::array<int64_t, 4>{0, 7, 5, 7}, {3, 9, 5, 7}, {3, 9, 5, 8}, {10, 4, 6, 8}}) {
    const std::vector<int64_t> ids = order.items(first, n, count, uint64_t(seed));
    ASSERT_EQ(int64_t(ids.size()), n);
    for (int64_t k = 0; k < n; k++)
      EXPECT_EQ(ids[size_t(k)], epoch_item(first + k, count, uint64_t(seed))) << first + k;
  }
  SegmentationSet voc(sample("voc_sample"), 5);
  auto a = voc.batch(3, 64, 1, 2), b = voc.batch(3, 64, 1, 2), c = voc.batch(3, 64, 1, 3), d = voc.batch(3, 64, 2, 2);
  EXPECT_EQ(a.images, b.images);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.labels, c.labels);
  EXPECT_NE(a.labels, d.labels);
  for (int64_t l : a.labels) EXPECT_TRUE((l >= 0 && l < 5) || l == 255);
  DetectionSet coco(sample("coco_sample"), 3);
  auto x = coco.batch(4, 64, 1, 1), y = coco.batch(4, 64, 1, 1), z = coco.batch(4, 64, 3, 1);
  EXPECT_EQ(x.images, y.images);
  EXPECT_EQ(x.boxes, y.boxes);
  EXPECT_NE(x.images, z.images);
  // Step 1 with batch 4 is one whole epoch: every sample once, so 6 boxes (the crowd left out) and 1 empty image.
  int64_t boxes = 0, empty = 0;
  for (int64_t n = 0; n < 4; n++) {
    int64_t here = 0;
    for (int64_t m = 0; m < 100; m++) {
      const int64_t l = x.labels[size_t(n * 100 + m)];
      EXPECT_TRUE(l >= -1 && l < 3);
      if (l >= 0) here++;
      if (l < 0) {
        EXPECT_EQ(x.boxes[size_t((n * 100 + m) * 4 + 2)], 0.f);
      }
    }
    boxes += here, empty += here == 0;
  }
  EXPECT_EQ(boxes, 6);
  EXPECT_EQ(empty, 1);
}

TEST(VisionData, CocoCategoriesAndBoxes) {
  DetectionSet set(sample("coco_sample"), 3);
  EXPECT_EQ(set.category_ids(), (std::vector<int64_t>{3, 7, 12}));
  ASSERT_EQ(set.size(), 4);
  // Image 2: one box (its iscrowd box skipped), category 7 -> class 1.
  ASSERT_EQ(set.items()[1].boxes.size(), 1u);
  EXPECT_EQ(set.items()[1].boxes[0].label, 1);
  EXPECT_TRUE(set.items()[2].boxes.empty());
  // Image 4: category 12 -> class 2, 3 -> 0.
  ASSERT_EQ(set.items()[3].boxes.size(), 3u);
  EXPECT_EQ(set.items()[3].boxes[0].label, 2);
  EXPECT_EQ(set.items()[3].boxes[2].label, 0);
  EXPECT_NE(set.describe().find("1 iscrowd boxes skipped"), std::string::npos) << set.describe();
}

// A COCO set is parsed once per process (a max-batch search builds the model once per probe): the same
// (dir, classes, max_boxes) gives the same set; another max_boxes another one; a failed open is not kept.
TEST(VisionData, CocoSetsAreOpenedOncePerProcess) {
  auto a = DetectionSet::open_shared(sample("coco_sample"), 3, 100),
       b = DetectionSet::open_shared(sample("coco_sample"), 3, 100);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), DetectionSet::open_shared(sample("coco_sample"), 3, 2).get());
  for (int attempt = 0; attempt < 2; attempt++)  // the second open tries again: no half-opened set was kept
    EXPECT_ERROR_HAS(DetectionSet::open_shared(sample("coco_sample"), 5, 100), "has 3 categories but the model has 5");
}

// ---------------------------------------------------------------------------------------------------
// Errors

TEST(VisionData, VocErrorsNameTheFile) {
  EXPECT_ERROR_HAS(SegmentationSet("/no/such/voc", 5), "/no/such/voc", "no such directory");
  {
    testutil::TempDir t;
    const std::string d = copy_sample(t, "voc_sample");
    fs::remove_all(d + "/JPEGImages");
    EXPECT_ERROR_HAS(SegmentationSet(d, 5), "JPEGImages/");
  }
  {
    testutil::TempDir t;
    const std::string d = copy_sample(t, "voc_sample");
    fs::remove(d + "/JPEGImages/2007_000002.jpg");
    EXPECT_ERROR_HAS(SegmentationSet(d, 5), "2007_000002.jpg", "train.txt");
  }
  {
    testutil::TempDir t;
    const std::string d = copy_sample(t, "voc_sample");
    fs::remove(d + "/SegmentationClass/2007_000003.png");
    EXPECT_ERROR_HAS(SegmentationSet(d, 5), "SegmentationClass/2007_000003.png");
    // Without train.txt the ids are the PNGs: 3 left.
    fs::remove(d + "/ImageSets/Segmentation/train.txt");
    EXPECT_EQ(SegmentationSet(d, 5).size(), 3);
  }
  {
    testutil::TempDir t;
    const std::string d = copy_sample(t, "voc_sample");
    const std::string jpeg = engine::read_file(d + "/JPEGImages/2007_000001.jpg", "jpeg", engine::kGiB);
    write(d + "/JPEGImages/2007_000001.jpg", jpeg.substr(0, jpeg.size() / 2));  // truncated
    std::string corrupt = engine::read_file(d + "/JPEGImages/2007_000002.jpg", "jpeg", engine::kGiB);
    for (size_t k = 200; k < corrupt.size() - 2; k += 7) corrupt[k] = char(0xFF);  // markers in the entropy data
    write(d + "/JPEGImages/2007_000002.jpg", corrupt);
    const std::string png = engine::read_file(d + "/SegmentationClass/2007_000003.png", "png", engine::kGiB);
    write(d + "/SegmentationClass/2007_000003.png", png.substr(0, png.size() - 30));  // truncated
    std::string bad_crc = engine::read_file(d + "/SegmentationClass/2007_000004.png", "png", engine::kGiB);
    bad_crc[40] = char(bad_crc[40] ^ 0x55);
    write(d + "/SegmentationClass/2007_000004.png", bad_crc);
    SegmentationSet set(d, 5);  // opening reads no pixels
    Image im, lab;
    EXPECT_ERROR_HAS(set.load(0, im, lab), "2007_000001.jpg", "JPEG", "corrupt or truncated");
    EXPECT_ERROR_HAS(set.load(1, im, lab), "2007_000002.jpg", "JPEG", "corrupt or truncated");
    EXPECT_ERROR_HAS(set.load(2, im, lab), "2007_000003.png", "PNG", "corrupt or truncated");
    EXPECT_ERROR_HAS(set.load(3, im, lab), "2007_000004.png", "PNG", "corrupt or truncated");
    EXPECT_ERROR_HAS(set.batch(4, 64, 1, 1), "corrupt or truncated");  // from a decoding thread
    write(d + "/JPEGImages/2007_000001.jpg", "not an image");
    EXPECT_ERROR_HAS(set.load(0, im, lab), "2007_000001.jpg", "neither a JPEG nor a PNG");
  }
  {
    testutil::TempDir t;
    const std::string d = copy_sample(t, "voc_sample");
    SegmentationSet four_classes(d, 4);  // 2007_000004 has class 4
    Image im, lab;
    EXPECT_ERROR_HAS(four_classes.load(3, im, lab), "2007_000004.png", "class 4", "4 classes");
    fs::copy_file(d + "/SegmentationClass/2007_000001.png", d + "/SegmentationClass/2007_000002.png",
                  fs::copy_options::overwrite_existing);
    EXPECT_ERROR_HAS(SegmentationSet(d, 5).load(1, im, lab), "2007_000002.png", "80x60", "50x90");
  }
  models::ModelConfig mc;
  mc.name = "deeplabv3", mc.size = "tiny", mc.data = "/no/such/voc";
  EXPECT_ERROR_HAS(models::create_model(mc), "/no/such/voc");
}

namespace {
// An instances JSON: images 1 (80 x 40) and 4 (100 x 50) of the sample, categories 3, 7, 12 and `annotations`.
std::string coco_json(const std::string& annotations, const std::string& width_1 = "80") {
  return R"({"images": [{"id": 1, "file_name": "000000000001.jpg", "width": )" + width_1 +
         R"(, "height": 40}, {"id": 4, "file_name": "000000000004.jpg", "width": 100, "height": 50}],
            "categories": [{"id": 12}, {"id": 3}, {"id": 7}], "annotations": [)" +
         annotations + "]}";
}
std::string box(int64_t image, int64_t category, const std::string& bbox) {
  return engine::str(R"({"image_id": )", image, R"(, "category_id": )", category, R"(, "bbox": )", bbox, "}");
}
}  // namespace

TEST(VisionData, CocoErrorsNameTheFile) {
  EXPECT_ERROR_HAS(DetectionSet("/no/such/coco", 3), "/no/such/coco", "no such directory");
  testutil::TempDir t;
  const std::string d = copy_sample(t, "coco_sample"), json = d + "/annotations/instances_train2017.json";
  EXPECT_ERROR_HAS(DetectionSet(d, 80), "3 categories", "80 classes");
  write(d + "/annotations/instances_val2017.json", "{}");
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "exactly one", "instances_train2017.json, instances_val2017.json");
  fs::remove(d + "/annotations/instances_val2017.json");
  write(json, coco_json(box(1, 3, "[10, 5, 20, 10]")).substr(0, 60));
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "instances_train2017.json");  // syntax
  write(json, coco_json(R"({"image_id": 1, "category_id": 3})"));
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "instances_train2017.json", "annotations[0]", "missing key 'bbox'");
  write(json, coco_json(box(9, 3, "[1, 1, 2, 2]")));
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "annotations[0]", "image_id 9");
  write(json, coco_json(box(1, 5, "[1, 1, 2, 2]")));
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "annotations[0]", "category_id 5");
  write(json, coco_json(box(1, 3, "[1, 1, 2]")));
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "annotations[0].bbox");
  // Outside the image: clipped (and noted); nothing left: dropped.
  write(json, coco_json(box(1, 3, "[70, -5, 20, 10]") + "," + box(4, 7, "[120, 0, 5, 5]")));
  {
    DetectionSet set(d, 3);
    ASSERT_EQ(set.items()[0].boxes.size(), 1u);
    const DetectionBox b = set.items()[0].boxes[0];
    EXPECT_EQ(b.x, 70.f);
    EXPECT_EQ(b.y, 0.f);
    EXPECT_EQ(b.w, 10.f);
    EXPECT_EQ(b.h, 5.f);
    EXPECT_EQ(b.label, 0);  // category 3 is the smallest id
    EXPECT_TRUE(set.items()[1].boxes.empty());
    EXPECT_NE(set.describe().find("2 boxes reached outside their image and were clipped to it (1 had nothing left"),
              std::string::npos)
        << set.describe();
  }
  // More boxes than slots: the first ones kept, the rest counted.
  std::string many;
  for (int k = 0; k < 5; k++) many += (k ? "," : "") + box(1, 12, engine::str("[", k, ", 0, 5, 5]"));
  write(json, coco_json(many));
  {
    DetectionSet set(d, 3, /*max_boxes=*/3);
    ASSERT_EQ(set.items()[0].boxes.size(), 3u);
    EXPECT_EQ(set.items()[0].boxes[2].x, 2.f);
    EXPECT_NE(set.describe().find("1 images have more than 3 boxes: the first 3 kept, 2 boxes dropped"),
              std::string::npos);
  }
  // Polygons: fewer than 3 points, an odd count, a non-number are errors naming the entry; an RLE mask (an object)
  // leaves the object without polygons.
  auto with_segmentation = [&](const std::string& seg) {
    return coco_json(R"({"image_id": 1, "category_id": 3, "bbox": [1, 1, 5, 5], "segmentation": )" + seg + "}");
  };
  write(json, with_segmentation("[[1, 1, 5, 1]]"));
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "annotations[0].segmentation[0]", "at least 3 points", "4 numbers");
  write(json, with_segmentation("[[1, 1, 5, 1, 5, 5, 1]]"));
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "annotations[0].segmentation[0]", "7 numbers");
  write(json, with_segmentation(R"([[1, 1, 5, 1, 5, "x"]])"));
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "annotations[0].segmentation[0]", "finite number of pixels");
  write(json, with_segmentation(R"({"counts": [1, 2], "size": [40, 80]})"));
  {
    DetectionSet set(d, 3);
    ASSERT_EQ(set.items()[0].boxes.size(), 1u);
    EXPECT_TRUE(set.items()[0].boxes[0].polygons.empty());
  }
  // The JSON's size differs from the decoded one: an error when the image is decoded.
  write(json, coco_json("", "81"));
  {
    DetectionSet set(d, 3);
    EXPECT_ERROR_HAS(set.load(0), "000000000001.jpg", "80x40", "81x40");
  }
  write(json, coco_json(""));
  fs::remove(d + "/train2017/000000000004.jpg");
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "000000000004.jpg", "does not exist");
  fs::remove_all(d + "/train2017");
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "train2017/");
  fs::remove_all(d + "/annotations");
  EXPECT_ERROR_HAS(DetectionSet(d, 3), "annotations/");
}

// ---------------------------------------------------------------------------------------------------
// The models

namespace {
models::ModelConfig tiny(const std::string& model) {
  models::ModelConfig mc;
  mc.name = model, mc.size = "tiny";
  mc.data = sample(model == "yolov3" || model == "maskrcnn" ? "coco_sample"
                   : model == "nasnet_large"                ? "imagenet_sample"
                                                            : "voc_sample");
  return mc;
}
}  // namespace

TEST(VisionData, TinyModelsTrainFromTheSamples) {
  auto dev = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 32);
  engine::DeviceGuard guard(dev);
  for (const char* name : {"deeplabv3", "yolov3", "nasnet_large", "maskrcnn"}) {
    auto model = models::create_model(tiny(name));
    EXPECT_NE(model->summary().find("data: "), std::string::npos) << model->summary();
    for (int64_t step = 1; step <= 3; step++) {
      models::StepResult r = model->train_step(step);
      EXPECT_TRUE(std::isfinite(r.loss)) << name << " step " << step;
      EXPECT_GT(r.loss, 0) << name;
      EXPECT_EQ(r.items, model->batch_size());
    }
  }
  auto other = tiny("yolov3");
  other.size = "coco";  // 80 classes against the sample's 3 categories
  EXPECT_ERROR_HAS(models::create_model(other), "3 categories", "80 classes");
  auto mask = tiny("maskrcnn");
  mask.size = "coco";  // 81 classes: 80 categories and the background
  EXPECT_ERROR_HAS(models::create_model(mask), "3 categories", "80 classes");
}

TEST(VisionData, MetaWithDataAllocatesAsCpu) {
  for (const char* name : {"deeplabv3", "yolov3", "nasnet_large", "maskrcnn"}) {
    std::string csv[2];
    int k = 0;
    for (auto type : {engine::DeviceType::cpu, engine::DeviceType::meta}) {
      auto dev = engine::Device::create(type, size_t(1) << 32);
      engine::DeviceGuard guard(dev);
      auto model = models::create_model(tiny(name));
      for (int64_t step = 1; step <= 2; step++) model->train_step(step);
      dev->ledger().check();
      csv[k++] = dev->ledger().events_csv();
    }
    EXPECT_EQ(csv[0], csv[1]) << name;
  }
}

TEST(VisionData, InstanceResizeIsTorchvisions) {
  // torchvision 0.29's GeneralizedRCNNTransform(800, 1333).image_sizes for these inputs (h, w), and (64, 96).
  EXPECT_EQ(instance_resize(480, 640, 800, 1333), (std::array<int64_t, 2>{800, 1066}));
  EXPECT_EQ(instance_resize(427, 640, 800, 1333), (std::array<int64_t, 2>{800, 1199}));
  EXPECT_EQ(instance_resize(40, 80, 800, 1333), (std::array<int64_t, 2>{666, 1333}));
  EXPECT_EQ(instance_resize(90, 60, 800, 1333), (std::array<int64_t, 2>{1200, 800}));
  EXPECT_EQ(instance_resize(1000, 200, 800, 1333), (std::array<int64_t, 2>{1333, 266}));
  EXPECT_EQ(instance_resize(90, 60, 64, 96), (std::array<int64_t, 2>{96, 64}));
  EXPECT_EQ(instance_resize(50, 100, 64, 96), (std::array<int64_t, 2>{48, 96}));
  // On a landscape canvas a portrait image takes the largest size that fits.
  InstanceGeometry g;
  EXPECT_EQ(instance_fit(480, 640, g), (std::array<int64_t, 2>{800, 1066}));
  EXPECT_EQ(instance_fit(90, 60, g), (std::array<int64_t, 2>{800, 533}));
}

TEST(VisionData, CocoPolygonsFollowTheirBoxesThroughResizeAndFlip) {
  DetectionSet set(sample("coco_sample"), 3);
  // Annotation 1 has two polygons (its rectangle's halves), annotation 7 none (its box is its mask).
  ASSERT_EQ(set.items()[0].boxes[0].polygons.size(), 2u);
  ASSERT_EQ(set.items()[3].boxes[2].polygons.size(), 0u);
  InstanceGeometry g;
  g.min_size = 64, g.max_size = 96, g.padded_h = 96, g.padded_w = 96, g.truths = 4, g.parts = 2, g.vertices = 3;
  EXPECT_NE(set.instance_notes(g).find("6 polygons of more than 3 points"), std::string::npos) << set.instance_notes(g);
  EXPECT_NE(set.instance_notes(g).find("1 objects without polygons"), std::string::npos) << set.instance_notes(g);
  g.vertices = 8;
  // Two epochs (batch 4: every image once per step), so both flips of every image show up.
  int flipped = 0, straight = 0;
  for (int64_t step = 1; step <= 6; step++) {
    const InstanceData b = set.instance_batch(4, g, 5, step);
    ASSERT_EQ(b.images.size(), size_t(4 * 96 * 96 * 3));
    for (int64_t n = 0; n < 4; n++) {
      const int64_t h = int64_t(b.image_hw[size_t(n * 2)]), w = int64_t(b.image_hw[size_t(n * 2 + 1)]);
      // The sample's sizes (w x h 80x40, 60x90, 64x64, 100x50) resize to 48x96, 96x64, 64x64, 48x96.
      EXPECT_TRUE((h == 48 && w == 96) || (h == 96 && w == 64) || (h == 64 && w == 64)) << h << "x" << w;
      for (int64_t x = w; x < 96; x++) EXPECT_EQ(b.images[size_t(((n * 96 + h / 2) * 96 + x) * 3)], 0.f);  // padding
      for (int64_t m = 0; m < 4; m++) {
        const size_t slot = size_t(n * 4 + m);
        if (b.valid[slot] == 0) {
          EXPECT_EQ(b.labels[slot], 0);
          EXPECT_EQ(b.counts[slot * 2], 0);
          continue;
        }
        EXPECT_GE(b.labels[slot], 1);
        EXPECT_LE(b.labels[slot], 3);
        // The polygons' extent is the box (every polygon here is a rectangle, or the box itself).
        float lo_x = 1e9f, hi_x = -1e9f, lo_y = 1e9f, hi_y = -1e9f;
        for (int64_t p = 0; p < 2; p++)
          for (int64_t k = 0; k < b.counts[slot * 2 + size_t(p)]; k++) {
            const float* v = b.polygons.data() + ((slot * 2 + size_t(p)) * 8 + size_t(k)) * 2;
            lo_x = std::min(lo_x, v[0]), hi_x = std::max(hi_x, v[0]), lo_y = std::min(lo_y, v[1]),
            hi_y = std::max(hi_y, v[1]);
          }
        const float* box = b.boxes.data() + slot * 4;
        EXPECT_NEAR(lo_x, box[0], 1e-4);
        EXPECT_NEAR(lo_y, box[1], 1e-4);
        EXPECT_NEAR(hi_x, box[2], 1e-4);
        EXPECT_NEAR(hi_y, box[3], 1e-4);
        EXPECT_LE(box[2], float(w));
        // Image 1's first box (x 10..30 of 80, y 5..15 of 40, resized x 1.2): straight at 12..36, flipped 60..84.
        if (h == 48 && w == 96 && b.labels[slot] == 1 && box[1] < 7) {
          EXPECT_NEAR(box[1], 6, 1e-4);
          const bool is_flipped = box[0] >= 40;
          EXPECT_NEAR(box[0], is_flipped ? 60 : 12, 1e-4);
          (is_flipped ? flipped : straight)++;
        }
      }
    }
  }
  EXPECT_GT(flipped, 0);
  EXPECT_GT(straight, 0);
}
