// progress.cpp: drawing the progress bar.
#include "tools/progress.h"

#include <unistd.h>

#include <cstdio>

#include "engine/format.h"

namespace tools {

std::string render_progress(const std::string& label, int64_t done, int64_t total, double seconds,
                            const std::string& note, int width) {
  std::string line = label + " [";
  std::string time = engine::format_fixed(seconds, 1) + " s";
  if (total > 0) {
    int64_t clamped = done < 0 ? 0 : done > total ? total : done;
    int filled = int(clamped * width / total);
    line += std::string(size_t(filled), '#') + std::string(size_t(width - filled), '.');
    line += "] " + std::to_string(clamped) + "/" + std::to_string(total);
    if (clamped > 0 && clamped < total)  // the rest at the average pace so far
      time += ", " + engine::format_fixed(seconds * double(total - clamped) / double(clamped), 1) + " s left";
  } else {
    line += "probe " + std::to_string(done) + "]";
  }
  line += " | " + time;
  if (!note.empty()) line += " | " + note;
  return line;
}

ProgressBar::ProgressBar(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), start_(std::chrono::steady_clock::now()) {}

bool ProgressBar::enabled() {
  static const bool tty = isatty(STDERR_FILENO) == 1;
  return tty;
}

void ProgressBar::update(int64_t done, const std::string& note) {
  if (!enabled()) return;
  std::fflush(stdout);  // what the program printed comes first
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  // \r: back to the line's start; \033[K: erase to its end (the previous bar may have been longer).
  std::fprintf(stderr, "\r\033[K%s", render_progress(label_, done, total_, seconds, note).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace tools
