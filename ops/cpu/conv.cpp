// cpu/conv.cpp: the reference 2-D convolution kernels: im2col + Eigen GEMM, one image at a time.
//
// REFERENCE ONLY: this is not the GPU's algorithm (the CUDA kernels are implicit GEMMs that never build the
// column matrix). Here each image's column matrix is built in host scratch, in the compute type acc_t<T>:
//   col [Ho*Wo, groups, KH, KW, Cin/g]   col[p, gi, kh, kw, c] = x[ih, iw, gi*Cin/g + c] (0 in the padding)
// so that group gi's block is a [P, K] matrix (K = KH*KW*Cin/g, row stride groups*K) in the same (kh, kw, c)
// order as a row of the KRSC weight [Cout, K]. Then, per image and group:
//   forward          y[:, gi]  = col_gi @ W_gi^T            [P, Cout/g] = [P, K] @ [K, Cout/g]
//   backward data    dcol_gi   = dy[:, gi] @ W_gi           then col2im adds dcol back into dx's pixels
//   backward weight  dW_gi    += dy[:, gi]^T @ col_gi       summed over images in order (deterministic)
// Forward and data gradient run images on OpenMP threads (each image is independent); the weight gradient
// walks images in order and lets Eigen thread each product, so its sum order is fixed.
#include "ops/cpu/conv.h"

#include <Eigen/Dense>
#include <type_traits>
#include <vector>

#include "ops/cpu/cpu_util.h"
#include "ops/cpu/gemm.h"

namespace ops::cpu {

namespace {

template <typename A> using RowMajorMatrix = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename A> using StridedMap = Eigen::Map<RowMajorMatrix<A>, 0, Eigen::OuterStride<>>;
template <typename A> using ConstStridedMap = Eigen::Map<const RowMajorMatrix<A>, 0, Eigen::OuterStride<>>;

// `count` elements at p in the compute type: p itself when T is the compute type, else converted into buf.
template <typename T>
const acc_t<T>* in_compute_type(const T* p, int64_t count, std::vector<acc_t<T>>& buf) {
  if constexpr (std::is_same_v<T, acc_t<T>>) {
    return p;
  } else {
    buf.resize(size_t(count));
    for (int64_t i = 0; i < count; i++) buf[size_t(i)] = ld(p[i]);
    return buf.data();
  }
}

// For every output pixel p and kernel tap (kh, kw): inside(col_base, pixel) when the tap lands in the image
// (pixel = ih * W + iw), outside(col_base) when it lands in the padding; col_base = p*groups*K + (kh*KW + kw)*Cin/g
// is the tap's place in group 0's block of the column matrix. The one loop nest shared by im2col and col2im.
template <typename Inside, typename Outside>
void for_each_tap(const ConvGeometry& g, Inside&& inside, Outside&& outside) {
  const int64_t cpg = g.cin_per_group(), row = g.p.groups * g.gemm_k();
  for (int64_t oh = 0; oh < g.ho; oh++)
    for (int64_t ow = 0; ow < g.wo; ow++) {
      const int64_t p = oh * g.wo + ow;
      for (int64_t kh = 0; kh < g.kh; kh++) {
        const int64_t ih = oh * g.p.stride_h - g.p.pad_h + kh * g.p.dilation_h;
        for (int64_t kw = 0; kw < g.kw; kw++) {
          const int64_t iw = ow * g.p.stride_w - g.p.pad_w + kw * g.p.dilation_w;
          const int64_t col_base = p * row + (kh * g.kw + kw) * cpg;
          if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) outside(col_base);
          else inside(col_base, ih * g.w + iw);
        }
      }
    }
}

// col [P, groups*K] of one image x_img [H*W*Cin] (see the file comment).
template <typename A>
void im2col(const A* x_img, const ConvGeometry& g, std::vector<A>& col) {
  const int64_t cpg = g.cin_per_group(), k = g.gemm_k(), groups = g.p.groups;
  col.resize(size_t(g.ho * g.wo * groups * k));
  A* c = col.data();
  for_each_tap(
      g,
      [&](int64_t col_base, int64_t pixel) {
        const A* src = x_img + pixel * g.cin;
        for (int64_t gi = 0; gi < groups; gi++)
          for (int64_t ci = 0; ci < cpg; ci++) c[col_base + gi * k + ci] = src[gi * cpg + ci];
      },
      [&](int64_t col_base) {
        for (int64_t gi = 0; gi < groups; gi++)
          for (int64_t ci = 0; ci < cpg; ci++) c[col_base + gi * k + ci] = A(0);
      });
}

// dx_img [H*W*Cin] = the sum of every column entry that came from each input element (im2col's adjoint).
template <typename A>
void col2im(const std::vector<A>& col, const ConvGeometry& g, std::vector<A>& dx_img) {
  const int64_t cpg = g.cin_per_group(), k = g.gemm_k(), groups = g.p.groups;
  dx_img.assign(size_t(g.h * g.w * g.cin), A(0));
  const A* c = col.data();
  A* d = dx_img.data();
  for_each_tap(
      g,
      [&](int64_t col_base, int64_t pixel) {
        A* dst = d + pixel * g.cin;
        for (int64_t gi = 0; gi < groups; gi++)
          for (int64_t ci = 0; ci < cpg; ci++) dst[gi * cpg + ci] += c[col_base + gi * k + ci];
      },
      [](int64_t) {});
}

// Images go to OpenMP threads only when there is enough work per image to pay for waking them: tiny
// convolutions (gradient checks) stay on the calling thread.
bool worth_threads(const ConvGeometry& g) {
  return g.n > 1 && g.ho * g.wo * g.cout * g.gemm_k() >= (int64_t(1) << 16);
}

template <typename T>
void forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const ConvGeometry& g) {
  using A = acc_t<T>;
  const int64_t P = g.ho * g.wo, K = g.gemm_k(), groups = g.p.groups, cout_g = g.cout_per_group();
  std::vector<A> w_buf;
  const A* wa = in_compute_type(w.data<T>(), w.numel(), w_buf);  // [Cout, K]
  std::vector<A> bias_row(size_t(g.cout), A(0));                  // [Cout]
  if (bias.defined())
    for (int64_t co = 0; co < g.cout; co++) bias_row[size_t(co)] = ld(bias.data<T>()[co]);
  const T* px = x.data<T>();
  T* py = y.data<T>();
#pragma omp parallel for schedule(dynamic) if (worth_threads(g))
  for (int64_t n = 0; n < g.n; n++) {
    std::vector<A> x_buf, col, y_img(size_t(P * g.cout));  // host scratch: [H*W*Cin], [P, groups*K], [P, Cout]
    im2col(in_compute_type(px + n * g.h * g.w * g.cin, g.h * g.w * g.cin, x_buf), g, col);
    for (int64_t gi = 0; gi < groups; gi++) {
      ConstStridedMap<A> col_g(col.data() + gi * K, P, K, Eigen::OuterStride<>(groups * K));
      ConstStridedMap<A> w_g(wa + gi * cout_g * K, cout_g, K, Eigen::OuterStride<>(K));
      StridedMap<A> y_g(y_img.data() + gi * cout_g, P, cout_g, Eigen::OuterStride<>(g.cout));
      y_g.setZero();
      gemm_add(y_g, col_g, w_g.transpose());
    }
    T* y_out = py + n * P * g.cout;
    for (int64_t p = 0; p < P; p++)
      for (int64_t co = 0; co < g.cout; co++)
        y_out[p * g.cout + co] = st<T>(y_img[size_t(p * g.cout + co)] + bias_row[size_t(co)]);
  }
}

template <typename T>
void backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const ConvGeometry& g) {
  using A = acc_t<T>;
  const int64_t P = g.ho * g.wo, K = g.gemm_k(), groups = g.p.groups, cout_g = g.cout_per_group();
  std::vector<A> w_buf;
  const A* wa = in_compute_type(w.data<T>(), w.numel(), w_buf);  // [Cout, K]
  const T* pdy = dy.data<T>();
  T* pdx = dx.data<T>();
#pragma omp parallel for schedule(dynamic) if (worth_threads(g))
  for (int64_t n = 0; n < g.n; n++) {
    std::vector<A> dy_buf, dx_img;                // host scratch: [P, Cout], [H*W*Cin]
    std::vector<A> dcol(size_t(P * groups * K));  // [P, groups*K]
    const A* dya = in_compute_type(pdy + n * P * g.cout, P * g.cout, dy_buf);
    for (int64_t gi = 0; gi < groups; gi++) {
      ConstStridedMap<A> dy_g(dya + gi * cout_g, P, cout_g, Eigen::OuterStride<>(g.cout));
      ConstStridedMap<A> w_g(wa + gi * cout_g * K, cout_g, K, Eigen::OuterStride<>(K));
      StridedMap<A> dcol_g(dcol.data() + gi * K, P, K, Eigen::OuterStride<>(groups * K));
      dcol_g.setZero();
      gemm_add(dcol_g, dy_g, w_g);
    }
    col2im(dcol, g, dx_img);
    T* dx_out = pdx + n * g.h * g.w * g.cin;
    for (int64_t i = 0; i < g.h * g.w * g.cin; i++) dx_out[i] = st<T>(dx_img[size_t(i)]);
  }
}

template <typename T>
void backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const ConvGeometry& g) {
  using A = acc_t<T>;
  const int64_t P = g.ho * g.wo, K = g.gemm_k(), groups = g.p.groups, cout_g = g.cout_per_group();
  RowMajorMatrix<A> dw_acc = RowMajorMatrix<A>::Zero(g.cout, K);  // [Cout, K]
  std::vector<A> x_buf, dy_buf, col;                               // host scratch
  for (int64_t n = 0; n < g.n; n++) {
    im2col(in_compute_type(x.data<T>() + n * g.h * g.w * g.cin, g.h * g.w * g.cin, x_buf), g, col);
    const A* dya = in_compute_type(dy.data<T>() + n * P * g.cout, P * g.cout, dy_buf);
    for (int64_t gi = 0; gi < groups; gi++) {
      ConstStridedMap<A> col_g(col.data() + gi * K, P, K, Eigen::OuterStride<>(groups * K));
      ConstStridedMap<A> dy_g(dya + gi * cout_g, P, cout_g, Eigen::OuterStride<>(g.cout));
      gemm_add(dw_acc.middleRows(gi * cout_g, cout_g), dy_g.transpose(), col_g);
    }
  }
  T* pdw = dw.data<T>();
  for (int64_t i = 0; i < g.cout * K; i++) pdw[i] = st<T>(dw_acc.data()[i]);
}

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const ConvGeometry& g) {
  ENGINE_FLOAT_SWITCH(y.dtype(), T, forward<T>(x, w, bias, y, g));
}

void conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const ConvGeometry& g) {
  ENGINE_FLOAT_SWITCH(dx.dtype(), T, backward_data<T>(dy, w, dx, g));
}

void conv2d_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& workspace,
                            const ConvGeometry& g) {
  (void)workspace;  // the GPU's split-reduction partials; the cpu reduces in one pass
  ENGINE_FLOAT_SWITCH(dw.dtype(), T, backward_weight<T>(x, dy, dw, g));
}

}  // namespace ops::cpu
