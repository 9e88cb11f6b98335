// progress.h: a one-line progress bar on stderr for long work (the max-batch search, many steps).
//
// It draws only when stderr is a terminal: piped or redirected output (CI logs, files, tests) stays free
// of carriage returns. The bar owns its line: clear() erases it before the program prints a result line
// to stdout (the same terminal), and the next update() draws it again below. render_progress() is the
// pure formatting, so it can be tested without a terminal.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace tools {

// "label [#########.........] 3/10 | 1.2 s, 2.8 s left | note". total 0: the amount of work is not
// known in advance (a search): "label [probe 3] 1.2 s | note".
std::string render_progress(const std::string& label, int64_t done, int64_t total, double seconds,
                            const std::string& note, int width = 24);

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total);
  ~ProgressBar() { clear(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(int64_t done, const std::string& note = "");
  // Erases the bar's line (call before printing anything else to the terminal).
  void clear();
  // Whether this process draws bars at all (stderr is a terminal).
  static bool enabled();

 private:
  std::string label_;
  int64_t total_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tools
