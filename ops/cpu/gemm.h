// gemm.h: C += A · B with Eigen, the same bits on any number of threads.
//
// Eigen threads a large product itself (OpenMP) and chooses its cache blocking, and so how each dot product's
// partial sums are grouped, from the thread count: the same product then differs in its low bits between
// OMP_NUM_THREADS=1 and 2, and so would a seeded run's losses. So the engine keeps Eigen single-threaded and
// splits C into panels of kGemmPanelRows rows, one OpenMP task each: a panel's blocking depends only on the
// panel's own shape, never on how many threads run the panels.
#pragma once
#include <Eigen/Core>
#include <algorithm>
#include <cstdint>

namespace ops::cpu {

constexpr int64_t kGemmPanelRows = 128;

// C += A * B; C is [M, N], A [M, K], B [K, N] (Eigen expressions: maps, transposes, blocks).
template <typename CMat, typename AMat, typename BMat>
void gemm_add(CMat&& C, const AMat& A, const BMat& B) {
  static const bool single = (Eigen::setNbThreads(1), true);  // once per process, before any product
  (void)single;
  const int64_t M = C.rows(), panels = (M + kGemmPanelRows - 1) / kGemmPanelRows;
  const bool threads = panels > 1 && double(M) * double(C.cols()) * double(A.cols()) >= double(1 << 20);
#pragma omp parallel for schedule(dynamic) if (threads)
  for (int64_t p = 0; p < panels; p++) {
    const int64_t r = p * kGemmPanelRows, rows = std::min(kGemmPanelRows, M - r);
    C.middleRows(r, rows).noalias() += A.middleRows(r, rows) * B;
  }
}

}  // namespace ops::cpu
