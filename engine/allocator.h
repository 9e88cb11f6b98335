// allocator.h: best-fit, coalescing allocator over the offsets of one arena. Pure policy, no memory.
//
// Design notes
// ------------
// * The arena is a contiguous range [0, capacity). The allocator hands out offsets into it; the device
//   turns an offset into a pointer (cpu, cuda) or into nothing at all (meta). Because the allocator never
//   looks at memory, the same sequence of requests produces the same sequence of offsets on every device:
//   that is what lets the meta device predict a GPU's peak and its out-of-memory point exactly.
// * Every request is rounded up to kAlignment (256) bytes, as cudaMalloc aligns, so a tensor's data is
//   always aligned for 16-byte vector loads.
// * Best fit: the smallest free block that is large enough; among equals, the lowest offset (so the choice
//   is deterministic). The block is split; the tail stays free. On free, a block merges with free
//   neighbours on both sides (coalescing), so free space never stays needlessly fragmented.
// * Vocabulary (as PyTorch's caching allocator): "requested" bytes are what the caller asked for,
//   "allocated" bytes are the rounded sizes of live blocks, "high water" is the largest end offset ever
//   used, and fragmentation at a moment is high water − allocated.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace engine {

class Allocator {
 public:
  static constexpr size_t kAlignment = 256;
  static size_t round_up(size_t bytes) {
    size_t b = bytes == 0 ? kAlignment : bytes;
    return (b + kAlignment - 1) / kAlignment * kAlignment;
  }

  explicit Allocator(size_t capacity);

  // Returns the offset of a block of round_up(bytes), or nothing when no free block is large enough.
  std::optional<size_t> allocate(size_t bytes);
  // Frees the block that starts at `offset` (must be live). Returns its rounded size.
  size_t free(size_t offset);

  size_t capacity() const { return capacity_; }
  size_t allocated() const { return allocated_; }      // rounded bytes of live blocks
  size_t high_water() const { return high_water_; }    // largest end offset ever used
  size_t end_in_use() const;                           // end offset of the last live block now (a scan)
  size_t largest_free_block() const;
  size_t live_blocks() const { return live_.size(); }
  size_t free_blocks() const { return free_by_size_.size(); }

 private:
  size_t capacity_;
  size_t allocated_ = 0;
  size_t high_water_ = 0;
  // Live blocks by offset; free blocks by (size, offset), by start and by end. Only best fit needs an order (the
  // set's lower_bound); the rest are exact lookups (a freed block's neighbours: the free block starting at its end and
  // the one ending at its start), so hash maps, a probe each, rather than trees a dozen levels deep.
  using SizeSet = std::set<std::pair<size_t, size_t>>;
  using Blocks = std::unordered_map<size_t, size_t>;
  using FreeStarts = std::unordered_map<size_t, SizeSet::iterator>;
  Blocks live_;             // offset -> size
  SizeSet free_by_size_;    // (size, offset): best fit = lower_bound
  FreeStarts free_starts_;  // offset -> its free_by_size_ entry
  Blocks free_ends_;        // offset + size -> offset
  // Nodes taken out of the containers above (extract) and put back in with new values, so that an allocation or a
  // free allocates no node (the meta device makes thousands of allocations a step: their nodes were a large share
  // of its host time). Behaviour unchanged: the containers hold the same values either way.
  std::vector<Blocks::node_type> spare_blocks_;
  std::vector<FreeStarts::node_type> spare_starts_;
  std::vector<SizeSet::node_type> spare_sizes_;

  void insert_free(size_t offset, size_t size);
  void erase_free(SizeSet::iterator by_size);  // the free block of that entry
};

}  // namespace engine
