// allocator.cpp: best fit with splitting and coalescing (see allocator.h for the design notes).
#include "engine/allocator.h"

#include "engine/error.h"

namespace engine {

Allocator::Allocator(size_t capacity) : capacity_(capacity / kAlignment * kAlignment) {
  if (capacity_ > 0) insert_free(0, capacity_);
}

namespace {
constexpr size_t kMaxSpareNodes = 64;
}

void Allocator::put(OffsetMap& m, size_t key, size_t value) {
  if (spare_entries_.empty()) {
    m[key] = value;
    return;
  }
  OffsetMap::node_type n = std::move(spare_entries_.back());
  spare_entries_.pop_back();
  n.key() = key;
  n.mapped() = value;
  m.insert(std::move(n));
}

void Allocator::take(OffsetMap& m, OffsetMap::iterator it) {
  OffsetMap::node_type n = m.extract(it);
  if (spare_entries_.size() < kMaxSpareNodes) spare_entries_.push_back(std::move(n));
}

void Allocator::insert_free(size_t offset, size_t size) {
  put(free_by_offset_, offset, size);
  if (spare_sizes_.empty()) {
    free_by_size_.insert({size, offset});
    return;
  }
  SizeSet::node_type n = std::move(spare_sizes_.back());
  spare_sizes_.pop_back();
  n.value() = {size, offset};
  free_by_size_.insert(std::move(n));
}

void Allocator::erase_free(size_t offset, size_t size) {
  take(free_by_offset_, free_by_offset_.find(offset));
  SizeSet::node_type n = free_by_size_.extract({size, offset});
  if (n && spare_sizes_.size() < kMaxSpareNodes) spare_sizes_.push_back(std::move(n));
}

std::optional<size_t> Allocator::allocate(size_t bytes) {
  size_t size = round_up(bytes);
  auto it = free_by_size_.lower_bound({size, 0});  // smallest block >= size, lowest offset among equals
  if (it == free_by_size_.end()) return std::nullopt;
  auto [block_size, offset] = *it;
  erase_free(offset, block_size);
  if (block_size > size) insert_free(offset + size, block_size - size);  // split: tail stays free
  put(live_, offset, size);
  allocated_ += size;
  if (offset + size > high_water_) high_water_ = offset + size;
  return offset;
}

size_t Allocator::free(size_t offset) {
  auto it = live_.find(offset);
  ENGINE_CHECK(it != live_.end(), "allocator: free of offset ", offset, " which is not a live block");
  size_t size = it->second;
  take(live_, it);
  allocated_ -= size;
  size_t start = offset, end = offset + size;
  // Coalesce with the free neighbour after ...
  auto next = free_by_offset_.find(end);
  if (next != free_by_offset_.end()) {
    end += next->second;
    erase_free(next->first, next->second);
  }
  // ... and the free neighbour before.
  auto prev = free_by_offset_.lower_bound(start);
  if (prev != free_by_offset_.begin()) {
    --prev;
    if (prev->first + prev->second == start) {
      start = prev->first;
      erase_free(prev->first, prev->second);
    }
  }
  insert_free(start, end - start);
  return size;
}

size_t Allocator::end_in_use() const {
  if (live_.empty()) return 0;
  auto last = std::prev(live_.end());
  return last->first + last->second;
}

size_t Allocator::largest_free_block() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

}  // namespace engine
