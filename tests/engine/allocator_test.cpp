// allocator_test.cpp: best fit, splitting, coalescing, fragmentation, determinism, the same choices as a brute-force
// best fit over random requests, and the out-of-memory report of a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "engine/allocator.h"
#include "engine/device.h"
#include "engine/tensor.h"

using engine::Allocator;

TEST(Allocator, RoundsTo256) {
  EXPECT_EQ(Allocator::round_up(1), 256u);
  EXPECT_EQ(Allocator::round_up(256), 256u);
  EXPECT_EQ(Allocator::round_up(257), 512u);
  EXPECT_EQ(Allocator::round_up(0), 256u);
}

TEST(Allocator, BestFitPicksTheSmallestHoleThatFits) {
  Allocator a(1 << 20);
  size_t big = *a.allocate(4096);      // [0, 4096)
  size_t sep1 = *a.allocate(256);      // separator so holes do not merge
  size_t small = *a.allocate(1024);    // [4352, 5376)
  size_t sep2 = *a.allocate(256);
  a.free(big);
  a.free(small);
  // Both holes fit 1000 bytes; best fit takes the 1024-byte hole, not the first (4096) one.
  EXPECT_EQ(*a.allocate(1000), small);
  // 2000 bytes only fit the big hole, which is split: the tail stays free.
  EXPECT_EQ(*a.allocate(2000), big);
  EXPECT_EQ(*a.allocate(2048), big + 2048);
  (void)sep1;
  (void)sep2;
}

TEST(Allocator, CoalescesNeighboursOnBothSides) {
  Allocator a(1 << 16);
  size_t x = *a.allocate(256), y = *a.allocate(256), z = *a.allocate(256);
  size_t w = *a.allocate(256);
  EXPECT_EQ(a.free_blocks(), 1u);  // the tail
  a.free(x);
  a.free(z);
  EXPECT_EQ(a.free_blocks(), 3u);
  a.free(y);  // merges with x before and z after
  EXPECT_EQ(a.free_blocks(), 2u);
  EXPECT_EQ(a.largest_free_block(), (1u << 16) - 1024u);
  EXPECT_EQ(*a.allocate(768), x);  // the merged 768-byte hole fits exactly
  a.free(w);
  a.free(x);
  EXPECT_EQ(a.free_blocks(), 1u);
  EXPECT_EQ(a.allocated(), 0u);
  EXPECT_EQ(a.largest_free_block(), size_t(1) << 16);
}

TEST(Allocator, HighWaterAndFragmentation) {
  Allocator a(1 << 20);
  size_t p = *a.allocate(1024);
  size_t q = *a.allocate(1024);
  a.free(p);
  EXPECT_EQ(a.allocated(), 1024u);
  EXPECT_EQ(a.high_water(), 2048u);
  EXPECT_EQ(a.end_in_use(), q + 1024);
  // A request larger than the hole goes past it: high water grows although 1024 bytes sit free below.
  a.allocate(2048);
  EXPECT_EQ(a.high_water(), 4096u);
}

TEST(Allocator, ReturnsNothingWhenNoHoleFits) {
  Allocator a(4096);
  size_t b0 = *a.allocate(1024);
  a.allocate(1024);
  a.allocate(1024);
  a.allocate(1024);
  a.free(b0);
  EXPECT_FALSE(a.allocate(2048).has_value());  // 1024 free, but not 2048
  EXPECT_TRUE(a.allocate(1024).has_value());
}

TEST(Allocator, DeterministicSequence) {
  auto run = [] {
    Allocator a(size_t(1) << 30);
    std::mt19937_64 rng(123);
    std::vector<size_t> live, offsets;
    for (int i = 0; i < 5000; i++) {
      if (!live.empty() && rng() % 3 == 0) {
        size_t k = rng() % live.size();
        a.free(live[k]);
        live.erase(live.begin() + long(k));
      } else {
        size_t off = *a.allocate(1 + rng() % 100000);
        live.push_back(off);
        offsets.push_back(off);
      }
    }
    return offsets;
  };
  EXPECT_EQ(run(), run());
}

// The policy of allocator.h's notes, written as plainly as possible: the arena as a list of blocks in offset order,
// best fit by a scan of every free block (smallest that fits, lowest offset among equals), the tail of a split left
// free, a freed block merged with its free neighbours. The allocator must choose the same offsets and keep the same
// books for any sequence of requests, whatever containers it uses to find them fast.
class BruteForceArena {
 public:
  explicit BruteForceArena(size_t capacity) { blocks_.push_back({0, capacity, true}); }
  std::optional<size_t> allocate(size_t bytes) {
    const size_t size = Allocator::round_up(bytes);
    size_t best = blocks_.size();
    for (size_t i = 0; i < blocks_.size(); i++)
      if (blocks_[i].free && blocks_[i].size >= size &&
          (best == blocks_.size() || blocks_[i].size < blocks_[best].size))
        best = i;
    if (best == blocks_.size()) return std::nullopt;
    Block& b = blocks_[best];
    if (b.size > size) blocks_.insert(blocks_.begin() + long(best) + 1, {b.offset + size, b.size - size, true});
    blocks_[best].size = size;
    blocks_[best].free = false;
    return blocks_[best].offset;
  }
  size_t free(size_t offset) {
    size_t i = 0;
    while (blocks_[i].offset != offset) i++;
    const size_t size = blocks_[i].size;
    blocks_[i].free = true;
    if (i + 1 < blocks_.size() && blocks_[i + 1].free) {
      blocks_[i].size += blocks_[i + 1].size;
      blocks_.erase(blocks_.begin() + long(i) + 1);
    }
    if (i > 0 && blocks_[i - 1].free) {
      blocks_[i - 1].size += blocks_[i].size;
      blocks_.erase(blocks_.begin() + long(i));
    }
    return size;
  }
  size_t allocated() const { return sum(false); }
  size_t free_blocks() const { return count(true); }
  size_t live_blocks() const { return count(false); }
  size_t largest_free_block() const {
    size_t m = 0;
    for (const Block& b : blocks_)
      if (b.free) m = std::max(m, b.size);
    return m;
  }
  size_t end_in_use() const {
    for (size_t i = blocks_.size(); i-- > 0;)
      if (!blocks_[i].free) return blocks_[i].offset + blocks_[i].size;
    return 0;
  }

 private:
  struct Block {
    size_t offset, size;
    bool free;
  };
  std::vector<Block> blocks_;
  size_t sum(bool free) const {
    size_t s = 0;
    for (const Block& b : blocks_)
      if (b.free == free) s += b.size;
    return s;
  }
  size_t count(bool free) const {
    size_t n = 0;
    for (const Block& b : blocks_) n += b.free == free;
    return n;
  }
};

TEST(Allocator, ChoosesWhatABruteForceBestFitChooses) {
  for (uint64_t seed = 0; seed < 6; seed++) {
    const size_t capacity = size_t(1) << (20 + seed);
    Allocator a(capacity);
    BruteForceArena ref(capacity);
    std::mt19937_64 rng(seed);
    std::vector<size_t> live;
    for (int i = 0; i < 4000; i++) {
      if (!live.empty() && rng() % 100 < 45) {
        const size_t k = rng() % live.size();
        ASSERT_EQ(a.free(live[k]), ref.free(live[k])) << "seed " << seed << ", request " << i;
        live[k] = live.back();
        live.pop_back();
      } else {
        // Small, medium and rare large requests: holes of many sizes, equal sizes, and requests that fail.
        const uint64_t kind = rng() % 20;
        const size_t bytes = kind < 8 ? rng() % 600 : kind < 19 ? rng() % (capacity / 64) : rng() % (capacity / 3);
        const std::optional<size_t> got = a.allocate(bytes), want = ref.allocate(bytes);
        ASSERT_EQ(got, want) << "seed " << seed << ", request " << i << " of " << bytes << " bytes";
        if (got) live.push_back(*got);
      }
      ASSERT_EQ(a.allocated(), ref.allocated()) << "seed " << seed << ", request " << i;
      ASSERT_EQ(a.free_blocks(), ref.free_blocks()) << "seed " << seed << ", request " << i;
      ASSERT_EQ(a.live_blocks(), ref.live_blocks()) << "seed " << seed << ", request " << i;
      ASSERT_EQ(a.largest_free_block(), ref.largest_free_block()) << "seed " << seed << ", request " << i;
      ASSERT_EQ(a.end_in_use(), ref.end_in_use()) << "seed " << seed << ", request " << i;
    }
  }
}

TEST(Device, OutOfMemoryReportNamesTheProblem) {
  auto dev = engine::Device::create(engine::DeviceType::meta, 1 << 20);
  engine::DeviceGuard g(dev);
  engine::MemoryScope scope("encoder.layer.3");
  engine::Tensor keep = engine::Tensor::empty({1024, 128}, engine::DType::f32);  // 512 KiB
  try {
    engine::OpScope op("softmax");
    engine::Tensor t = engine::Tensor::empty({1024, 256}, engine::DType::f32);  // 1 MiB: does not fit
    FAIL() << "expected OutOfMemory";
  } catch (const engine::OutOfMemory& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.requested, size_t(1) << 20);
    EXPECT_NE(msg.find("encoder.layer.3/softmax"), std::string::npos) << msg;
    EXPECT_NE(msg.find("capacity 1.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("temp 512.00 KiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("largest free block 512.00 KiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("encoder.layer.3"), std::string::npos) << msg;
  }
  // Nothing leaked by the failed request.
  EXPECT_EQ(dev->ledger().live_bytes(), size_t(512) << 10);
}

TEST(Device, CpuAndMetaMakeTheSameDecisions) {
  auto cpu = engine::Device::create(engine::DeviceType::cpu, size_t(1) << 28);
  auto meta = engine::Device::create(engine::DeviceType::meta, size_t(1) << 28);
  for (auto dev : {cpu, meta}) {
    std::mt19937_64 rng(5);
    std::vector<engine::Tensor> live;
    for (int i = 0; i < 300; i++) {
      if (!live.empty() && rng() % 3 == 0) live.erase(live.begin() + long(rng() % live.size()));
      else live.push_back(engine::Tensor::empty({int64_t(1 + rng() % 5000)}, engine::DType::f32, dev));
    }
  }
  EXPECT_EQ(cpu->ledger().events_csv(), meta->ledger().events_csv());
  EXPECT_EQ(cpu->ledger().peak_bytes(), meta->ledger().peak_bytes());
  EXPECT_GT(cpu->ledger().peak_bytes(), 0u);
}
