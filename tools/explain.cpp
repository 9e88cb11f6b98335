// explain.cpp: the narrated step and its timeline.
#include "tools/explain.h"

#include <algorithm>
#include <array>
#include <limits>
#include <vector>

#include "engine/error.h"
#include "engine/format.h"
#include "tools/svg_plot.h"

namespace tools {

using engine::BlockInfo;
using engine::Category;
using engine::format_bytes;
using engine::str;

namespace {

std::string param_of(const std::string& owner, const std::string& suffix) {
  const size_t at = owner.rfind(suffix);
  return at == std::string::npos ? owner : owner.substr(0, at);
}

// Why a block exists, from its category (final, after any retag), its owner and the reasons autograd recorded.
std::string why(const BlockInfo& b) {
  switch (b.category) {
    case Category::param:
      return "a parameter (or buffer): lives with the model";
    case Category::grad:
      return "the gradient of " + param_of(b.owner, "/grad") +
             ": accumulated through backward, dropped by zero_grad after the update";
    case Category::optimizer:
      if (b.owner.size() > 7 && b.owner.compare(b.owner.size() - 7, 7, "/master") == 0)
        return "the f32 master weight of " + param_of(b.owner, "/master") + " (mixed precision)";
      return "optimizer state of " + param_of(b.owner, "/") + ": made at its first update, kept for the run";
    case Category::activation:
      return (b.reason.empty() ? std::string("saved for backward") : b.reason) + ": lives until that backward has run";
    case Category::input:
      return "the batch: lives while the step uses it";
    case Category::workspace:  // the device's GEMM workspace, or an op's scratch for its GPU kernel (new_workspace)
      return b.reason.empty() ? "the GEMM library's workspace: made once, kept"
                              : b.reason + ": freed when its op returns";
    case Category::kv_cache:
      return "a key/value cache for generation: made at the longest length, kept while decoding";
    case Category::comm:
      return "a data-parallel gradient bucket: made with the model, kept for the run";
    default:
      return b.reason.empty() ? "a temporary: freed as soon as nothing uses it" : "a temporary (" + b.reason + ")";
  }
}

}  // namespace

std::vector<ExplainRow> explain_rows(const std::vector<BlockInfo>& history, int64_t from_seq, size_t live_before) {
  std::vector<ExplainRow> rows;
  size_t live = live_before;
  for (const engine::LedgerEvent& e : engine::events_in_order(history)) {
    if (e.seq <= from_seq) continue;
    live = e.alloc ? live + e.block->rounded : live - e.block->rounded;
    rows.push_back(ExplainRow{e.seq, e.alloc, e.block, live});
  }
  return rows;
}

std::string explain_why(const BlockInfo& b) { return why(b); }

std::string explain_markdown(const engine::Ledger& ledger, int64_t from_seq, size_t live_before,
                             const std::string& title) {
  ENGINE_CHECK(ledger.detail(), "explain: the ledger recorded no detail (Ledger::set_detail before the step)");
  const std::vector<BlockInfo> history = ledger.history();
  const std::vector<ExplainRow> rows = explain_rows(history, from_seq, live_before);
  std::string s =
      str("## ", title, "\n\nLive before the step: ", format_bytes(live_before), ". Every allocation (+) and ",
          "free (-) in order; the phase and module/op column is filled where it changes; bytes are the ",
          "arena's (rounded up to 256).\n\n| # | phase · module/op | event | tensor | bytes | live after | ",
          "category | why it exists / when it died |\n|---:|---|:-:|---|---:|---:|---|---|\n");
  std::string last_group;
  size_t peak = live_before;
  const ExplainRow* at_peak = nullptr;
  int64_t n = 0;
  for (const ExplainRow& r : rows) {
    const BlockInfo& b = *r.block;
    const std::string group =
        r.alloc ? str(engine::phase_name(b.phase), " · ", b.owner.empty() ? "-" : b.owner)
                : str(engine::phase_name(b.free_phase), " · ", b.free_owner.empty() ? "-" : b.free_owner);
    const std::string shown = group == last_group ? "" : group;
    last_group = group;
    const std::string text =
        r.alloc ? why(b)
                : str("freed in ", engine::phase_name(b.free_phase), b.free_owner.empty() ? "" : " at " + b.free_owner,
                      " (it was ", b.owner.empty() ? std::string("untagged") : b.owner, ")");
    s += str("| ", ++n, " | ", shown, " | ", r.alloc ? "+" : "-", " | ", b.what.empty() ? "-" : b.what, " | ",
             format_bytes(b.rounded), " | ", format_bytes(r.live_after), " | ", engine::category_name(b.category),
             " | ", text, " |\n");
    if (r.live_after > peak) peak = r.live_after, at_peak = &r;
  }
  s += str("\n", rows.size(), " events (",
           std::count_if(rows.begin(), rows.end(), [](const ExplainRow& r) { return r.alloc; }), " allocations). ");
  if (!at_peak) return s + "The step never rose above what was live before it.\n";
  s += str("The step's peak: ", format_bytes(peak), " at event ", at_peak - rows.data() + 1, " (",
           engine::phase_name(at_peak->block->phase), ", ", at_peak->block->owner, ").\n\nAlive at that moment:\n\n");
  // The live set at the step's peak: blocks allocated by then and not yet freed.
  std::array<size_t, engine::kNumCategories> by_category{};
  std::vector<const BlockInfo*> live;
  for (const BlockInfo& b : history)
    if (b.alloc_seq <= at_peak->seq && (b.free_seq < 0 || b.free_seq > at_peak->seq)) {
      by_category[size_t(b.category)] += b.rounded;
      live.push_back(&b);
    }
  s += "| category | bytes |\n|---|---:|\n";
  for (int k = 0; k < engine::kNumCategories; k++)
    if (by_category[size_t(k)])
      s += str("| ", engine::category_name(Category(k)), " | ", format_bytes(by_category[size_t(k)]), " |\n");
  std::stable_sort(live.begin(), live.end(),
                   [](const BlockInfo* a, const BlockInfo* b) { return a->rounded > b->rounded; });
  s += "\nThe largest blocks alive then:\n\n| owner | tensor | bytes | category | why |\n|---|---|---:|---|---|\n";
  for (size_t i = 0; i < live.size() && i < 12; i++)
    s += str("| ", live[i]->owner, " | ", live[i]->what.empty() ? "-" : live[i]->what, " | ",
             format_bytes(live[i]->rounded), " | ", engine::category_name(live[i]->category), " | ", why(*live[i]),
             " |\n");
  return s;
}

std::string memory_timeline_svg(const engine::Ledger& ledger, int64_t from_seq, const std::string& title,
                                const std::vector<std::pair<int64_t, double>>& times, int width, int height) {
  const std::vector<BlockInfo> history = ledger.history();
  // Live bytes by category after each event, starting from what was live at from_seq.
  std::array<double, engine::kNumCategories> live{};
  for (const BlockInfo& b : history)
    if (b.alloc_seq <= from_seq && (b.free_seq < 0 || b.free_seq > from_seq))
      live[size_t(b.category)] += double(b.rounded);
  struct Point {
    std::array<double, engine::kNumCategories> live;
    engine::Phase phase;
    double ms;  // with `times`: the event's stamp
  };
  const bool timed = !times.empty();
  size_t next_stamp = 0;
  double now_ms = 0;
  auto stamp_of = [&](int64_t seq) {  // times are in sequence order
    while (next_stamp < times.size() && times[next_stamp].first <= seq) now_ms = times[next_stamp++].second;
    return now_ms;
  };
  std::vector<Point> points;
  points.push_back({live, engine::Phase::setup, stamp_of(from_seq)});
  for (const engine::LedgerEvent& e : engine::events_in_order(history)) {
    if (e.seq <= from_seq) continue;
    live[size_t(e.block->category)] += e.alloc ? double(e.block->rounded) : -double(e.block->rounded);
    points.push_back({live, e.alloc ? e.block->phase : e.block->free_phase, stamp_of(e.seq)});
  }
  points[0].phase = points.size() > 1 ? points[1].phase : engine::Phase::setup;
  double peak = 0;
  size_t peak_at = 0;
  std::array<double, engine::kNumCategories> held;  // each category's least over the window
  held.fill(std::numeric_limits<double>::max());
  for (size_t i = 0; i < points.size(); i++) {
    double total = 0;
    for (int k = 0; k < engine::kNumCategories; k++) {
      total += points[i].live[size_t(k)];
      held[size_t(k)] = std::min(held[size_t(k)], points[i].live[size_t(k)]);
    }
    if (total > peak) peak = total, peak_at = i;
  }
  // Bytes held through the whole window (a GEMM workspace, the parameters, the optimizer's state after step 1) would
  // flatten everything else when they are most of the peak: then they are named above the plot, not drawn, and the
  // y axis starts at their sum (its labels stay the true live bytes).
  double floor = 0;
  for (double h : held) floor += h;
  const bool lifted = floor >= 0.5 * peak;
  if (lifted)
    for (Point& p : points)
      for (int k = 0; k < engine::kNumCategories; k++) p.live[size_t(k)] -= held[size_t(k)];
  else
    floor = 0;
  double top = 1;
  for (const Point& p : points) {
    double total = 0;
    for (double v : p.live) total += v;
    top = std::max(top, total);
  }
  const double left = 70, right = 150, up = 40, down = 40;
  const double pw = width - left - right, ph = height - up - down;
  const double t0 = points.front().ms, span = std::max(1e-9, points.back().ms - t0);
  auto x = [&](size_t i) {
    return timed ? left + pw * (points[i].ms - t0) / span
                 : left + pw * double(i) / double(std::max<size_t>(1, points.size() - 1));
  };
  auto y = [&](double bytes) { return up + ph * (1 - bytes / (top * 1.15)); };
  std::string s = str("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width, "\" height=\"", height,
                      "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
                      "fill=\"white\"/>\n<text x=\"",
                      left, "\" y=\"20\" font-size=\"14\">", title, "</text>\n");
  if (lifted) {
    std::string names;
    for (int k = 0; k < engine::kNumCategories; k++)
      if (held[size_t(k)] > 0)
        names += str(names.empty() ? "" : ", ", engine::category_name(Category(k)), " ",
                     format_bytes(size_t(held[size_t(k)])));
    s += str("<text x=\"", left, "\" y=\"34\" font-size=\"11\" fill=\"#555\">y axis from ", format_bytes(size_t(floor)),
             ": held through the whole window, not drawn (", names, ")</text>\n");
  }
  // Phases: shaded bands with their names.
  const char* shades[] = {"#f4f4f4", "#e8f0fb", "#fbeee8", "#eef8ea", "#f6eefa", "#fdf6e0", "#f9e3e3"};
  static_assert(sizeof(shades) / sizeof(shades[0]) == size_t(engine::Phase::kCount), "a shade per phase");
  size_t start = 0;
  for (size_t i = 1; i <= points.size(); i++)
    if (i == points.size() || points[i].phase != points[start].phase) {
      const int p = int(points[start].phase);
      const double band = std::max(1.0, x(i < points.size() ? i : i - 1) - x(start));  // up to the next phase
      s += str("<rect x=\"", x(start), "\" y=\"", up, "\" width=\"", band, "\" height=\"", ph, "\" fill=\"", shades[p],
               "\"/>\n");
      if (band > 60)  // a name only where it fits
        s += str("<text x=\"", x(start) + 3, "\" y=\"", up + 14, "\" fill=\"#555\">",
                 engine::phase_name(points[start].phase), "</text>\n");
      start = i;
    }
  // Categories stacked, bottom to top in the ledger's order.
  std::vector<double> base(points.size(), 0.0);
  int legend = 0;
  for (int k = 0; k < engine::kNumCategories; k++) {
    bool any = false;  // drawn; a category held throughout a lifted window is in the legend only
    for (const Point& p : points) any |= p.live[size_t(k)] > 0;
    if (!any && !(lifted && held[size_t(k)] > 0)) continue;
    const std::string color = category_color(engine::category_name(Category(k)));
    s += str("<rect x=\"", width - right + 15, "\" y=\"", up + 20 * legend, "\" width=\"12\" height=\"12\" fill=\"",
             color, "\"/><text x=\"", width - right + 32, "\" y=\"", up + 20 * legend + 11, "\">",
             engine::category_name(Category(k)), "</text>\n");
    legend++;
    if (!any) continue;
    // In time, live bytes hold between events: each edge steps at the next event's time.
    std::string path = str("M ", x(0), " ", y(base[0]));
    for (size_t i = 0; i < points.size(); i++) {
      if (timed && i) path += str(" L ", x(i), " ", y(base[i - 1] + points[i - 1].live[size_t(k)]));
      path += str(" L ", x(i), " ", y(base[i] + points[i].live[size_t(k)]));
    }
    for (size_t i = points.size(); i-- > 0;) {
      path += str(" L ", x(i), " ", y(base[i]));
      if (timed && i) path += str(" L ", x(i), " ", y(base[i - 1]));
    }
    s += str("<path d=\"", path, " Z\" fill=\"", color, "\" fill-opacity=\"0.85\" stroke=\"none\"/>\n");
    for (size_t i = 0; i < points.size(); i++) base[i] += points[i].live[size_t(k)];
  }
  // Axes and the peak.
  s += str("<line x1=\"", left, "\" y1=\"", up + ph, "\" x2=\"", left + pw, "\" y2=\"", up + ph,
           "\" stroke=\"black\"/>\n<line x1=\"", left, "\" y1=\"", up, "\" x2=\"", left, "\" y2=\"", up + ph,
           "\" stroke=\"black\"/>\n");
  for (int t = 0; t <= 4; t++) {
    const double v = top * 1.15 * t / 4;
    s += str("<text x=\"", left - 6, "\" y=\"", y(v) + 4, "\" text-anchor=\"end\">", format_bytes(size_t(floor + v)),
             "</text>\n");
  }
  if (timed) {
    for (int t = 0; t <= 4; t++)
      s += str("<text x=\"", left + pw * t / 4, "\" y=\"", up + ph + 15, "\" text-anchor=\"middle\">",
               engine::format_fixed(span * t / 4, span < 10 ? 2 : 1), "</text>\n");
    s += str("<text x=\"", left + pw / 2, "\" y=\"", height - 10, "\" text-anchor=\"middle\">time on the device (ms; ",
             points.size() - 1, " events)</text>\n");
  } else {
    s += str("<text x=\"", left + pw / 2, "\" y=\"", height - 10, "\" text-anchor=\"middle\">allocation order (",
             points.size() - 1, " events)</text>\n");
  }
  s += str("<line x1=\"", x(peak_at), "\" y1=\"", up, "\" x2=\"", x(peak_at), "\" y2=\"", up + ph,
           "\" stroke=\"black\" stroke-dasharray=\"4 3\"/>\n<circle cx=\"", x(peak_at), "\" cy=\"", y(peak - floor),
           "\" r=\"4\" fill=\"black\"/>\n<text x=\"", x(peak_at) + 6, "\" y=\"", y(peak - floor) - 6, "\">peak ",
           format_bytes(size_t(peak)), " (", size_t(peak), " B)</text>\n</svg>\n");
  return s;
}

}  // namespace tools
