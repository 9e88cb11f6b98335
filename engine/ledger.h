// ledger.h: who holds every byte of the arena, why, and what was alive at the worst moment.
//
// Design notes
// ------------
// * Every block the allocator hands out is recorded with its tags: category (why it exists), owner
//   (module path + op), phase, requested and rounded bytes, offset. Categories:
//     param       model parameters             grad        their gradients
//     optimizer   optimizer state (moments)    activation  tensors saved by autograd for backward
//     temp        everything else that lives within an op or a step (outputs not saved, scratch)
//     workspace   library workspaces (cuBLASLt) input       the batch (token ids, images, labels)
//     kv_cache    a decoder's attention keys and values kept for generation (models/nn/attention.h KVCache)
//     comm        communication buffers: data parallel's gradient buckets (graph/data_parallel.h)
//   A block may change category once it exists: an op output starts as `temp` and becomes `activation`
//   when a backward node saves it (retag).
// * Counters: live bytes now and at peak, in total and per category (each category's own peak), the
//   allocation count, and the arena high water from the allocator. Invariant (check()): the per-category
//   sums equal the live total.
// * The peak snapshot is not copied at every new peak (that would cost O(live) per allocation during a
//   forward pass). Instead every event has a sequence number; the ledger remembers the sequence number of
//   the peak, and the snapshot is rebuilt on request from the blocks alive at that number: those still
//   live and those in the history of freed blocks. When the history grows large it is compacted, the
//   peak snapshot being materialized first, so memory stays bounded on long runs.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/context.h"

namespace engine {


struct BlockInfo {
  int64_t id = -1;
  Category category = Category::temp;
  Phase phase = Phase::setup;
  std::string owner;
  size_t requested = 0, rounded = 0, offset = 0;
  int64_t alloc_seq = 0;
  int64_t free_seq = -1;  // -1 while live
  // With Ledger::set_detail (engine_train --explain): the tensor's dtype and shape at its allocation ("f32 [8, 64]"),
  // why it outlives its op ("saved by linear for its backward": autograd's own record of what a backward keeps),
  // and the moment of its free (phase and the owner running then).
  std::string what, reason, free_owner;
  Phase free_phase = Phase::setup;
};

// One allocation or free of a ledger's history: `blocks` (Ledger::history()) as the events they were, in the
// order they happened. The exports (events_csv here, the Chrome trace and memory_viz in tools/) walk these.
struct LedgerEvent {
  int64_t seq;
  bool alloc;
  const BlockInfo* block;
};
std::vector<LedgerEvent> events_in_order(const std::vector<BlockInfo>& blocks);

// The groupings of the peak tables (an owner is "<module path>/<op>", e.g. "encoder.layer.3.attention/softmax"):
// the module at `depth` dots ("encoder.layer.3"; "(no module)" without one) and the layer type with its op
// ("attention/softmax": the last piece of the path that is not a number; "(untagged)" when there is none).
std::string owner_module(const std::string& owner, int depth);
std::string owner_layer_type(const std::string& owner);

class Ledger {
 public:
  // Records a new block; returns its id. The owner is an index of the ledger's owner table (owner_now, intern_owner)
  // or, in the second form, the string itself.
  int64_t on_alloc(size_t offset, size_t requested, size_t rounded, Category category, int32_t owner, Phase phase,
                   std::string what = "");
  int64_t on_alloc(size_t offset, size_t requested, size_t rounded, Category category, const std::string& owner,
                   Phase phase, std::string what = "") {
    return on_alloc(offset, requested, rounded, category, intern_owner(owner), phase, std::move(what));
  }
  // The running code's owner (current_owner(): module path and op) in the owner table: joined and looked up once per
  // path and op, not at every allocation.
  int32_t owner_now();
  // The index of `owner` in the owner table (added the first time).
  int32_t intern_owner(const std::string& owner);
  void on_free(int64_t id);
  void retag(int64_t id, Category category);
  // Detail for explanations (off by default: it costs a string per block): BlockInfo::what, reason, free_*.
  void set_detail(bool on) { detail_ = on; }
  bool detail() const { return detail_; }
  // Adds `reason` to a live block's reasons (with detail on; a block saved by two ops lists both).
  void annotate(int64_t id, const std::string& reason);
  Category category(int64_t id) const;
  void set_owner(int64_t id, std::string owner);
  const std::string& owner(int64_t id) const;
  // Called by the device after every allocation so the peak records the arena's state too.
  void note_high_water(size_t high_water) { high_water_ = high_water; }

  size_t live_bytes() const { return live_total_; }
  size_t live_bytes(Category c) const { return live_[int(c)]; }
  size_t peak_bytes() const { return peak_total_; }
  size_t peak_bytes(Category c) const { return peak_[int(c)]; }
  // Per-category bytes at the moment of the total peak (these sum to peak_bytes()).
  size_t peak_breakdown(Category c) const { return at_peak_[int(c)]; }
  size_t high_water() const { return high_water_; }
  size_t fragmentation_at_peak() const { return high_water_at_peak_ - peak_total_; }
  int64_t alloc_count() const { return alloc_count_; }
  int64_t sequence() const { return seq_; }

  // Blocks alive now, and alive at the peak (rebuilt from the history).
  std::vector<BlockInfo> live_blocks() const;
  std::vector<BlockInfo> peak_snapshot() const;
  // Every block recorded since the last compaction, live and freed, in allocation order.
  std::vector<BlockInfo> history() const;

  // Starts a new peak measurement from the current live state (e.g. at the start of a step).
  void reset_peak();
  // Throws if per-category sums disagree with the total (a bookkeeping bug).
  void check() const;

  // Exports. Time axis of the trace is the event sequence number (deterministic on every device).
  std::string events_csv() const;
  // The blocks alive at the peak grouped by category, by module (owner_module at module_depth) and by layer type
  // / op (owner_layer_type), and the allocation that set the peak (the block allocated at the peak's sequence
  // number: its owner and phase say when the peak happened; id -1 before any allocation).
  struct GroupTotal {
    size_t bytes = 0;
    int blocks = 0;
  };
  struct PeakGroups {
    std::map<std::string, GroupTotal> by_category, by_module, by_op;
    BlockInfo moment;
  };
  PeakGroups peak_groups(int module_depth = 3) const;
  // Markdown tables of those groups: by category, by module, by layer type / op.
  std::string peak_table_markdown(int module_depth = 3) const;

  void set_history_limit(size_t n) { history_limit_ = n; }

 private:
  // A block as the ledger keeps it, live or freed, holding no heap memory: its owner (and, with detail, its other
  // strings) as an index into tables that keep each string once. (The history as BlockInfos, four strings each, was a
  // third of the meta device's time in 2026-12-04's profile: mtdnn's 300 steps took 2.2 s, 1.4 s without a history.
  // Live blocks then still kept their owner as a string: a copy of the module path per allocation, hashed again when
  // it was freed.)
  struct Record {
    int64_t id, alloc_seq, free_seq;  // free_seq -1 while live
    size_t requested, rounded, offset;
    int32_t owner;   // owners_[owner]
    int32_t detail;  // freed: details_[detail], or -1 (detail off); live: -1 (live_details_ holds theirs)
    Category category;
    Phase phase;
  };
  struct Detail {
    std::string what, reason, free_owner;
    Phase free_phase = Phase::setup;
  };
  std::unordered_map<int64_t, Record> live_map_;
  std::unordered_map<int64_t, Detail> live_details_;  // with detail on: the live blocks' what and reason
  std::vector<Record> freed_;                         // history of freed blocks since compaction
  std::vector<Detail> details_;
  std::deque<std::string> owners_;  // (a deque: owner() hands out references that later owners must not move)
  std::unordered_map<std::string, int32_t> owner_index_;
  // owner_now's last answer and the scope version and op it was for.
  uint64_t owner_version_ = 0;
  const char* owner_op_ = nullptr;
  int32_t owner_now_ = -1;
  std::vector<BlockInfo> materialized_peak_;    // valid when materialized_seq_ == peak_seq_
  int64_t materialized_seq_ = -1;
  std::array<size_t, kNumCategories> live_{}, peak_{}, at_peak_{};
  size_t live_total_ = 0, peak_total_ = 0;
  size_t high_water_ = 0, high_water_at_peak_ = 0;
  int64_t seq_ = 0, peak_seq_ = 0, next_id_ = 0, alloc_count_ = 0;
  size_t history_limit_ = size_t(1) << 20;
  bool detail_ = false;

  void update_peak();
  void compact();
  void clear_history();
  BlockInfo block_of(const Record& r) const;
  const Record& live(int64_t id, const char* what) const;  // a live block's record; `what` names the caller
  Record& live(int64_t id, const char* what);
};

}  // namespace engine
