// ledger.cpp: counters, the peak snapshot and the exports (see ledger.h).
#include "engine/ledger.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "engine/error.h"
#include "engine/format.h"
#include "engine/json.h"

namespace engine {

const char* category_name(Category c) {
  switch (c) {
    case Category::param: return "param";
    case Category::grad: return "grad";
    case Category::optimizer: return "optimizer";
    case Category::activation: return "activation";
    case Category::temp: return "temp";
    case Category::workspace: return "workspace";
    case Category::input: return "input";
    case Category::kv_cache:
      return "kv_cache";
    case Category::comm:
      return "comm";
    default: return "?";
  }
}

int64_t Ledger::on_alloc(size_t offset, size_t requested, size_t rounded, Category category, int32_t owner, Phase phase,
                         std::string what) {
  const int64_t id = next_id_++;
  live_map_.emplace(id, Record{id, ++seq_, -1, requested, rounded, offset, owner, -1, category, phase});
  if (detail_) live_details_[id].what = std::move(what);
  live_[int(category)] += rounded;
  live_total_ += rounded;
  alloc_count_++;
  update_peak();
  return id;
}

void Ledger::on_free(int64_t id) {
  auto it = live_map_.find(id);
  ENGINE_CHECK(it != live_map_.end(), "ledger: free of unknown block ", id);
  Record r = it->second;
  live_map_.erase(it);
  live_[int(r.category)] -= r.rounded;
  live_total_ -= r.rounded;
  r.free_seq = ++seq_;
  if (detail_) {
    Detail d;
    if (auto dit = live_details_.find(id); dit != live_details_.end()) {
      d = std::move(dit->second);
      live_details_.erase(dit);
    }
    d.free_owner = current_owner();
    d.free_phase = context().phase;
    details_.push_back(std::move(d));
    r.detail = int32_t(details_.size() - 1);
  }
  freed_.push_back(r);
  if (freed_.size() > history_limit_) compact();
}

int32_t Ledger::intern_owner(const std::string& owner) {
  auto it = owner_index_.find(owner);
  if (it != owner_index_.end()) return it->second;
  const int32_t id = int32_t(owners_.size());
  owners_.push_back(owner);
  owner_index_.emplace(owner, id);
  return id;
}

// The cached answer holds while the scope version and the op pointer are the ones it was for: a version names one
// path (ScopeStack), and an op name stays alive and unchanged while it is the context's op (string literals, or a
// backward node's name for the node's run, which draws a version of its own).
int32_t Ledger::owner_now() {
  const Context& c = context();
  if (owner_now_ < 0 || c.scopes.version() != owner_version_ || c.op != owner_op_) {
    owner_now_ = intern_owner(current_owner());
    owner_version_ = c.scopes.version();
    owner_op_ = c.op;
  }
  return owner_now_;
}

BlockInfo Ledger::block_of(const Record& r) const {
  BlockInfo b;
  b.id = r.id;
  b.category = r.category;
  b.phase = r.phase;
  b.owner = owners_[size_t(r.owner)];
  b.requested = r.requested;
  b.rounded = r.rounded;
  b.offset = r.offset;
  b.alloc_seq = r.alloc_seq;
  b.free_seq = r.free_seq;
  const Detail* d = nullptr;
  if (r.free_seq < 0) {
    auto it = live_details_.find(r.id);
    if (it != live_details_.end()) d = &it->second;
  } else if (r.detail >= 0) {
    d = &details_[size_t(r.detail)];
  }
  if (d) {
    b.what = d->what;
    b.reason = d->reason;
    b.free_owner = d->free_owner;
    b.free_phase = d->free_phase;
  }
  return b;
}

const Ledger::Record& Ledger::live(int64_t id, const char* what) const {
  auto it = live_map_.find(id);
  ENGINE_CHECK(it != live_map_.end(), "ledger: ", what, " of unknown block ", id);
  return it->second;
}
Ledger::Record& Ledger::live(int64_t id, const char* what) {
  auto it = live_map_.find(id);
  ENGINE_CHECK(it != live_map_.end(), "ledger: ", what, " of unknown block ", id);
  return it->second;
}

void Ledger::clear_history() {
  freed_.clear();
  details_.clear();
}

void Ledger::retag(int64_t id, Category category) {
  Record& r = live(id, "retag");
  if (r.category == category) return;
  live_[int(r.category)] -= r.rounded;
  r.category = category;
  live_[int(category)] += r.rounded;
  ++seq_;
  update_peak();
}

void Ledger::annotate(int64_t id, const std::string& reason) {
  if (!detail_) return;
  live(id, "annotate");  // (the check that the block is live)
  std::string& r = live_details_[id].reason;
  if (r.find(reason) == std::string::npos) r += (r.empty() ? "" : "; ") + reason;
}

Category Ledger::category(int64_t id) const { return live(id, "category").category; }

void Ledger::set_owner(int64_t id, std::string owner) {
  const int32_t index = intern_owner(owner);
  live(id, "set_owner").owner = index;
}

const std::string& Ledger::owner(int64_t id) const { return owners_[size_t(live(id, "owner").owner)]; }

void Ledger::update_peak() {
  for (int c = 0; c < kNumCategories; c++) peak_[c] = std::max(peak_[c], live_[c]);
  if (live_total_ > peak_total_ || (live_total_ == peak_total_ && peak_seq_ == 0)) {
    peak_total_ = live_total_;
    peak_seq_ = seq_;
    at_peak_ = live_;
    high_water_at_peak_ = std::max(high_water_, live_total_);
  }
}

void Ledger::reset_peak() {
  materialized_peak_.clear();
  materialized_seq_ = -1;
  clear_history();
  peak_ = live_;
  at_peak_ = live_;
  peak_total_ = live_total_;
  peak_seq_ = seq_;
  high_water_at_peak_ = std::max(high_water_, live_total_);
  materialized_peak_ = live_blocks();
  materialized_seq_ = peak_seq_;
}

void Ledger::check() const {
  size_t sum = 0;
  for (int c = 0; c < kNumCategories; c++) sum += live_[c];
  ENGINE_CHECK(sum == live_total_, "ledger invariant broken: category sums ", sum, " != live total ",
               live_total_);
  size_t blocks = 0;
  for (const auto& [id, r] : live_map_) blocks += r.rounded;
  ENGINE_CHECK(blocks == live_total_, "ledger invariant broken: live blocks sum to ", blocks,
               " but live total is ", live_total_);
}

std::vector<BlockInfo> Ledger::live_blocks() const {
  std::vector<BlockInfo> out;
  out.reserve(live_map_.size());
  for (const auto& [id, r] : live_map_) out.push_back(block_of(r));
  std::sort(out.begin(), out.end(), [](const BlockInfo& a, const BlockInfo& b) { return a.id < b.id; });
  return out;
}

std::vector<BlockInfo> Ledger::peak_snapshot() const {
  if (materialized_seq_ == peak_seq_) return materialized_peak_;
  std::vector<BlockInfo> out;
  for (const Record& f : freed_)
    if (f.alloc_seq <= peak_seq_ && f.free_seq > peak_seq_) out.push_back(block_of(f));
  for (const auto& [id, r] : live_map_)
    if (r.alloc_seq <= peak_seq_) out.push_back(block_of(r));
  std::sort(out.begin(), out.end(), [](const BlockInfo& a, const BlockInfo& b) { return a.id < b.id; });
  return out;
}

void Ledger::compact() {
  materialized_peak_ = peak_snapshot();
  materialized_seq_ = peak_seq_;
  clear_history();
}

std::vector<BlockInfo> Ledger::history() const {
  std::vector<BlockInfo> out;
  out.reserve(freed_.size() + live_map_.size());
  for (const Record& f : freed_) out.push_back(block_of(f));
  for (const auto& [id, r] : live_map_) out.push_back(block_of(r));
  std::sort(out.begin(), out.end(), [](const BlockInfo& a, const BlockInfo& b) { return a.id < b.id; });
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Exports

std::vector<LedgerEvent> events_in_order(const std::vector<BlockInfo>& blocks) {
  std::vector<LedgerEvent> ev;
  for (const auto& b : blocks) {
    ev.push_back({b.alloc_seq, true, &b});
    if (b.free_seq >= 0) ev.push_back({b.free_seq, false, &b});
  }
  std::sort(ev.begin(), ev.end(), [](const LedgerEvent& a, const LedgerEvent& b) { return a.seq < b.seq; });
  return ev;
}

std::string Ledger::events_csv() const {
  std::vector<BlockInfo> blocks = history();
  std::vector<LedgerEvent> ev = events_in_order(blocks);
  std::ostringstream os;
  os << "seq,event,block,category,phase,owner,requested,rounded,offset\n";
  for (const LedgerEvent& e : ev) {
    const BlockInfo& b = *e.block;
    os << e.seq << ',' << (e.alloc ? "alloc" : "free") << ',' << b.id << ',' << category_name(b.category)
       << ',' << phase_name(b.phase) << ",\"" << b.owner << "\"," << b.requested << ',' << b.rounded << ','
       << b.offset << '\n';
  }
  return os.str();
}

// "encoder.layer.3.attention/softmax" -> module at depth d: "encoder.layer.3"
std::string owner_module(const std::string& owner, int depth) {
  std::string scope = owner.substr(0, owner.find('/'));
  if (scope.empty()) return "(no module)";
  size_t pos = 0;
  for (int i = 0; i < depth; i++) {
    pos = scope.find('.', pos);
    if (pos == std::string::npos) return scope;
    pos++;
  }
  return scope.substr(0, pos - 1);
}
// "encoder.layer.3.attention/softmax" -> "attention/softmax"; digits-only pieces are skipped.
std::string owner_layer_type(const std::string& owner) {
  size_t slash = owner.find('/');
  std::string scope = owner.substr(0, slash), op = slash == std::string::npos ? "" : owner.substr(slash);
  std::string last;
  size_t start = 0;
  while (start <= scope.size()) {
    size_t dot = scope.find('.', start);
    std::string piece = scope.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !piece.empty() && std::all_of(piece.begin(), piece.end(), ::isdigit);
    if (!piece.empty() && !digits) last = piece;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  std::string t = last + op;
  return t.empty() ? "(untagged)" : t;
}

namespace {
// "h.2" before "h.10": digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit((unsigned char)a[i]) && std::isdigit((unsigned char)b[j])) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit((unsigned char)a[i2])) i2++;
      while (j2 < b.size() && std::isdigit((unsigned char)b[j2])) j2++;
      // As numbers, without converting (a run of any length compares): fewer digits, after leading zeros, is less.
      size_t i0 = i, j0 = j;
      while (i0 + 1 < i2 && a[i0] == '0') i0++;
      while (j0 + 1 < j2 && b[j0] == '0') j0++;
      if (i2 - i0 != j2 - j0) return i2 - i0 < j2 - j0;
      const int c = a.compare(i0, i2 - i0, b, j0, j2 - j0);
      if (c != 0) return c < 0;
      i = i2;
      j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      i++;
      j++;
    }
  }
  return a.size() - i < b.size() - j;
}

void table(std::ostringstream& os, const char* title, const std::map<std::string, Ledger::GroupTotal>& rows,
           size_t total, size_t max_rows) {
  std::vector<std::pair<std::string, Ledger::GroupTotal>> v(rows.begin(), rows.end());
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) {
    if (a.second.bytes != b.second.bytes) return a.second.bytes > b.second.bytes;
    return natural_less(a.first, b.first);
  });
  os << "| " << title << " | bytes | share | blocks |\n|---|---:|---:|---:|\n";
  size_t shown = 0;
  for (auto& [name, val] : v) {
    if (shown++ == max_rows) {
      os << "| … " << (v.size() - max_rows) << " more | | | |\n";
      break;
    }
    os << "| " << name << " | " << format_bytes(val.bytes) << " | "
       << format_fixed(total ? 100.0 * val.bytes / total : 0, 1) << "% | " << val.blocks << " |\n";
  }
  os << "\n";
}
}  // namespace

Ledger::PeakGroups Ledger::peak_groups(int module_depth) const {
  PeakGroups g;
  for (const auto& b : peak_snapshot()) {
    for (auto [map, key] : {std::pair{&g.by_category, std::string(category_name(b.category))},
                            std::pair{&g.by_module, owner_module(b.owner, module_depth)},
                            std::pair{&g.by_op, owner_layer_type(b.owner)}}) {
      (*map)[key].bytes += b.rounded;
      (*map)[key].blocks++;
    }
    if (b.alloc_seq == peak_seq_) g.moment = b;
  }
  return g;
}

std::string Ledger::peak_table_markdown(int module_depth) const {
  const PeakGroups g = peak_groups(module_depth);
  int blocks = 0;
  for (const auto& [name, t] : g.by_category) blocks += t.blocks;
  std::ostringstream os;
  os << "Peak live: " << format_bytes(peak_total_) << " in " << blocks << " blocks; arena high water at peak "
     << format_bytes(high_water_at_peak_) << " (fragmentation " << format_bytes(fragmentation_at_peak()) << ").\n\n";
  table(os, "category", g.by_category, peak_total_, 100);
  table(os, "module", g.by_module, peak_total_, 25);
  table(os, "layer type / op", g.by_op, peak_total_, 25);
  return os.str();
}

}  // namespace engine
