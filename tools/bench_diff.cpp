// bench_diff.cpp: two configs' peaks on meta and the difference of every group of their blocks.
#include "tools/bench_diff.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include "engine/device.h"
#include "engine/format.h"
#include "engine/json.h"
#include "engine/ledger.h"
#include "models/registry.h"
#include "tools/config_flags.h"

namespace tools {

using engine::format_bytes;
using engine::str;

PeakAccount account_peak(const models::ModelConfig& config, int steps, int module_depth) {
  ENGINE_CHECK(steps >= 1, "engine_bench diff: --steps must be at least 1");
  auto device = engine::Device::create(engine::DeviceType::meta, size_t(1) << 40);
  engine::DeviceGuard guard(device);
  auto model = models::create_model(config);
  const engine::Ledger& ledger = device->ledger();
  PeakAccount r;
  r.config = config;
  size_t peak = ledger.peak_bytes();  // building the model (step 0)
  for (int64_t step = 1; step <= steps; step++) {
    model->train_step(step);
    if (ledger.peak_bytes() > peak) {
      peak = ledger.peak_bytes();
      r.peak_step = step;
    }
  }
  r.peak = ledger.peak_bytes();
  r.module_depth = module_depth > 0 ? module_depth : model->memory_report_depth();
  const engine::Ledger::PeakGroups g = ledger.peak_groups(r.module_depth);
  size_t sum = 0;
  for (const auto& [name, t] : g.by_category) r.by_category[name] = t.bytes, sum += t.bytes;
  for (const auto& [name, t] : g.by_module) r.by_module[name] = t.bytes;
  for (const auto& [name, t] : g.by_op) r.by_op[name] = t.bytes;
  r.peak_phase = engine::phase_name(g.moment.phase);
  r.peak_owner = g.moment.owner.empty() ? "(untagged)" : g.moment.owner;
  ENGINE_CHECK(sum == r.peak, "engine_bench diff: the blocks alive at the peak add up to ", sum, " bytes, the "
               "ledger's peak is ", r.peak, " (a ledger bug: please report it)");
  return r;
}

namespace {

std::vector<DiffRow> diff_rows(const std::map<std::string, size_t>& a, const std::map<std::string, size_t>& b) {
  std::set<std::string> names;
  for (const auto& [n, v] : a) names.insert(n);
  for (const auto& [n, v] : b) names.insert(n);
  std::vector<DiffRow> rows;
  for (const std::string& n : names) {
    auto ia = a.find(n), ib = b.find(n);
    rows.push_back({n, ia == a.end() ? 0 : ia->second, ib == b.end() ? 0 : ib->second});
  }
  std::stable_sort(rows.begin(), rows.end(), [](const DiffRow& x, const DiffRow& y) {
    if (std::llabs(x.delta()) != std::llabs(y.delta())) return std::llabs(x.delta()) > std::llabs(y.delta());
    return std::max(x.a, x.b) > std::max(y.a, y.b);
  });
  return rows;
}

// "+1.50 GiB", "-256.00 MiB", "0 B".
std::string signed_bytes(int64_t d) {
  if (d == 0) return "0 B";
  return (d > 0 ? "+" : "-") + format_bytes(size_t(std::llabs(d)));
}

// The changed groups, largest change first, at most max_rows of them; the rest (further changes and every
// unchanged group) in one line, so that the column still adds up to B - A.
void diff_table(std::ostringstream& os, const char* title, const std::vector<DiffRow>& rows, size_t max_rows) {
  os << "| " << title << " | A | B | B - A |\n|---|---:|---:|---:|\n";
  size_t shown = 0, rest = 0, rest_a = 0, rest_b = 0;
  int64_t rest_delta = 0;
  for (const DiffRow& r : rows) {  // rows: largest |delta| first, so the changed ones lead
    if (r.delta() != 0 && shown < max_rows) {
      os << "| " << r.name << " | " << format_bytes(r.a) << " | " << format_bytes(r.b) << " | **"
         << signed_bytes(r.delta()) << "** |\n";
      shown++;
      continue;
    }
    rest++;
    rest_a += r.a;
    rest_b += r.b;
    rest_delta += r.delta();
  }
  if (rest > 0)
    os << "| … " << rest << " more" << (rest_delta == 0 ? ", unchanged" : "") << " | " << format_bytes(rest_a) << " | "
       << format_bytes(rest_b) << " | " << signed_bytes(rest_delta) << " |\n";
  os << "\n";
}

// The rows of the largest decreases and increases, for the headline ("-6.00 GiB in attention/softmax, ...").
std::string largest_changes(const std::vector<DiffRow>& rows, bool decreases, size_t n) {
  std::string s;
  size_t k = 0;
  for (const DiffRow& r : rows) {
    if (k == n || r.delta() == 0) continue;
    if ((r.delta() < 0) != decreases) continue;
    s += (k++ ? ", " : "") + signed_bytes(r.delta()) + " in " + r.name;
  }
  return s;
}

std::string moment(const PeakAccount& p) { return str("step ", p.peak_step, ", ", p.peak_phase, ", ", p.peak_owner); }

}  // namespace

PeakDiff diff_peaks(const models::ModelConfig& a, const models::ModelConfig& b, int steps) {
  PeakDiff d;
  d.steps = steps;
  // Both sides' modules are cut at A's model's depth, so that the same model's paths compare.
  d.a = account_peak(a, steps);
  d.b = account_peak(b, steps, d.a.module_depth);
  d.by_category = diff_rows(d.a.by_category, d.b.by_category);
  d.by_module = diff_rows(d.a.by_module, d.b.by_module);
  d.by_op = diff_rows(d.a.by_op, d.b.by_op);
  return d;
}

std::string config_difference(const models::ModelConfig& a, const models::ModelConfig& b) {
  std::string s = a.name == b.name ? "" : "--model " + b.name;
  const auto sa = config_settings(a), sb = config_settings(b);
  for (size_t i = 0; i < sa.size(); i++)
    if (sa[i].second != sb[i].second)
      s += (s.empty() ? "" : " ") + str("--", sb[i].first, " ", sb[i].second.empty() ? "(default)" : sb[i].second);
  return s.empty() ? "(the same config)" : s;
}

std::string diff_markdown(const PeakDiff& d, size_t max_rows) {
  std::ostringstream os;
  const int64_t delta = int64_t(d.b.peak) - int64_t(d.a.peak);
  os << "## Peak of " << d.a.config.name << ": A → B (" << config_difference(d.a.config, d.b.config) << ")\n\n";
  os << "A: **" << format_bytes(d.a.peak) << "** at " << moment(d.a) << "  \n";
  os << "B: **" << format_bytes(d.b.peak) << "** at " << moment(d.b) << "  \n";
  os << "B - A: **" << signed_bytes(delta) << "**";
  if (d.a.peak > 0) os << " (" << engine::format_fixed(100.0 * double(delta) / double(d.a.peak), 1) << "%)";
  const std::string down = largest_changes(d.by_op, true, 3), up = largest_changes(d.by_op, false, 3);
  if (!down.empty() || !up.empty()) os << ": " << down << (down.empty() || up.empty() ? "" : "; ") << up;
  os << "\n\nMeasured on meta (exact allocations, no arithmetic), " << d.steps
     << " training steps each; the blocks alive at each peak, grouped. Each table's last column adds up to B - A.\n\n";
  diff_table(os, "category", d.by_category, max_rows);
  diff_table(os, "module", d.by_module, max_rows);
  diff_table(os, "layer type / op", d.by_op, max_rows);
  return os.str();
}

std::string diff_json(const PeakDiff& d) {
  auto side = [](const PeakAccount& p) {
    std::ostringstream os;
    os << "{\"config\": " << engine::json::quote(p.config.name) << ", \"peak_bytes\": " << p.peak
       << ", \"peak_step\": " << p.peak_step << ", \"peak_phase\": " << engine::json::quote(p.peak_phase)
       << ", \"peak_owner\": " << engine::json::quote(p.peak_owner) << "}";
    return os.str();
  };
  auto rows = [](const std::vector<DiffRow>& v) {
    std::ostringstream os;
    os << "[";
    for (size_t i = 0; i < v.size(); i++)
      os << (i ? ", " : "") << "{\"name\": " << engine::json::quote(v[i].name) << ", \"a\": " << v[i].a
         << ", \"b\": " << v[i].b << ", \"delta\": " << v[i].delta() << "}";
    os << "]";
    return os.str();
  };
  std::ostringstream os;
  os << "{\n \"a\": " << side(d.a) << ",\n \"b\": " << side(d.b)
     << ",\n \"difference\": " << engine::json::quote(config_difference(d.a.config, d.b.config))
     << ",\n \"delta_bytes\": " << int64_t(d.b.peak) - int64_t(d.a.peak)
     << ",\n \"by_category\": " << rows(d.by_category) << ",\n \"by_module\": " << rows(d.by_module)
     << ",\n \"by_op\": " << rows(d.by_op) << "\n}\n";
  return os.str();
}

}  // namespace tools
