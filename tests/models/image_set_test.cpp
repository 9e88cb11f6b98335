// image_set_test.cpp: stylegan's --data reader (models/data/image_set.h) on tests/data/ffhq_sample (written by
// tests/data/make_vision_samples.py; its images are restated here: each half one colour, left | right): every image
// at any depth found and sorted, other files ignored, values v / 127.5 - 1 exactly at the model's own size, the
// mirror seeded (the halves swapped), a 48 x 48 grey image resized and repeated to RGB, the errors, and the model
// training on it.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/device.h"
#include "models/data/image_set.h"
#include "models/vision/stylegan.h"
#include "tests/util/error_util.h"

using models::data::ImageSet;

namespace {
const char* kDir = "tests/data/ffhq_sample";
float value(int v) { return float(v) / 127.5f - 1.f; }
}  // namespace

TEST(ImageSet, FindsSortsAndReadsImages) {
  ImageSet set(kDir);
  ASSERT_EQ(set.size(), 3);
  EXPECT_NE(set.paths()[0].find("00000/00000.png"), std::string::npos);
  EXPECT_NE(set.paths()[2].find("00000/00002.png"), std::string::npos);
  const int colours[3][2][3] = {
      {{250, 10, 10}, {10, 250, 10}}, {{10, 10, 250}, {250, 250, 10}}, {{200, 200, 200}, {40, 40, 40}}};
  int mirrored = 0, plain = 0;
  for (int64_t step = 1; step <= 6; step++) {
    const std::vector<float> b = set.batch(1, 32, 9, step);
    ASSERT_EQ(b.size(), size_t(32 * 32 * 3));
    // Which image: the one whose two colours the left and right edge columns hold, in either order.
    int which = -1, flip = -1;
    for (int i = 0; i < 3; i++)
      for (int f = 0; f < 2; f++)
        if (b[0] == value(colours[i][f][0]) && b[1] == value(colours[i][f][1]) &&
            b[(31 * 32 + 31) * 3 + 2] == value(colours[i][1 - f][2]))
          which = i, flip = f;
    ASSERT_GE(which, 0) << "step " << step << ": not one of the sample's images";
    (flip ? mirrored : plain)++;
    if (which < 2) {  // 32 x 32: every pixel exact
      for (int64_t y = 0; y < 32; y++)
        for (int64_t x = 0; x < 32; x++)
          for (int c = 0; c < 3; c++)
            ASSERT_EQ(b[size_t((y * 32 + x) * 3 + c)], value(colours[which][(x < 16) == (flip == 0) ? 0 : 1][c]));
    }
  }
  EXPECT_GT(mirrored, 0);
  EXPECT_GT(plain, 0);
  EXPECT_EQ(set.batch(2, 32, 9, 2), set.batch(2, 32, 9, 2)) << "seeded";
}

TEST(ImageSet, ErrorsNameTheFolder) {
  std::string e = testutil::error_of([] { ImageSet("tests/data/no_such_folder"); });
  EXPECT_NE(e.find("not a folder"), std::string::npos) << e;
  e = testutil::error_of([] { ImageSet("tests/data/hf_configs"); });
  EXPECT_NE(e.find("no .png, .jpg or .jpeg image"), std::string::npos) << e;
}

TEST(ImageSet, StyleGANTrainsOnIt) {
  auto device = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 32);
  engine::DeviceGuard guard(device);
  models::ModelConfig c;
  c.name = "stylegan";
  c.size = "tiny";
  c.data = kDir;
  models::vision::StyleGAN model(c);
  EXPECT_NE(model.summary().find("(3 images)"), std::string::npos) << model.summary();
  for (int64_t s = 1; s <= 2; s++) EXPECT_TRUE(std::isfinite(model.train_step(s).losses.at("loss_D")));
}
