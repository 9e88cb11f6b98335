// cityscapes_data_test.cpp: pix2pixhd's --data reader (models/data/cityscapes.h) on tests/data/cityscapes_sample
// (written by tests/data/make_vision_samples.py; its rectangles are restated here): the triples found by key, label
// ids and 16-bit instance ids kept exactly, images in [-1, 1], the resize of a 160 x 80 image, the seeded flips, the
// errors that name the file, and the model's edge map from a real instance map.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/device.h"
#include "models/data/cityscapes.h"
#include "models/vision/pix2pixhd.h"
#include "tests/util/error_util.h"

using models::data::CityscapesBatch;
using models::data::CityscapesSet;

namespace {

const char* kDir = "tests/data/cityscapes_sample";
const int kColours[5][3] = {{10, 10, 10}, {128, 64, 128}, {70, 70, 70}, {0, 0, 142}, {220, 20, 60}};

struct Rect {
  int cls, instance, left, top, right, bottom;  // half-open
};
// testcity_000000_000001 (128 x 64): background class 1 (instance 1), later rectangles on top.
const Rect kFirst[] = {{2, 2, 0, 0, 128, 16}, {3, 3001, 10, 30, 40, 60}, {3, 3002, 40, 30, 70, 60}};

int first_label(int x, int y, int* instance) {
  int cls = 1, inst = 1;
  for (const Rect& r : kFirst)
    if (x >= r.left && x < r.right && y >= r.top && y < r.bottom) cls = r.cls, inst = r.instance;
  *instance = inst;
  return cls;
}

// Whether sample j of `b` (64 x 128) is the first image, unflipped (0) or flipped (1); -1 if it is not the first.
int first_orientation(const CityscapesBatch& b, int j) {
  for (int flip : {0, 1}) {
    bool same = true;
    for (int y = 0; y < 64 && same; y++)
      for (int x = 0; x < 128 && same; x++) {
        int inst = 0;
        const int cls = first_label(flip ? 127 - x : x, y, &inst);
        const size_t i = size_t(j * 64 * 128 + y * 128 + x);
        same = b.labels[i] == float(cls) && b.instances[i] == float(inst);
      }
    if (same) return flip;
  }
  return -1;
}

}  // namespace

TEST(CityscapesData, FindsTheTriplesAndKeepsIdsExactly) {
  CityscapesSet set(kDir, 5);
  ASSERT_EQ(set.size(), 2);
  EXPECT_EQ(set.keys()[0], "testcity_000000_000001");
  EXPECT_EQ(set.keys()[1], "testcity_000000_000002");
  int firsts = 0, flips = 0, seconds = 0;
  for (int64_t step = 1; step <= 6; step++) {
    CityscapesBatch b = set.batch(2, 64, 128, 7, step);
    ASSERT_EQ(b.labels.size(), size_t(2 * 64 * 128));
    ASSERT_EQ(b.images.size(), size_t(2 * 64 * 128 * 3));
    for (int j = 0; j < 2; j++) {
      const int o = first_orientation(b, j);
      const size_t base = size_t(j * 64 * 128);
      if (o >= 0) {
        firsts++, flips += o;
        // Images: the class's colour, (x / 255 - 0.5) / 0.5, exactly (no resize at 128 x 64).
        for (size_t p = 0; p < size_t(64 * 128); p += 37)
          for (int c = 0; c < 3; c++)
            EXPECT_FLOAT_EQ(b.images[(base + p) * 3 + size_t(c)],
                            (float(kColours[int(b.labels[base + p])][c]) / 255.f - 0.5f) / 0.5f);
      } else {
        // The second image, 160 x 80 resized (nearest) to 128 x 64: its class-4 rectangle x 20-60, y 20-70 covers
        // destination (32, 36) (source (40, 45)), or (95, 36) flipped; the corner (0, 0) is background.
        seconds++;
        const bool at = b.labels[base + 36 * 128 + 32] == 4.f, mirrored = b.labels[base + 36 * 128 + 95] == 4.f;
        EXPECT_NE(at, mirrored);
        EXPECT_EQ(b.instances[base + 36 * 128 + (at ? 32 : 95)], 4001.f) << "16-bit instance id kept whole";
        EXPECT_EQ(b.labels[base], 1.f);
      }
    }
  }
  EXPECT_EQ(firsts + seconds, 12);
  EXPECT_EQ(firsts, 6) << "each epoch of 2 takes both images once";
  EXPECT_GT(flips, 0);
  EXPECT_LT(flips, firsts);
  // Seeded: the same step twice is the same batch.
  EXPECT_EQ(set.batch(2, 64, 128, 7, 3).labels, set.batch(2, 64, 128, 7, 3).labels);
}

TEST(CityscapesData, ErrorsNameTheFileAndTheFix) {
  EXPECT_NE(testutil::error_of([] { CityscapesSet(std::string(kDir) + "/nothing_here", 5); }).find("not a folder"),
            std::string::npos);
  // A label id beyond the model's classes: named with its file when the batch decodes it.
  CityscapesSet few(kDir, 3);
  std::string e = testutil::error_of([&] { few.batch(2, 64, 128, 1, 1); });
  EXPECT_NE(e.find("_labelIds.png has label id"), std::string::npos) << e;
  // An image without its instance map.
  char tmpl[] = "/tmp/cityscapes_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  for (const char* name : {"a_leftImg8bit.png", "a_gtFine_labelIds.png"}) std::ofstream(dir + "/" + name) << "x";
  e = testutil::error_of([&] { CityscapesSet(dir, 5); });
  EXPECT_NE(e.find("has 0 instanceIds maps"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

// The model reads the set: the edge channel is 1 on both sides of the boundary between instances 3001 and 3002
// (x 39 | 40 at y 45) and 0 inside one; one-hot labels in the first 5 channels.
TEST(CityscapesData, TheModelsEdgeMapComesFromTheInstanceMap) {
  auto device = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 32);
  engine::DeviceGuard guard(device);
  models::ModelConfig c;
  c.name = "pix2pixhd";
  c.size = "tiny";
  c.data = kDir;
  models::vision::Pix2PixHD model(c);
  EXPECT_NE(model.summary().find("2 Cityscapes-style images"), std::string::npos) << model.summary();
  bool checked = false;
  for (int64_t step = 1; step <= 2 && !checked; step++) {
    models::Batch b = model.make_batch(step);
    CityscapesBatch host;
    auto floats = [](const engine::Tensor& t) {
      const std::vector<double> d = t.to_double();
      return std::vector<float>(d.begin(), d.end());
    };
    host.labels = floats(b.at("labels"));
    host.instances = floats(b.at("instances"));
    const std::vector<float> in = floats(model.encode_input(b));  // [2, 64, 128, 6]
    for (int j = 0; j < 2; j++) {
      const int o = first_orientation(host, j);
      if (o < 0) continue;
      auto at = [&](int x, int y, int ch) { return in[size_t(((j * 64 + y) * 128 + (o ? 127 - x : x)) * 6 + ch)]; };
      EXPECT_EQ(at(39, 45, 5), 1.f);
      EXPECT_EQ(at(40, 45, 5), 1.f);
      EXPECT_EQ(at(25, 45, 5), 0.f);
      EXPECT_EQ(at(25, 45, 3), 1.f) << "one-hot class 3";
      EXPECT_EQ(at(25, 45, 1), 0.f);
      checked = true;
    }
  }
  EXPECT_TRUE(checked);
  for (int64_t s = 1; s <= 2; s++) EXPECT_TRUE(std::isfinite(model.train_step(s).losses.at("loss_G")));
}
