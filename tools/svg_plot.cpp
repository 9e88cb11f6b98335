// svg_plot.cpp: axes, ticks, series and legends written as SVG text (see svg_plot.h).
#include "tools/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/error.h"

namespace tools {

const std::vector<std::string>& svg_palette() {
  static const std::vector<std::string> p = {"#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f",
                                             "#edc949", "#af7aa1", "#ff9da7", "#9c755f", "#bab0ab"};
  return p;
}

std::string category_color(const std::string& category) {
  static const std::vector<std::pair<std::string, std::string>> colors = {
      {"param", "#4e79a7"},      {"grad", "#76b7b2"},     {"optimizer", "#59a14f"},
      {"activation", "#e15759"}, {"temp", "#f28e2c"},     {"workspace", "#af7aa1"},
      {"input", "#9c755f"},      {"kv_cache", "#edc949"}, {"comm", "#ff9da7"}};
  for (const auto& [name, color] : colors)
    if (name == category) return color;
  return "#bab0ab";
}

std::string tick_label(double v) {
  char buf[32];
  double a = std::fabs(v);
  if (a >= 10000 && std::fmod(a, 1000) == 0) std::snprintf(buf, sizeof buf, "%gk", v / 1000);
  else if (a >= 1e6) std::snprintf(buf, sizeof buf, "%.3g", v);
  else std::snprintf(buf, sizeof buf, "%g", std::round(v * 1e6) / 1e6);
  return buf;
}

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// An axis mapped onto pixels [p0, p1]: its domain and its ticks.
struct Scale {
  double lo = 0, hi = 1;
  bool log = false;
  double p0 = 0, p1 = 1;
  std::vector<double> ticks;
  double operator()(double v) const {
    double t = log ? (std::log(v) - std::log(lo)) / (std::log(hi) - std::log(lo)) : (v - lo) / (hi - lo);
    return p0 + t * (p1 - p0);
  }
};

// Linear: 0 (when every value is >= 0) to a round maximum, ticks at 1, 2 or 5 x 10^k. Log: whole powers
// of 2 (ranges up to 2^12) or of 10 around the data.
Scale make_scale(double dmin, double dmax, bool log, double p0, double p1) {
  Scale s;
  s.log = log;
  s.p0 = p0;
  s.p1 = p1;
  if (log) {
    ENGINE_CHECK(dmin > 0, "svg: a logarithmic axis needs positive values, got ", dmin);
    double base = dmax / dmin <= 4096 ? 2 : 10;
    double e0 = std::floor(std::log(dmin) / std::log(base) + 1e-9),
           e1 = std::ceil(std::log(dmax) / std::log(base) - 1e-9);
    if (e1 <= e0) e1 = e0 + 1;
    s.lo = std::pow(base, e0);
    s.hi = std::pow(base, e1);
    int stride = int(std::ceil((e1 - e0) / 8));
    for (double e = e0; e <= e1 + 1e-9; e += stride) s.ticks.push_back(std::pow(base, e));
    return s;
  }
  double lo = std::min(0.0, dmin), hi = dmax;
  if (hi <= lo) hi = lo + 1;
  double raw = (hi - lo) / 5, mag = std::pow(10, std::floor(std::log10(raw))), step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  s.lo = std::floor(lo / step) * step;
  s.hi = std::ceil(hi / step - 1e-9) * step;
  for (double t = s.lo; t <= s.hi + step * 1e-6; t += step) s.ticks.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
  return s;
}

void panel(std::ostringstream& os, const SvgChart& c, double X, double Y, double W, double H) {
  ENGINE_CHECK(!c.series.empty(), "svg: chart '", c.title, "' has no series");
  // Stacked charts plot cumulative sums.
  std::vector<std::vector<double>> top(c.series.size());
  for (size_t i = 0; i < c.series.size(); i++) {
    const SvgSeries& s = c.series[i];
    ENGINE_CHECK(s.x.size() == s.y.size(), "svg: series '", s.name, "' has ", s.x.size(), " x and ", s.y.size(), " y");
    top[i] = s.y;
    if (c.stacked && i > 0) {
      ENGINE_CHECK(s.x == c.series[0].x, "svg: stacked series '", s.name, "' must share the first series' x");
      for (size_t k = 0; k < s.y.size(); k++) top[i][k] += top[i - 1][k];
    }
  }
  double xmin = 1e300, xmax = -1e300, ymin = 1e300, ymax = -1e300;
  for (size_t i = 0; i < c.series.size(); i++)
    for (size_t k = 0; k < top[i].size(); k++) {
      xmin = std::min(xmin, c.series[i].x[k]);
      xmax = std::max(xmax, c.series[i].x[k]);
      ymin = std::min(ymin, top[i][k]);
      ymax = std::max(ymax, top[i][k]);
    }
  for (const auto& m : c.y_marks) ymax = std::max(ymax, m.first);
  if (xmin > xmax) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  // Layout: title row, plot area, x labels, note row; legend inside the plot at the top left.
  const double left = X + 66, right = X + W - 16, ptop = Y + (c.subtitle.empty() ? 40 : 56),
               pbottom = Y + H - (c.note.empty() ? 48 : 66);
  Scale xs = make_scale(xmin, xmax, c.x.log, left, right);
  Scale ys = make_scale(c.y.log ? ymin : std::min(0.0, ymin), ymax, c.y.log, pbottom, ptop);
  os << "<text x=\"" << num(X + W / 2) << "\" y=\"" << num(Y + 22) << "\" text-anchor=\"middle\" font-size=\"15\" "
        "font-weight=\"bold\">" << esc(c.title) << "</text>\n";
  if (!c.subtitle.empty())
    os << "<text x=\"" << num(X + W / 2) << "\" y=\"" << num(Y + 40) << "\" text-anchor=\"middle\" font-size=\"12\" "
          "fill=\"#333\">" << esc(c.subtitle) << "</text>\n";
  os << "<rect x=\"" << num(left) << "\" y=\"" << num(ptop) << "\" width=\"" << num(right - left) << "\" height=\""
     << num(pbottom - ptop) << "\" fill=\"white\" stroke=\"#444\"/>\n";
  for (double t : ys.ticks) {
    double py = ys(t);
    os << "<line x1=\"" << num(left) << "\" y1=\"" << num(py) << "\" x2=\"" << num(right) << "\" y2=\"" << num(py)
       << "\" stroke=\"#e4e4e4\"/><line x1=\"" << num(left - 5) << "\" y1=\"" << num(py) << "\" x2=\"" << num(left)
       << "\" y2=\"" << num(py) << "\" stroke=\"#444\"/><text x=\"" << num(left - 8) << "\" y=\"" << num(py + 4)
       << "\" text-anchor=\"end\" font-size=\"11\">" << tick_label(t) << "</text>\n";
  }
  for (double t : xs.ticks) {
    double px = xs(t);
    os << "<line x1=\"" << num(px) << "\" y1=\"" << num(ptop) << "\" x2=\"" << num(px) << "\" y2=\"" << num(pbottom)
       << "\" stroke=\"#f0f0f0\"/><line x1=\"" << num(px) << "\" y1=\"" << num(pbottom) << "\" x2=\"" << num(px)
       << "\" y2=\"" << num(pbottom + 5) << "\" stroke=\"#444\"/><text x=\"" << num(px) << "\" y=\""
       << num(pbottom + 18) << "\" text-anchor=\"middle\" font-size=\"11\">" << tick_label(t) << "</text>\n";
  }
  os << "<text x=\"" << num((left + right) / 2) << "\" y=\"" << num(pbottom + 36) << "\" text-anchor=\"middle\" "
        "font-size=\"12\">" << esc(c.x.label) << "</text>\n";
  double ly = (ptop + pbottom) / 2, lx = X + 16;
  os << "<text x=\"" << num(lx) << "\" y=\"" << num(ly)
     << "\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 " << num(lx) << " " << num(ly) << ")\">"
     << esc(c.y.label) << "</text>\n";
  if (!c.note.empty())
    os << "<text x=\"" << num(left) << "\" y=\"" << num(pbottom + 54) << "\" font-size=\"11\" fill=\"#333\">"
       << esc(c.note) << "</text>\n";
  // Series: areas (stacked) or lines with markers.
  os << "<g>\n";
  for (size_t i = 0; i < c.series.size(); i++) {
    const SvgSeries& s = c.series[i];
    std::string color = s.color.empty() ? svg_palette()[i % svg_palette().size()] : s.color;
    if (c.stacked) {
      std::string pts;
      for (size_t k = 0; k < s.x.size(); k++) pts += num(xs(s.x[k])) + "," + num(ys(top[i][k])) + " ";
      for (size_t k = s.x.size(); k-- > 0;)
        pts += num(xs(s.x[k])) + "," + num(i ? ys(top[i - 1][k]) : ys(std::max(ys.lo, 0.0))) + " ";
      os << "<polygon points=\"" << pts << "\" fill=\"" << color << "\" fill-opacity=\"0.85\" stroke=\"" << color
         << "\"><title>" << esc(s.name) << "</title></polygon>\n";
    } else {
      std::string pts;
      for (size_t k = 0; k < s.x.size(); k++) pts += num(xs(s.x[k])) + "," + num(ys(s.y[k])) + " ";
      os << "<polyline points=\"" << pts << "\" fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\""
         << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << "/>\n";
      for (size_t k = 0; s.markers && k < s.x.size(); k++)
        os << "<circle cx=\"" << num(xs(s.x[k])) << "\" cy=\"" << num(ys(s.y[k])) << "\" r=\"3\" fill=\""
           << (s.dashed ? "white" : color) << "\" stroke=\"" << color << "\"/>\n";
    }
  }
  os << "</g>\n";
  for (const auto& [value, label] : c.y_marks) {
    double py = ys(value);
    os << "<line x1=\"" << num(left) << "\" y1=\"" << num(py) << "\" x2=\"" << num(right) << "\" y2=\"" << num(py)
       << "\" stroke=\"#222\" stroke-dasharray=\"2,3\"/><text x=\"" << num(right - 4) << "\" y=\"" << num(py - 4)
       << "\" text-anchor=\"end\" font-size=\"10\" fill=\"#222\">" << esc(label) << "</text>\n";
  }
  // Legend, top left inside the plot; stacked: the top series first, as the areas read.
  double lw = 0;
  for (const auto& s : c.series) lw = std::max(lw, 7.0 * double(s.name.size()));
  double bx = left + 8, by = ptop + 8, bh = 16.0 * double(c.series.size()) + 8;
  os << "<rect x=\"" << num(bx) << "\" y=\"" << num(by) << "\" width=\"" << num(lw + 40) << "\" height=\"" << num(bh)
     << "\" fill=\"white\" fill-opacity=\"0.9\" stroke=\"#999\"/>\n";
  for (size_t j = 0; j < c.series.size(); j++) {
    size_t i = c.stacked ? c.series.size() - 1 - j : j;
    const SvgSeries& s = c.series[i];
    std::string color = s.color.empty() ? svg_palette()[i % svg_palette().size()] : s.color;
    double ry = by + 16.0 * double(j) + 14;
    if (c.stacked)
      os << "<rect x=\"" << num(bx + 6) << "\" y=\"" << num(ry - 9) << "\" width=\"20\" height=\"10\" fill=\"" << color
         << "\"/>";
    else
      os << "<line x1=\"" << num(bx + 6) << "\" y1=\"" << num(ry - 4) << "\" x2=\"" << num(bx + 26) << "\" y2=\""
         << num(ry - 4) << "\" stroke=\"" << color << "\" stroke-width=\"2\""
         << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << "/>";
    os << "<text x=\"" << num(bx + 32) << "\" y=\"" << num(ry) << "\" font-size=\"11\">" << esc(s.name) << "</text>\n";
  }
}

std::string header(int width, int height) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
         std::to_string(width) + "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) +
         " " + std::to_string(height) + "\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n<rect width=\"100%\" "
         "height=\"100%\" fill=\"white\"/>\n";
}

}  // namespace

std::string svg_chart(const SvgChart& chart, int width, int height) {
  std::ostringstream os;
  os << header(width, height);
  panel(os, chart, 0, 0, width, height);
  os << "</svg>\n";
  return os.str();
}

std::string svg_grid(const std::string& title, const std::vector<SvgChart>& panels, int columns, int panel_width,
                     int panel_height) {
  ENGINE_CHECK(columns >= 1 && !panels.empty(), "svg: a grid needs at least one panel and one column");
  int rows = int((panels.size() + size_t(columns) - 1) / size_t(columns));
  int width = columns * panel_width, height = 36 + rows * panel_height;
  std::ostringstream os;
  os << header(width, height);
  os << "<text x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"17\" font-weight=\"bold\">"
     << esc(title) << "</text>\n";
  for (size_t i = 0; i < panels.size(); i++)
    panel(os, panels[i], double(int(i) % columns * panel_width), 36.0 + double(int(i) / columns * panel_height),
          panel_width, panel_height);
  os << "</svg>\n";
  return os.str();
}

}  // namespace tools
