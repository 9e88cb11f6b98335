// matmul.cpp: matmul, bmm and linear: shape rules, allocation, dispatch to the GEMM kernel, backward rules.
#include "ops/matmul.h"

#include <algorithm>

#include "ops/cpu/matmul.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/matmul.h"
#endif
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/op.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/view.h"

namespace ops {

namespace {

// The broadcast batch shape of a [..., M, K] and b [..., K, N], or an Error naming both full shapes.
Shape matmul_batch_shape(const Tensor& a, const Tensor& b) {
  Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  size_t n = std::max(ba.size(), bb.size());
  Shape batch(n);
  for (size_t i = 0; i < n; i++) {
    int64_t da = i < n - ba.size() ? 1 : ba[i - (n - ba.size())];
    int64_t db = i < n - bb.size() ? 1 : bb[i - (n - bb.size())];
    ENGINE_CHECK(da == db || da == 1 || db == 1, "matmul: batch dimensions of a ", engine::shape_str(a.shape()),
                 " and b ", engine::shape_str(b.shape()), " do not broadcast (", da, " vs ", db, ")");
    batch[i] = da == 1 ? db : da;
  }
  return batch;
}

// Both operands have at least 2 dimensions here.

// An operand the GEMM kernels take as it is: unit stride along its rows or its columns (a plain or a
// transposed matrix); anything else is copied, identically on every device.
Tensor gemm_operand(const Tensor& t) {
  int64_t sr = t.strides()[size_t(t.dim() - 2)], sc = t.strides()[size_t(t.dim() - 1)];
  bool ok = sc == 1 || sr == 1 || t.size(-1) == 1 || t.size(-2) == 1;
  return ok ? t : contiguous(t);
}

// Whether t's batch dimensions (those of `batch`, t broadcast to them) can be walked with one stride: then
// the GEMM library runs the whole batch as one strided-batched call. Attention's heads, [B, H, L, D] views
// of [B, L, H*D] projections, cannot (the H stride is D, the B stride L*H*D): the cuda kernel would launch
// one GEMM call per b.
bool batch_is_one_stride(const Tensor& t, const Shape& batch) {
  const int64_t nb = int64_t(batch.size()), lead = nb - (t.dim() - 2);
  auto stride = [&](int64_t i) {  // t's stride along out batch dimension i (0 where broadcast)
    return i < lead || t.shape()[size_t(i - lead)] == 1 ? int64_t(0) : t.strides()[size_t(i - lead)];
  };
  for (int64_t i = 0; i + 1 < nb; i++)
    if (batch[size_t(i)] > 1 && stride(i) != stride(i + 1) * batch[size_t(i + 1)]) return false;
  return true;
}

// The operand the kernel gets: t itself, or (when its batch cannot be walked with one stride and it is not
// broadcast) a contiguous copy: a kernel temporary made under NoGrad, identical on every device, freed when
// the op returns; backward still saves the original view, so the saved memory does not change. One copy
// (a few microseconds) replaces B GEMM calls.
Tensor batch_operand(const Tensor& t, const Shape& batch) {
  const bool full = t.dim() - 2 == int64_t(batch.size()) &&
                    std::equal(batch.begin(), batch.end(), t.shape().begin());
  if (batch_is_one_stride(t, batch) || !full) return t;
  graph::NoGrad ng;
  return contiguous(t);
}

Tensor matmul_batched(const Tensor& a_in, const Tensor& b_in) {
  OpScope scope("matmul");
  Tensor a = gemm_operand(a_in), b = gemm_operand(b_in);
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  ENGINE_CHECK(b.size(-2) == K, "matmul: a ", engine::shape_str(a.shape()), " times b ", engine::shape_str(b.shape()),
               ": a's last dimension (", K, ") must equal b's second-to-last (", b.size(-2), ")");
  Shape out_shape = matmul_batch_shape(a, b);
  const int64_t batch = engine::numel_of(out_shape);
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out = new_empty(a, out_shape);  // [..., M, N]
  out.device().workspace(kGemmWorkspaceBytes);
  {
    const Shape batch_shape(out_shape.begin(), out_shape.end() - 2);
    Tensor ka = batch_operand(a, batch_shape), kb = batch_operand(b, batch_shape);
    run_kernel("matmul", out, [&] { cpu::matmul(ka, kb, Tensor(), out); },
               CUDA_KERNEL(cuda::matmul(ka, kb, Tensor(), out)));
  }
  engine::count_op("matmul", 2.0 * double(batch) * double(M) * double(N) * double(K),
                   double(a.nbytes() + b.nbytes() + out.nbytes()));
  if (graph::any_requires_grad({a, b})) {
    // da needs b and db needs a: save each operand only when the other one's gradient needs it.
    Tensor save_a = b.requires_grad() ? a : Tensor();
    Tensor save_b = a.requires_grad() ? b : Tensor();
    graph::record("matmul", {a, b}, {out}, {save_a, save_b},
                  [sa = a.shape(), sb = b.shape()](Node& n, const Grads& g) -> Grads {
                    Tensor ga, gb;
                    if (n.needs_input_grad(0)) ga = sum_to(matmul(g[0], transpose(n.saved(1), -1, -2)), sa);
                    if (n.needs_input_grad(1)) gb = sum_to(matmul(transpose(n.saved(0), -1, -2), g[0]), sb);
                    return {ga, gb};
                  });
  }
  return out;
}

// linear's padded width: for 16-bit types, out_features rounded up to a multiple of 8 (16 bytes) when it is not
// (and it is wide: a vocabulary), else out_features itself. See linear in matmul.h.
constexpr int64_t kPadMinFeatures = 1024;
int64_t padded_features(int64_t out_features, DType dtype) {
  if (engine::dtype_size(dtype) != 2 || out_features < kPadMinFeatures || out_features % 8 == 0) return out_features;
  return (out_features + 7) / 8 * 8;
}

// t with zero rows (dim 0) or columns (dim -1) appended up to `size` along dim: an op (concat), so differentiable.
Tensor pad_with_zeros(const Tensor& t, int64_t dim, int64_t size) {
  Shape zs = t.shape();
  const size_t d = dim < 0 ? zs.size() - 1 : size_t(dim);
  zs[d] = size - t.shape()[d];
  return concat({t, zeros(zs, t.dtype(), t.device_ptr())}, dim);
}

// The rows of `parts` stacked (dim 0) and zero rows appended up to `rows`: one tensor for the GEMM. A single part
// already `rows` long is returned as it is (no copy).
Tensor stacked_rows(const std::vector<Tensor>& parts, int64_t rows) {
  if (parts.size() == 1) return parts[0].size(0) == rows ? parts[0] : pad_with_zeros(parts[0], 0, rows);
  std::vector<Tensor> all = parts;
  int64_t have = 0;
  for (const Tensor& p : parts) have += p.size(0);
  if (have < rows) {
    Shape zs = parts[0].shape();
    zs[0] = rows - have;
    all.push_back(zeros(zs, parts[0].dtype(), parts[0].device_ptr()));
  }
  return concat(all, 0);
}

// out [R, N] += a [R, K] @ b [K, N] in place (summed in the GEMM's f32 accumulator, rounded once): linear's dx added
// into x's pending gradient (graph::pending_gradient). Not recorded: backward rules run it without a graph.
void matmul_into(const Tensor& a, const Tensor& b, const Tensor& out) {
  out.device().workspace(kGemmWorkspaceBytes);
  run_kernel(
      "linear", out, [&] { cpu::matmul(a, b, Tensor(), out, false, true); },
      CUDA_KERNEL(cuda::matmul_accumulate(unsqueeze(a, 0), b, unsqueeze(out, 0))));
  engine::count_op("linear", 2.0 * double(a.size(0)) * double(a.size(1)) * double(b.size(1)),
                   double(a.nbytes() + b.nbytes() + 2 * out.nbytes()));
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_floating("matmul", "a", a);
  check_floating("matmul", "b", b);
  check_same_dtype("matmul", a, b);
  check_same_device("matmul", a, b);
  ENGINE_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: operands need at least 1 dimension, got a ",
               engine::shape_str(a.shape()), " and b ", engine::shape_str(b.shape()));
  if (a.dim() >= 2 && b.dim() >= 2) return matmul_batched(a, b);
  // A vector operand: a row [1, K] or a column [K, 1] (a view, or a copy if strided), removed afterwards.
  Tensor out = matmul_batched(a.dim() == 1 ? unsqueeze(a, 0) : a, b.dim() == 1 ? unsqueeze(b, -1) : b);
  if (b.dim() == 1) out = squeeze(out, -1);
  if (a.dim() == 1) out = squeeze(out, b.dim() == 1 ? -1 : -2);
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_dim("bmm", "a", a, 3);
  check_dim("bmm", "b", b, 3);
  ENGINE_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ: a ", engine::shape_str(a.shape()), " and b ",
               engine::shape_str(b.shape()), " (use matmul to broadcast)");
  return matmul(a, b);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act) {
  return linear(x, std::vector<Tensor>{weight}, bias.defined() ? std::vector<Tensor>{bias} : std::vector<Tensor>{},
                act);
}

Tensor linear(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<Tensor>& biases, Activation act) {
  OpScope scope("linear");
  ENGINE_CHECK(!weights.empty(), "linear: no weight given");
  ENGINE_CHECK(biases.empty() || biases.size() == weights.size(), "linear: ", weights.size(), " weights and ",
               biases.size(), " biases: give one bias per weight, or none");
  check_floating("linear", "x", x);
  ENGINE_CHECK(x.dim() >= 1, "linear: x must have at least 1 dimension, got ", engine::shape_str(x.shape()));
  const int64_t in = weights[0].dim() == 2 ? weights[0].size(1) : 0;
  int64_t out_features = 0;
  for (size_t i = 0; i < weights.size(); i++) {
    const Tensor& w = weights[i];
    check_floating("linear", "weight", w);
    check_same_dtype("linear", x, w);
    check_same_device("linear", x, w);
    check_dim("linear", "weight", w, 2);
    ENGINE_CHECK(w.size(1) == in && x.size(-1) == in, "linear: x ", engine::shape_str(x.shape()),
                 " and weight [out, in] ", engine::shape_str(w.shape()), ": x's last dimension (", x.size(-1),
                 ") must equal in (", w.size(1), ")", weights.size() > 1 ? ", the same for every stacked weight" : "");
    if (!biases.empty()) {
      const Tensor& b = biases[i];
      ENGINE_CHECK(b.defined(), "linear: bias ", i, " is undefined: give every stacked weight a bias, or none");
      check_same_dtype("linear", x, b);
      check_same_device("linear", x, b);
      ENGINE_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "linear: bias must be [", w.size(0), "] to match weight ",
                   engine::shape_str(w.shape()), ", got ", engine::shape_str(b.shape()));
    }
    out_features += w.size(0);
  }
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = engine::numel_of(out_shape);
  const int64_t padded = padded_features(out_features, x.dtype());
  out_shape.push_back(padded);
  Tensor y = new_empty(x, out_shape);  // [..., padded]; the result is its first out_features columns

  // Kernel views (not recorded): x as rows [R, in], W^T as [in, padded] (strides swapped: no copy; stacked or
  // padded: one temporary W of the stacked weights and zero rows), y as [R, padded].
  Tensor x_rows, w_p, b_p;
  {
    graph::NoGrad ng;  // a non-contiguous x is copied once, a temporary of this op
    Tensor xc = contiguous(x);
    x_rows = Tensor::view_of(xc, {rows, in}, {in, 1}, xc.offset());
    w_p = stacked_rows(weights, padded);
    if (!biases.empty()) b_p = stacked_rows(biases, padded);
  }
  Tensor w_t = Tensor::view_of(w_p, {in, padded}, {w_p.strides()[1], w_p.strides()[0]}, w_p.offset());
  Tensor y_rows = Tensor::view_of(y, {rows, padded}, {padded, 1}, y.offset());
  y.device().workspace(kGemmWorkspaceBytes);
  const bool relu = act == Activation::relu;
  run_kernel(
      "linear", y, [&] { cpu::matmul(x_rows, w_t, b_p, y_rows, relu); },
      CUDA_KERNEL(cuda::matmul(x_rows, w_t, b_p, y_rows, relu)));
  x_rows = w_t = w_p = b_p = Tensor();  // free the temporaries before recording
  double bytes = double(x.nbytes() + y.nbytes());
  for (const Tensor& w : weights) bytes += double(w.nbytes());
  for (const Tensor& b : biases) bytes += double(b.nbytes());
  engine::count_op("linear", 2.0 * double(rows) * double(in) * double(padded), bytes);
  if (padded != out_features) {  // the result: a view of y's first out_features columns
    Shape shape = out_shape;
    shape.back() = out_features;
    y = Tensor::view_of(y, shape, y.strides(), y.offset());
  }

  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  inputs.insert(inputs.end(), biases.begin(), biases.end());
  if (graph::any_requires_grad(inputs)) {
    bool any_weight_grad = false;
    for (const Tensor& w : weights) any_weight_grad = any_weight_grad || w.requires_grad();
    // Saved: x (for the weights' gradients) and the weights themselves (for x's), never their stack; with relu,
    // the result (relu's gradient passes where it is positive).
    std::vector<Tensor> saved{any_weight_grad ? x : Tensor()};
    for (const Tensor& w : weights) saved.push_back(x.requires_grad() ? w : Tensor());
    if (relu) saved.push_back(y);
    const size_t n_w = weights.size();
    const bool has_bias = !biases.empty();
    graph::record(relu ? "linear_relu" : "linear", inputs, {y}, saved,
                  [in, out_features, padded, n_w, has_bias, relu](Node& n, const Grads& g_out) {
                    Grads grads(1 + n_w * (has_bias ? 2 : 1));
                    // With relu: the gradient of the product, g_out where the result is positive.
                    const Grads g = relu ? Grads{unary_backward(UnaryOp::relu, g_out[0], n.saved(1 + n_w))} : g_out;
                    // Padded: g with zero columns and W with zero rows, so both products run aligned.
                    Tensor g_p = padded == out_features ? g[0] : pad_with_zeros(g[0], -1, padded);
                    if (n.needs_input_grad(0)) {
                      std::vector<Tensor> ws;
                      for (size_t i = 0; i < n_w; i++) ws.push_back(n.saved(1 + i));
                      const Tensor w = stacked_rows(ws, padded);  // [padded, in]
                      // x's gradient from its other consumers (a residual branch), when this product may add
                      // into it in place: g @ W + that sum in one GEMM, no separate sum (graph/autograd.h).
                      Tensor into = graph::pending_gradient(0, g_p.dtype());
                      if (into.defined()) {
                        const int64_t rows = into.numel() / in;
                        matmul_into(reshape(contiguous(g_p), {rows, padded}), w, reshape(into, {rows, in}));
                        grads[0] = into;
                      } else {
                        grads[0] = linear(g_p, transpose(w, 0, 1));  // g @ W
                      }
                    }
                    bool weight_grad = false, bias_grad = false;
                    for (size_t i = 0; i < n_w; i++) {
                      weight_grad = weight_grad || n.needs_input_grad(1 + i);
                      bias_grad = bias_grad || (has_bias && n.needs_input_grad(1 + n_w + i));
                    }
                    // Each stacked weight's (and bias's) gradient: its rows of the stack's, views that the
                    // parameters keep as their gradients (the stack marked for AccumulateGrad).
                    Tensor gw = weight_grad ? matmul(transpose(reshape(g_p, {-1, padded}), 0, 1),  // [out, R] @ [R, in]
                                                     reshape(n.saved(0), {-1, in}))
                                            : Tensor();
                    Tensor gb = bias_grad ? sum_to(g[0], {out_features}) : Tensor();
                    if (n_w > 1) {
                      for (const Tensor& stack : {gw, gb})
                        if (stack.defined()) stack.storage()->stacked_gradients = true;
                    }
                    int64_t row = 0;
                    for (size_t i = 0; i < n_w; i++) {
                      const int64_t rows_i = n.input_shapes[1 + i][0];
                      if (n.needs_input_grad(1 + i))
                        grads[1 + i] = n_w == 1 && padded == out_features ? gw : slice(gw, 0, row, row + rows_i);
                      if (has_bias && n.needs_input_grad(1 + n_w + i))
                        grads[1 + n_w + i] = n_w == 1 ? gb : slice(gb, 0, row, row + rows_i);
                      row += rows_i;
                    }
                    return grads;
                  });
  }
  return y;
}

}  // namespace ops
