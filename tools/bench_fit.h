// bench_fit.h: least-squares laws for memory scaling: bytes = a + b·x (+ c·x²), and what follows from them.
//
// A sweep (tools/bench_scale.h) measures bytes per category at a few sequence lengths or batch sizes; a
// law with two or three coefficients is what a reader remembers ("96 bytes per token squared"), and it
// answers the two questions the study asks: where does the quadratic term take over (c·L² > b·L beyond
// L = b / c), and what is the longest sequence a card holds (the root of a + b·L + c·L² = capacity).
//
// The fit solves the normal equations in long double on x scaled to [0, 1] (x up to 10^5 squared would
// otherwise lose the small coefficients), by Gaussian elimination with partial pivoting.
#pragma once
#include <array>
#include <limits>
#include <string>
#include <vector>

namespace tools {

struct PolyFit {
  int degree = 0;                  // 1: a + b·x; 2: a + b·x + c·x²
  std::array<double, 3> coef{};    // a, b, c (c = 0 for degree 1)
  double max_residual = 0;         // largest |y - fit(x)| over the points, in y's unit
  double at(double x) const { return coef[0] + coef[1] * x + coef[2] * x * x; }
};

// Fits y = a + b x (+ c x²). Needs at least degree + 1 points with distinct x; an Error says otherwise.
PolyFit fit_polynomial(const std::vector<double>& x, const std::vector<double>& y, int degree);

// The x beyond which the quadratic term exceeds the linear one (c x² > b x, i.e. x > b / c);
// +infinity when c <= 0 (never), 0 when b <= 0 < c (from the start).
double quadratic_crossover(const PolyFit& f);

// The largest x >= 0 with f(x) <= capacity for an increasing law: the positive root of f(x) = capacity.
// -1 when even f(0) exceeds it; +infinity when f never reaches it (no positive slope or curvature).
double solve_for_capacity(const PolyFit& f, double capacity);

constexpr double kNever = std::numeric_limits<double>::infinity();

}  // namespace tools
