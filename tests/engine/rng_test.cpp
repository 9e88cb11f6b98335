// rng_test.cpp: Philox-4x32-10 and -7 against the known-answer vectors of Random123 (Salmon et al.), the generator's
// reservation rule, and dropout's 16-bit draws against their definition (tests/util/dropout_reference.h).
#include <gtest/gtest.h>

#include "engine/rng.h"
#include "tests/util/dropout_reference.h"

// Random123's kat_vectors: the three inputs of its "philox4x32 10" and "philox4x32 7" lines (7: the rounds dropout
// draws with, engine::dropout_block).
TEST(Philox, KnownAnswers) {
  struct Input {
    uint32_t ctr[4], key[2];
  };
  const Input inputs[3] = {{{0, 0, 0, 0}, {0, 0}},
                           {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}},
                           {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}}};
  const uint32_t ten[3][4] = {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
                              {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                              {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
  const uint32_t seven[3][4] = {{0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48},
                                {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662},
                                {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}};
  for (int v = 0; v < 3; v++) {
    uint32_t out[4];
    engine::philox4x32_10_full(inputs[v].ctr, inputs[v].key, out);
    for (int i = 0; i < 4; i++) EXPECT_EQ(out[i], ten[v][i]) << "10 rounds, vector " << v << ", lane " << i;
    engine::philox4x32_rounds<7>(inputs[v].ctr, inputs[v].key, out);
    for (int i = 0; i < 4; i++) EXPECT_EQ(out[i], seven[v][i]) << "7 rounds, vector " << v << ", lane " << i;
  }
  // dropout_block is that generator at counter (block, 0) keyed by the seed.
  const uint32_t ctr[4] = {5, 0, 0, 0}, key[2] = {42, 0};
  uint32_t a[4], b[4];
  engine::philox4x32_rounds<7>(ctr, key, a);
  engine::dropout_block(42, 5, b);
  for (int i = 0; i < 4; i++) EXPECT_EQ(a[i], b[i]) << "lane " << i;
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

TEST(DropoutDraw, SixteenBitHalvesOfTheGeneratorsNumbers) {
  // Element e at offset 8 is half e % 2 of number 8 + e / 2; the halves of block 2 are elements 0..7.
  uint32_t r[4];
  engine::dropout_block(42, 2, r);
  for (uint64_t e = 0; e < 8; e++) {
    const uint32_t word = r[e / 2], half = e % 2 ? word >> 16 : word & 0xffffu;
    EXPECT_EQ(engine::dropout_bits(42, 8, e), half) << "element " << e;
    EXPECT_EQ(engine::philox_half(r, uint32_t(e)), half);
  }
  EXPECT_EQ(engine::dropout_bits(42, 8, 9), engine::dropout_bits(42, 12, 1)) << "a pure function of the position";
  EXPECT_EQ(engine::dropout_numbers(5), 3u);
  EXPECT_EQ(engine::dropout_numbers(8), 4u);
}

TEST(DropoutDraw, RateRoundsPUpToSixteenBitsAndScalesExactly) {
  EXPECT_EQ(engine::dropout_rate(0.1).threshold, 6554u);  // ceil(6553.6)
  EXPECT_DOUBLE_EQ(engine::dropout_rate(0.1).keep_scale, 65536.0 / (65536 - 6554));
  EXPECT_EQ(engine::dropout_rate(0.25).threshold, 16384u);  // exact: 0.25 * 2^16
  EXPECT_DOUBLE_EQ(engine::dropout_rate(0.25).keep_scale, 4.0 / 3.0);
  EXPECT_EQ(engine::dropout_rate(0).threshold, 0u);
  EXPECT_EQ(engine::dropout_rate(0).keep_scale, 1.0);
  EXPECT_EQ(engine::dropout_rate(1).threshold, 65536u);  // nothing kept
  EXPECT_EQ(engine::dropout_rate(1).keep_scale, 0.0);
  // The kept fraction over many draws is 1 - p_q, and the definition's restatement agrees element for element.
  const double p = 0.3;
  int64_t kept = 0;
  const int64_t n = 200000;
  for (int64_t e = 0; e < n; e++) {
    const bool keep = engine::dropout_bits(7, 4, uint64_t(e)) >= engine::dropout_rate(p).threshold;
    ASSERT_EQ(keep, testutil::dropout_keeps(7, 4, uint64_t(e), p)) << "element " << e;
    kept += keep;
  }
  EXPECT_NEAR(double(kept) / double(n), 1 - p, 0.005);
}
