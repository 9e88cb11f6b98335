// allocator.cpp: best fit with splitting and coalescing (see allocator.h for the design notes).
#include "engine/allocator.h"

#include <type_traits>

#include "engine/error.h"

namespace engine {

Allocator::Allocator(size_t capacity) : capacity_(capacity / kAlignment * kAlignment) {
  if (capacity_ > 0) insert_free(0, capacity_);
}

namespace {
constexpr size_t kMaxSpareNodes = 64;

// Inserts `value` into `tree` (a std::map's (key, mapped) pair or a std::set's key) in a node from `spares` when
// there is one.
template <typename Tree, typename Value>
void insert_reusing(Tree& tree, std::vector<typename Tree::node_type>& spares, const Value& value) {
  if (spares.empty()) {
    tree.insert(value);
    return;
  }
  typename Tree::node_type n = std::move(spares.back());
  spares.pop_back();
  if constexpr (std::is_same_v<typename Tree::key_type, typename Tree::value_type>) {
    n.value() = value;
  } else {
    n.key() = value.first;
    n.mapped() = value.second;
  }
  tree.insert(std::move(n));
}

// Takes the entry at `it` out of `tree`, keeping its node in `spares` (up to kMaxSpareNodes).
template <typename Tree>
void erase_keeping(Tree& tree, std::vector<typename Tree::node_type>& spares, typename Tree::iterator it) {
  typename Tree::node_type n = tree.extract(it);
  if (spares.size() < kMaxSpareNodes) spares.push_back(std::move(n));
}
}  // namespace

void Allocator::insert_free(size_t offset, size_t size) {
  insert_reusing(free_by_offset_, spare_entries_, std::pair{offset, size});
  insert_reusing(free_by_size_, spare_sizes_, std::pair{size, offset});
}

void Allocator::erase_free(size_t offset, size_t size) {
  erase_keeping(free_by_offset_, spare_entries_, free_by_offset_.find(offset));
  erase_keeping(free_by_size_, spare_sizes_, free_by_size_.find({size, offset}));
}

std::optional<size_t> Allocator::allocate(size_t bytes) {
  size_t size = round_up(bytes);
  auto it = free_by_size_.lower_bound({size, 0});  // smallest block >= size, lowest offset among equals
  if (it == free_by_size_.end()) return std::nullopt;
  auto [block_size, offset] = *it;
  erase_free(offset, block_size);
  if (block_size > size) insert_free(offset + size, block_size - size);  // split: tail stays free
  insert_reusing(live_, spare_entries_, std::pair{offset, size});
  allocated_ += size;
  if (offset + size > high_water_) high_water_ = offset + size;
  return offset;
}

size_t Allocator::free(size_t offset) {
  auto it = live_.find(offset);
  ENGINE_CHECK(it != live_.end(), "allocator: free of offset ", offset, " which is not a live block");
  size_t size = it->second;
  erase_keeping(live_, spare_entries_, it);
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
