// allocator.cpp: best fit with splitting and coalescing (see allocator.h for the design notes).
#include "engine/allocator.h"

#include <algorithm>
#include <type_traits>

#include "engine/error.h"

namespace engine {

Allocator::Allocator(size_t capacity) : capacity_(capacity / kAlignment * kAlignment) {
  live_.reserve(1024);
  free_starts_.reserve(1024);
  free_ends_.reserve(1024);
  if (capacity_ > 0) insert_free(0, capacity_);
}

namespace {
constexpr size_t kMaxSpareNodes = 64;

// Inserts `value` into `c` (a map's (key, mapped) pair or a set's key) in a node from `spares` when there is one;
// returns the entry's iterator.
template <typename C, typename Value>
typename C::iterator insert_reusing(C& c, std::vector<typename C::node_type>& spares, const Value& value) {
  if (spares.empty()) return c.insert(value).first;
  typename C::node_type n = std::move(spares.back());
  spares.pop_back();
  if constexpr (std::is_same_v<typename C::key_type, typename C::value_type>) {
    n.value() = value;
  } else {
    n.key() = value.first;
    n.mapped() = value.second;
  }
  return c.insert(std::move(n)).position;
}

// Takes the entry at `it` out of `c`, keeping its node in `spares` (up to kMaxSpareNodes).
template <typename C>
void erase_keeping(C& c, std::vector<typename C::node_type>& spares, typename C::iterator it) {
  typename C::node_type n = c.extract(it);
  if (spares.size() < kMaxSpareNodes) spares.push_back(std::move(n));
}
}  // namespace

void Allocator::insert_free(size_t offset, size_t size) {
  const SizeSet::iterator by_size = insert_reusing(free_by_size_, spare_sizes_, std::pair{size, offset});
  insert_reusing(free_starts_, spare_starts_, std::pair{offset, by_size});
  insert_reusing(free_ends_, spare_blocks_, std::pair{offset + size, offset});
}

void Allocator::erase_free(SizeSet::iterator by_size) {
  const auto [size, offset] = *by_size;
  erase_keeping(free_starts_, spare_starts_, free_starts_.find(offset));
  erase_keeping(free_ends_, spare_blocks_, free_ends_.find(offset + size));
  erase_keeping(free_by_size_, spare_sizes_, by_size);
}

std::optional<size_t> Allocator::allocate(size_t bytes) {
  size_t size = round_up(bytes);
  auto it = free_by_size_.lower_bound({size, 0});  // smallest block >= size, lowest offset among equals
  if (it == free_by_size_.end()) return std::nullopt;
  auto [block_size, offset] = *it;
  erase_free(it);
  if (block_size > size) insert_free(offset + size, block_size - size);  // split: tail stays free
  insert_reusing(live_, spare_blocks_, std::pair{offset, size});
  allocated_ += size;
  if (offset + size > high_water_) high_water_ = offset + size;
  return offset;
}

size_t Allocator::free(size_t offset) {
  auto it = live_.find(offset);
  ENGINE_CHECK(it != live_.end(), "allocator: free of offset ", offset, " which is not a live block");
  size_t size = it->second;
  erase_keeping(live_, spare_blocks_, it);
  allocated_ -= size;
  size_t start = offset, end = offset + size;
  // Coalesce with the free neighbour after ...
  if (auto next = free_starts_.find(end); next != free_starts_.end()) {
    end += next->second->first;
    erase_free(next->second);
  }
  // ... and the free neighbour before.
  if (auto prev = free_ends_.find(start); prev != free_ends_.end()) {
    start = prev->second;
    erase_free(free_starts_.find(start)->second);
  }
  insert_free(start, end - start);
  return size;
}

size_t Allocator::end_in_use() const {
  size_t end = 0;
  for (const auto& [offset, size] : live_) end = std::max(end, offset + size);
  return end;
}

size_t Allocator::largest_free_block() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

}  // namespace engine
