// cpu/matmul.cpp: batched GEMM with Eigen, the reference for the cuBLASLt path.
//
// Each batch element is one Eigen product C += A * B with C pre-filled with the bias rows (or zeros), the
// BLAS "beta = 1" form: the bias is folded into the GEMM's output pass. Operands are Eigen::Maps over the
// tensor data when one of their two matrix strides is 1 (row-major, or column-major = a transposed view),
// so W^T and the transposes of backward cost no copy. Other layouts, and bf16/f16 (Eigen multiplies them
// in float), are packed into a small host buffer first. The products run through gemm_add (gemm.h): the same bits on
// any thread count.
#include "ops/cpu/matmul.h"

#include <Eigen/Dense>
#include <type_traits>

#include "ops/cpu/cpu_util.h"
#include "ops/cpu/gemm.h"

namespace ops::cpu {

namespace {

template <typename A> using RowMajorMatrix = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename A> using ColMajorMatrix = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
template <typename M> using ConstStridedMap = Eigen::Map<const M, 0, Eigen::OuterStride<>>;

// One operand matrix inside a tensor: rows x cols elements at `data`, element (i, j) at
// data[i * row_stride + j * col_stride].
template <typename T>
struct MatrixView {
  const T* data;
  int64_t rows, cols, row_stride, col_stride;
};

// Calls use(matrix) with the operand as an Eigen expression in the compute type acc_t<T>: a map over the
// tensor data when its rows or its columns are contiguous, else a row-major copy packed into `scratch`.
template <typename T, typename Use>
void with_eigen_matrix(const MatrixView<T>& m, std::vector<acc_t<T>>& scratch, Use&& use) {
  using A = acc_t<T>;
  if constexpr (std::is_same_v<T, A>) {
    if (m.col_stride == 1 && (m.rows <= 1 || m.row_stride >= m.cols)) {
      use(ConstStridedMap<RowMajorMatrix<A>>(m.data, m.rows, m.cols,
                                             Eigen::OuterStride<>(m.rows <= 1 ? m.cols : m.row_stride)));
      return;
    }
    if (m.row_stride == 1 && (m.cols <= 1 || m.col_stride >= m.rows)) {  // a transposed view
      use(ConstStridedMap<ColMajorMatrix<A>>(m.data, m.rows, m.cols,
                                             Eigen::OuterStride<>(m.cols <= 1 ? m.rows : m.col_stride)));
      return;
    }
  }
  scratch.resize(size_t(m.rows * m.cols));
  for (int64_t i = 0; i < m.rows; i++)
    for (int64_t j = 0; j < m.cols; j++)
      scratch[size_t(i * m.cols + j)] = ld(m.data[i * m.row_stride + j * m.col_stride]);
  use(ConstStridedMap<RowMajorMatrix<A>>(scratch.data(), m.rows, m.cols, Eigen::OuterStride<>(m.cols)));
}

// Strides of t's batch dimensions (all but the last two) seen through broadcasting to `batch`.
Shape batch_strides(const Tensor& t, const Shape& batch) {
  Shape st(batch.size(), 0);
  int64_t t_batch = t.dim() - 2;
  int64_t lead = int64_t(batch.size()) - t_batch;
  for (int64_t d = 0; d < t_batch; d++) st[lead + d] = t.shape()[d] == 1 ? 0 : t.strides()[d];
  return st;
}

// Where a product's [M, N] block is computed: in place when the output is already the compute type (f32, f64),
// else in host scratch of the compute type (bf16/f16 are computed in float and rounded once).
template <typename T, typename A>
A* output_block(T* out, std::vector<A>& scratch, int64_t elements) {
  if constexpr (std::is_same_v<T, A>) {
    return out;
  } else {
    scratch.resize(size_t(elements));
    return scratch.data();
  }
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out, bool relu, bool accumulate) {
  const int64_t M = out.size(-2), N = out.size(-1), K = a.size(-1);
  Shape batch(out.shape().begin(), out.shape().end() - 2);
  ENGINE_FLOAT_SWITCH(out.dtype(), T, {
    using A = acc_t<T>;
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    // The bias row in the compute type, read once.
    std::vector<A> bias_row(size_t(N), A(0));
    if (bias.defined()) {
      const T* pbias = bias.data<T>();
      for (int64_t j = 0; j < N; j++) bias_row[size_t(j)] = ld(pbias[j * bias.strides()[0]]);
    }
    Eigen::Map<const Eigen::Matrix<A, 1, Eigen::Dynamic>> bias_vec(bias_row.data(), N);
    std::vector<A> a_scratch, b_scratch, c_scratch;  // host packing buffers (reference kernel only)
    int64_t batch_index = 0;
    for_each_index<2>(batch, {batch_strides(a, batch), batch_strides(b, batch)}, [&](const std::array<int64_t, 2>& o) {
      T* pc = po + batch_index++ * M * N;  // [M, N] block of out
      if (M == 0 || N == 0) return;
      MatrixView<T> am{pa + o[0], M, K, a.strides()[a.dim() - 2], a.strides()[a.dim() - 1]};
      MatrixView<T> bm{pb + o[1], K, N, b.strides()[b.dim() - 2], b.strides()[b.dim() - 1]};
      with_eigen_matrix(am, a_scratch, [&](const auto& A_mat) {
        with_eigen_matrix(bm, b_scratch, [&](const auto& B_mat) {
          Eigen::Map<RowMajorMatrix<A>> C(output_block(pc, c_scratch, M * N), M, N);
          if (!accumulate) {
            C.rowwise() = bias_vec;
          } else if (static_cast<void*>(C.data()) != static_cast<void*>(pc)) {  // bf16/f16: out in the compute type
            for (int64_t i = 0; i < M * N; i++) c_scratch[size_t(i)] = ld(pc[i]);
          }
          if (K > 0) gemm_add(C, A_mat, B_mat);
          if (relu) C = C.cwiseMax(A(0));  // (before rounding: the same as after, max commutes with it)
          if (static_cast<void*>(C.data()) != static_cast<void*>(pc))  // bf16/f16: round once on the way out
            for (int64_t i = 0; i < M * N; i++) pc[i] = st<T>(c_scratch[size_t(i)]);
        });
      });
    });
  });
}

}  // namespace ops::cpu
