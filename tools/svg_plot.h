// svg_plot.h: charts as hand-written SVG (no plotting library): line charts, stacked areas, small multiples.
//
// The benchmark's plots must be readable without the numbers beside them: every chart has a title, both
// axes carry ticks and a label with the unit, every series is in a legend, and horizontal reference lines
// (e.g. a card's memory) are labelled where they are drawn. Stacked charts draw the series as areas on top
// of each other in the order given (the first at the bottom), so the top edge is the total. Values are
// plotted as given: the caller converts bytes to GiB and says so in the axis label.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace tools {

struct SvgSeries {
  std::string name;
  std::vector<double> x, y;
  std::string color;     // any SVG colour; empty: the palette's next colour
  bool dashed = false;   // e.g. reference figures (the 2020 study) beside measured ones
  bool markers = true;   // a circle at each point (off for a fitted curve sampled densely)
};

struct SvgAxis {
  std::string label;     // with the unit: "sequence length L (tokens)"
  bool log = false;      // logarithmic (powers of 2 or 10 as ticks); values must be > 0
};

struct SvgChart {
  std::string title;
  std::string subtitle;  // one smaller line under the title (e.g. the configuration)
  SvgAxis x, y;
  std::vector<SvgSeries> series;
  bool stacked = false;  // areas stacked in series order; every series has the same x
  std::vector<std::pair<double, std::string>> y_marks;  // labelled horizontal reference lines
  std::string note;      // one line under the plot area (e.g. the fitted law)
};

// One chart as a complete SVG document.
std::string svg_chart(const SvgChart& chart, int width = 760, int height = 460);
// Several charts in a grid of `columns` panels under one title (small multiples).
std::string svg_grid(const std::string& title, const std::vector<SvgChart>& panels, int columns, int panel_width = 380,
                     int panel_height = 300);

// The palette (Tableau 10), and the colour of each ledger category, the same in every chart.
const std::vector<std::string>& svg_palette();
std::string category_color(const std::string& category);
// "1.5", "4096", "16k": short tick labels.
std::string tick_label(double v);

}  // namespace tools
