// cpu/conv1d.cpp: the reference 1-D convolution (K shifted GEMMs with Eigen, as fairseq's ConvTBC) and GLU.
//
// Each tap k of the convolution is a [Cin, Cout] matrix; for each sentence b the rows that tap reaches
// (conv1d_tap_rows) form a contiguous block of x and of y, so the tap is one Eigen product accumulated into
// y (the BLAS "beta = 1" form). Padding rows are skipped, never stored. bf16/f16 tensors are converted to
// float host copies and the result rounded once at the end (a reference kernel, not a fast path).
#include "ops/cpu/conv1d.h"

#include <Eigen/Dense>
#include <type_traits>

#include "ops/conv1d.h"
#include "ops/cpu/cpu_util.h"
#include "ops/cpu/gemm.h"
#include "ops/elementwise_math.h"

namespace ops::cpu {

namespace {

template <typename A> using RowMajorMatrix = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename A> using MatrixMap = Eigen::Map<RowMajorMatrix<A>>;
template <typename A> using ConstMatrixMap = Eigen::Map<const RowMajorMatrix<A>>;

// A tensor's data in the compute type: the data itself for f32/f64, else a converted host copy.
template <typename T>
const acc_t<T>* acc_input(const Tensor& t, std::vector<acc_t<T>>& scratch) {
  const T* p = t.data<T>();
  if constexpr (std::is_same_v<T, acc_t<T>>) {
    return p;
  } else {
    scratch.resize(size_t(t.numel()));
    for (int64_t i = 0; i < t.numel(); i++) scratch[size_t(i)] = ld(p[i]);
    return scratch.data();
  }
}

// An output written in the compute type: the tensor's data for f32/f64, else a host buffer that store()
// rounds into the tensor once.
template <typename T>
class AccOutput {
 public:
  explicit AccOutput(const Tensor& t) : t_(t) {
    if constexpr (!std::is_same_v<T, acc_t<T>>) buffer_.assign(size_t(t.numel()), acc_t<T>(0));
  }
  acc_t<T>* data() {
    if constexpr (std::is_same_v<T, acc_t<T>>) return t_.data<T>();
    else return buffer_.data();
  }
  void store() {
    if constexpr (!std::is_same_v<T, acc_t<T>>) {
      T* p = t_.data<T>();
      for (size_t i = 0; i < buffer_.size(); i++) p[i] = st<T>(buffer_[i]);
    }
  }

 private:
  const Tensor& t_;
  std::vector<acc_t<T>> buffer_;
};

// Sizes of a convolution, read from x [B, T, Cin], y [B, To, Cout] and the tap count K.
struct Conv1dSizes {
  int64_t B, T, Cin, To, Cout, K;
};

}  // namespace

void conv1d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t pad_left, const Tensor& y) {
  const Conv1dSizes s{x.size(0), x.size(1), x.size(2), y.size(1), y.size(2), w.size(0)};
  ENGINE_FLOAT_SWITCH(y.dtype(), T, {
    using A = acc_t<T>;
    std::vector<A> x_copy, w_copy;
    const A* px = acc_input<T>(x, x_copy);  // [B, T, Cin]
    const A* pw = acc_input<T>(w, w_copy);  // [K, Cin, Cout]
    AccOutput<T> out(y);
    A* py = out.data();  // [B, To, Cout]
    for (int64_t c = 0; c < s.Cout; c++) {
      const A b0 = bias.defined() ? ld(bias.data<T>()[c]) : A(0);
      for (int64_t r = 0; r < s.B * s.To; r++) py[r * s.Cout + c] = b0;
    }
    for (int64_t k = 0; k < s.K; k++) {
      const Conv1dTapRows rows = conv1d_tap_rows(k, pad_left, s.T, s.To);
      if (rows.count() == 0) continue;
      ConstMatrixMap<A> w_k(pw + k * s.Cin * s.Cout, s.Cin, s.Cout);  // [Cin, Cout]
      for (int64_t b = 0; b < s.B; b++) {
        MatrixMap<A> y_rows(py + (b * s.To + rows.begin) * s.Cout, rows.count(), s.Cout);
        ConstMatrixMap<A> x_rows(px + (b * s.T + rows.begin + k - pad_left) * s.Cin, rows.count(), s.Cin);
        gemm_add(y_rows, x_rows, w_k);
      }
    }
    out.store();
  });
}

void conv1d_backward_input(const Tensor& g, const Tensor& w, int64_t pad_left, const Tensor& dx) {
  const Conv1dSizes s{dx.size(0), dx.size(1), dx.size(2), g.size(1), g.size(2), w.size(0)};
  ENGINE_FLOAT_SWITCH(dx.dtype(), T, {
    using A = acc_t<T>;
    std::vector<A> g_copy, w_copy;
    const A* pg = acc_input<T>(g, g_copy);  // [B, To, Cout]
    const A* pw = acc_input<T>(w, w_copy);  // [K, Cin, Cout]
    AccOutput<T> out(dx);
    A* pdx = out.data();  // [B, T, Cin]
    std::fill(pdx, pdx + dx.numel(), A(0));
    for (int64_t k = 0; k < s.K; k++) {
      const Conv1dTapRows rows = conv1d_tap_rows(k, pad_left, s.T, s.To);
      if (rows.count() == 0) continue;
      ConstMatrixMap<A> w_k(pw + k * s.Cin * s.Cout, s.Cin, s.Cout);
      for (int64_t b = 0; b < s.B; b++) {
        MatrixMap<A> dx_rows(pdx + (b * s.T + rows.begin + k - pad_left) * s.Cin, rows.count(), s.Cin);
        ConstMatrixMap<A> g_rows(pg + (b * s.To + rows.begin) * s.Cout, rows.count(), s.Cout);
        gemm_add(dx_rows, g_rows, w_k.transpose());
      }
    }
    out.store();
  });
}

void conv1d_backward_weight(const Tensor& g, const Tensor& x, int64_t pad_left, const Tensor& dw) {
  const Conv1dSizes s{x.size(0), x.size(1), x.size(2), g.size(1), g.size(2), dw.size(0)};
  ENGINE_FLOAT_SWITCH(dw.dtype(), T, {
    using A = acc_t<T>;
    std::vector<A> g_copy, x_copy;
    const A* pg = acc_input<T>(g, g_copy);  // [B, To, Cout]
    const A* px = acc_input<T>(x, x_copy);  // [B, T, Cin]
    AccOutput<T> out(dw);
    A* pdw = out.data();  // [K, Cin, Cout]
    std::fill(pdw, pdw + dw.numel(), A(0));
    for (int64_t k = 0; k < s.K; k++) {
      const Conv1dTapRows rows = conv1d_tap_rows(k, pad_left, s.T, s.To);
      if (rows.count() == 0) continue;
      MatrixMap<A> dw_k(pdw + k * s.Cin * s.Cout, s.Cin, s.Cout);
      for (int64_t b = 0; b < s.B; b++) {
        ConstMatrixMap<A> x_rows(px + (b * s.T + rows.begin + k - pad_left) * s.Cin, rows.count(), s.Cin);
        ConstMatrixMap<A> g_rows(pg + (b * s.To + rows.begin) * s.Cout, rows.count(), s.Cout);
        gemm_add(dw_k, x_rows.transpose(), g_rows);
      }
    }
    out.store();
  });
}

// ---------------------------------------------------------------------------------------------------
// GLU

namespace {

// x viewed as [outer, 2H, inner] around `dim`.
struct GluSizes {
  int64_t outer = 1, half = 0, inner = 1;
  GluSizes(const Tensor& x, int64_t dim) {
    for (int64_t d = 0; d < dim; d++) outer *= x.size(d);
    half = x.size(dim) / 2;
    for (int64_t d = dim + 1; d < x.dim(); d++) inner *= x.size(d);
  }
};

}  // namespace

void glu_forward(const Tensor& x, int64_t dim, const Tensor& y) {
  const GluSizes s(x, dim);
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(s.outer, [&](int64_t o) {
      const T* a = px + o * 2 * s.half * s.inner;  // [H, inner]
      const T* b = a + s.half * s.inner;           // [H, inner]
      T* out = py + o * s.half * s.inner;
      for (int64_t i = 0; i < s.half * s.inner; i++)
        out[i] = st<T>(ld(a[i]) * unary_f<A>(UnaryOp::sigmoid, ld(b[i]), A(0), A(0)));
    });
  });
}

void glu_backward(const Tensor& g, const Tensor& x, int64_t dim, const Tensor& dx) {
  const GluSizes s(x, dim);
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    using A = acc_t<T>;
    const T* px = x.data<T>();
    const T* pg = g.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(s.outer, [&](int64_t o) {
      const T* a = px + o * 2 * s.half * s.inner;
      const T* b = a + s.half * s.inner;
      const T* go = pg + o * s.half * s.inner;
      T* da = pdx + o * 2 * s.half * s.inner;
      T* db = da + s.half * s.inner;
      for (int64_t i = 0; i < s.half * s.inner; i++) {
        const A sg = unary_f<A>(UnaryOp::sigmoid, ld(b[i]), A(0), A(0)), gi = ld(go[i]);
        da[i] = st<T>(gi * sg);
        db[i] = st<T>(gi * ld(a[i]) * sg * (A(1) - sg));
      }
    });
  });
}

}  // namespace ops::cpu
