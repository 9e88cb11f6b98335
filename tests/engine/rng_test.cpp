// rng_test.cpp: Philox-4x32-10 against the known-answer vectors of Random123 (Salmon et al.), and the
// generator's reservation rule.
#include <gtest/gtest.h>

#include "engine/rng.h"

TEST(Philox, KnownAnswers) {
  struct Kat {
    uint32_t ctr[4], key[2], expect[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    uint32_t out[4];
    engine::philox4x32_10_full(k.ctr, k.key, out);
    for (int i = 0; i < 4; i++) EXPECT_EQ(out[i], k.expect[i]) << "lane " << i;
  }
}

TEST(Philox, UniformIsAPureFunctionOfSeedAndPosition) {
  float a = engine::philox_uniform(42, 8, 5);
  float b = engine::philox_uniform(42, 12, 1);  // same absolute position 13
  EXPECT_EQ(a, b);
  EXPECT_NE(engine::philox_uniform(42, 8, 5), engine::philox_uniform(43, 8, 5));
  double mean = 0;
  for (int i = 0; i < 100000; i++) {
    float u = engine::philox_uniform(7, 0, uint64_t(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    mean += u;
  }
  EXPECT_NEAR(mean / 100000, 0.5, 0.005);
}

TEST(Generator, ReservesInMultiplesOfFour) {
  engine::manual_seed(3);
  EXPECT_EQ(engine::generator().reserve(5), 0u);
  EXPECT_EQ(engine::generator().reserve(1), 8u);
  EXPECT_EQ(engine::generator().offset, 12u);
  engine::manual_seed(3);
  EXPECT_EQ(engine::generator().offset, 0u);
}
