// cpu/batch_norm.cpp: batch norm as plain loops over a contiguous x [M, C] (row r, channel c at r * C + c).
// Rows are walked in order with one host accumulator per channel, so each pass reads x once, channels
// innermost as they lie in memory. Statistics: within each of the fixed row chunks two passes (chunk mean,
// then the sum of squared deviations from it: no cancellation), then the chunks are combined in chunk
// order with Chan et al.'s update, the GPU's partition and order (its in-chunk arithmetic differs only in
// rounding). Column sums of the backward pass: chunk by chunk, chunk sums added in order.
#include "ops/cpu/batch_norm.h"

#include <cmath>

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

namespace {

// weight or bias as acc_t<T> values (`fill` when undefined).
template <typename T>
std::vector<acc_t<T>> load_channels(const Tensor& t, int64_t C, acc_t<T> fill) {
  std::vector<acc_t<T>> v(size_t(C), fill);
  if (!t.defined()) return v;
  const T* p = t.data<T>();
  for (int64_t c = 0; c < C; c++) v[size_t(c)] = ld(p[c * t.strides()[0]]);
  return v;
}

// Rows [begin, end) of chunk b when M rows are cut into `chunks` pieces of ceil(M / chunks).
struct RowRange {
  int64_t begin, end;
};
RowRange chunk_rows(int64_t M, int64_t chunks, int64_t b) {
  const int64_t per = (M + chunks - 1) / chunks;
  return {std::min(M, b * per), std::min(M, (b + 1) * per)};
}

}  // namespace

void batch_norm_stats(const Tensor& x, int64_t chunks, double eps, double momentum, const Tensor& mean,
                      const Tensor& invstd, const Tensor& running_mean, const Tensor& running_var) {
  const int64_t C = x.size(-1), M = x.numel() / C;
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = x.data<T>();
    std::vector<A> n_all(size_t(C), A(0)), mean_all(size_t(C), A(0)), m2_all(size_t(C), A(0));
    std::vector<A> chunk_mean(static_cast<size_t>(C)), chunk_m2(static_cast<size_t>(C));
    for (int64_t b = 0; b < chunks; b++) {
      const RowRange rr = chunk_rows(M, chunks, b);
      if (rr.end <= rr.begin) continue;
      const A n = A(rr.end - rr.begin);
      std::fill(chunk_mean.begin(), chunk_mean.end(), A(0));
      std::fill(chunk_m2.begin(), chunk_m2.end(), A(0));
      for (int64_t r = rr.begin; r < rr.end; r++)
        for (int64_t c = 0; c < C; c++) chunk_mean[size_t(c)] += ld(px[r * C + c]);
      for (int64_t c = 0; c < C; c++) chunk_mean[size_t(c)] /= n;
      for (int64_t r = rr.begin; r < rr.end; r++)
        for (int64_t c = 0; c < C; c++) {
          const A d = ld(px[r * C + c]) - chunk_mean[size_t(c)];
          chunk_m2[size_t(c)] += d * d;
        }
      // Chan et al.: (n_a, mean_a, m2_a) + (n_b, mean_b, m2_b).
      for (size_t c = 0; c < size_t(C); c++) {
        const A na = n_all[c], nt = na + n;
        const A delta = chunk_mean[c] - mean_all[c];
        mean_all[c] += delta * (n / nt);
        m2_all[c] += chunk_m2[c] + delta * delta * (na * n / nt);
        n_all[c] = nt;
      }
    }
    A* pm = mean.data<A>();
    A* pr = invstd.data<A>();
    for (int64_t c = 0; c < C; c++) {
      const A var = m2_all[size_t(c)] / A(M);
      pm[c] = mean_all[size_t(c)];
      pr[c] = A(1) / std::sqrt(var + A(eps));
    }
    if (running_mean.defined()) {
      A* rm = running_mean.data<A>();
      A* rv = running_var.data<A>();
      const A mom = A(momentum);
      for (int64_t c = 0; c < C; c++) {
        const A unbiased = m2_all[size_t(c)] / A(M - 1);
        rm[c] = (A(1) - mom) * rm[c] + mom * mean_all[size_t(c)];
        rv[c] = (A(1) - mom) * rv[c] + mom * unbiased;
      }
    }
  });
}

void batch_norm_running_stats(const Tensor& running_mean, const Tensor& running_var, double eps, const Tensor& mean,
                              const Tensor& invstd) {
  const int64_t C = mean.numel();
  auto run = [&](auto zero) {  // the statistics dtype: float or double
    using A = decltype(zero);
    const A* rm = running_mean.data<A>();
    const A* rv = running_var.data<A>();
    A* pm = mean.data<A>();
    A* pr = invstd.data<A>();
    for (int64_t c = 0; c < C; c++) {
      pm[c] = rm[c];
      pr[c] = A(1) / std::sqrt(rv[c] + A(eps));
    }
  };
  if (mean.dtype() == DType::f64) run(0.0);
  else run(0.0f);
}

void batch_norm_normalize(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                          const Tensor& bias, const Tensor& y, double slope, const Tensor& residual) {
  const int64_t C = x.size(-1), M = x.numel() / C;
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = x.data<T>();
    const T* pres = residual.defined() ? residual.data<T>() : nullptr;
    T* py = y.data<T>();
    const A* pm = mean.data<A>();
    const A* pr = invstd.data<A>();
    std::vector<A> w = load_channels<T>(weight, C, A(1)), b = load_channels<T>(bias, C, A(0));
    const A k = A(slope);
    parallel_for(M, [&](int64_t r) {
      for (int64_t c = 0; c < C; c++) {
        A p = (ld(px[r * C + c]) - pm[c]) * pr[c] * w[size_t(c)] + b[size_t(c)];
        if (pres) p += ld(pres[r * C + c]);
        py[r * C + c] = st<T>(p > A(0) ? p : k * p);
      }
    });
  });
}

void batch_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& invstd, bool batch_stats, int64_t chunks, const Tensor& dx,
                         const Tensor& dweight, const Tensor& dbias, const Tensor& bias, double slope, const Tensor& y,
                         const Tensor& dresidual) {
  const int64_t C = x.size(-1), M = x.numel() / C;
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* pg = g.data<T>();
    const T* px = x.data<T>();
    const A* pm = mean.data<A>();
    const A* pr = invstd.data<A>();
    std::vector<A> w = load_channels<T>(weight, C, A(1)), b = load_channels<T>(bias, C, A(0));
    // g times the activation's derivative at the normalization's output (as batch_norm_normalize computed it), or
    // at the forward's output y when it is given (the activation of the normalization plus a residual).
    const bool act = slope != 1.0;
    const A k = A(slope);
    const T* py = y.defined() ? y.data<T>() : nullptr;
    auto grad = [&](int64_t r, int64_t c) {
      const A gv = ld(pg[r * C + c]);
      if (!act) return gv;
      const A p = py ? ld(py[r * C + c]) : (ld(px[r * C + c]) - pm[c]) * pr[c] * w[size_t(c)] + b[size_t(c)];
      return p > A(0) ? gv : k * gv;
    };
    if (dresidual.defined()) {
      T* pdr = dresidual.data<T>();
      parallel_for(M, [&](int64_t r) {
        for (int64_t c = 0; c < C; c++) pdr[r * C + c] = st<T>(grad(r, c));
      });
    }
    // sum g and sum g * xhat per channel, chunk by chunk (the GPU's partition).
    std::vector<A> sum_g(size_t(C), A(0)), sum_gx(size_t(C), A(0));
    const bool need_sums = dweight.defined() || dbias.defined() || (dx.defined() && batch_stats);
    if (need_sums) {
      std::vector<A> part_g(static_cast<size_t>(C)), part_gx(static_cast<size_t>(C));
      for (int64_t b = 0; b < chunks; b++) {
        const RowRange rr = chunk_rows(M, chunks, b);
        std::fill(part_g.begin(), part_g.end(), A(0));
        std::fill(part_gx.begin(), part_gx.end(), A(0));
        for (int64_t r = rr.begin; r < rr.end; r++)
          for (int64_t c = 0; c < C; c++) {
            const A gv = grad(r, c);
            part_g[size_t(c)] += gv;
            part_gx[size_t(c)] += gv * ((ld(px[r * C + c]) - pm[c]) * pr[c]);
          }
        for (size_t c = 0; c < size_t(C); c++) {
          sum_g[c] += part_g[c];
          sum_gx[c] += part_gx[c];
        }
      }
    }
    if (dx.defined()) {
      T* pdx = dx.data<T>();
      parallel_for(M, [&](int64_t r) {
        for (int64_t c = 0; c < C; c++) {
          const A gv = grad(r, c), scale = pr[c] * w[size_t(c)];
          if (!batch_stats) {
            pdx[r * C + c] = st<T>(gv * scale);
            continue;
          }
          const A xhat = (ld(px[r * C + c]) - pm[c]) * pr[c];
          pdx[r * C + c] = st<T>(scale * (gv - sum_g[size_t(c)] / A(M) - xhat * (sum_gx[size_t(c)] / A(M))));
        }
      });
    }
    if (dweight.defined()) {
      T* p = dweight.data<T>();
      for (int64_t c = 0; c < C; c++) p[c * dweight.strides()[0]] = st<T>(sum_gx[size_t(c)]);
    }
    if (dbias.defined()) {
      T* p = dbias.data<T>();
      for (int64_t c = 0; c < C; c++) p[c * dbias.strides()[0]] = st<T>(sum_g[size_t(c)]);
    }
  });
}

}  // namespace ops::cpu
