// bench_fit.cpp: the least-squares fit and the questions answered from it (see bench_fit.h).
#include "tools/bench_fit.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "engine/error.h"

namespace tools {

PolyFit fit_polynomial(const std::vector<double>& x, const std::vector<double>& y, int degree) {
  ENGINE_CHECK(degree == 1 || degree == 2, "fit: degree must be 1 (linear) or 2 (quadratic), got ", degree);
  ENGINE_CHECK(x.size() == y.size(), "fit: ", x.size(), " x values but ", y.size(), " y values");
  std::set<double> distinct(x.begin(), x.end());
  ENGINE_CHECK(int(distinct.size()) >= degree + 1, "fit: a degree-", degree, " law needs at least ", degree + 1,
               " distinct points, got ", distinct.size(), " (give a longer range or a finer step)");
  const int n = degree + 1;
  long double scale = 0;
  for (double v : x) scale = std::max<long double>(scale, std::fabs(v));
  if (scale == 0) scale = 1;
  // Normal equations A c = r for the basis 1, u, u² with u = x / scale.
  long double A[3][4] = {};
  for (size_t i = 0; i < x.size(); i++) {
    long double u = x[i] / scale, p[3] = {1, u, u * u};
    for (int r = 0; r < n; r++) {
      for (int c = 0; c < n; c++) A[r][c] += p[r] * p[c];
      A[r][n] += p[r] * (long double)y[i];
    }
  }
  for (int col = 0; col < n; col++) {  // elimination with partial pivoting
    int pivot = col;
    for (int r = col + 1; r < n; r++)
      if (std::fabs(A[r][col]) > std::fabs(A[pivot][col])) pivot = r;
    for (int c = 0; c <= n; c++) std::swap(A[col][c], A[pivot][c]);
    for (int r = 0; r < n; r++) {
      if (r == col) continue;
      long double f = A[r][col] / A[col][col];
      for (int c = col; c <= n; c++) A[r][c] -= f * A[col][c];
    }
  }
  PolyFit fit;
  fit.degree = degree;
  long double s = 1;
  for (int k = 0; k < n; k++, s *= scale) fit.coef[size_t(k)] = double(A[k][n] / A[k][k] / s);
  for (size_t i = 0; i < x.size(); i++) fit.max_residual = std::max(fit.max_residual, std::fabs(y[i] - fit.at(x[i])));
  return fit;
}

double quadratic_crossover(const PolyFit& f) {
  double b = f.coef[1], c = f.coef[2];
  if (c <= 0) return kNever;
  if (b <= 0) return 0;
  return b / c;
}

double solve_for_capacity(const PolyFit& f, double capacity) {
  double a = f.coef[0] - capacity, b = f.coef[1], c = f.coef[2];
  if (a > 0) return -1;
  if (c > 0) return (-b + std::sqrt(b * b - 4 * c * a)) / (2 * c);  // a <= 0 < c: one root >= 0
  if (b > 0) return -a / b;
  return kNever;
}

}  // namespace tools
