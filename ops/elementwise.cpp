// elementwise.cpp: pointwise ops, their shape rules and backward rules.
#include "ops/elementwise.h"

#include "ops/cpu/elementwise.h"
#ifdef ENGINE_CUDA
#include "ops/cuda/elementwise.h"
#endif
#include "ops/factory.h"
#include "ops/op.h"
#include "ops/reduce.h"

namespace ops {

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
    case BinaryOp::maximum: return "maximum";
    case BinaryOp::minimum: return "minimum";
  }
  return "binary";
}

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::affine: return "affine";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::rsqrt: return "rsqrt";
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::relu: return "relu";
    case UnaryOp::leaky_relu: return "leaky_relu";
    case UnaryOp::gelu: return "gelu";
    case UnaryOp::gelu_tanh: return "gelu_tanh";
    case UnaryOp::pow: return "pow";
    case UnaryOp::erf: return "erf";
    case UnaryOp::softplus:
      return "softplus";
  }
  return "unary";
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; i++) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    ENGINE_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", engine::shape_str(a), " and ",
                 engine::shape_str(b), " do not broadcast (dimension ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Binary

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  OpScope scope(name);
  check_floating(name, "a", a);
  check_floating(name, "b", b);
  check_same_dtype(name, a, b);
  check_same_device(name, a, b);
  Shape shape = broadcast_shapes(name, a.shape(), b.shape());
  Tensor out = new_empty(a, shape);
  run_kernel(name, out, [&] { cpu::binary(op, a, b, out); }, CUDA_KERNEL(cuda::binary(op, a, b, out)));
  engine::count_op(name, double(out.numel()), double(a.nbytes() + b.nbytes() + out.nbytes()));
  if (graph::any_requires_grad({a, b})) {
    // Save only what the gradients need (as PyTorch does): a * c with a constant c saves c alone.
    bool need_a = a.requires_grad(), need_b = b.requires_grad();
    std::vector<Tensor> saved;
    if (op == BinaryOp::mul) saved = {need_b ? a : Tensor(), need_a ? b : Tensor()};
    if (op == BinaryOp::div) saved = {need_b ? a : Tensor(), b};
    if (op == BinaryOp::maximum || op == BinaryOp::minimum) saved = {a, b};
    Shape sa = a.shape(), sb = b.shape();
    graph::record(name, {a, b}, {out}, saved, [op, sa, sb](Node& n, const Grads& g) -> Grads {
      const Tensor& go = g[0];
      Tensor ga, gb;
      switch (op) {
        case BinaryOp::add:
          ga = go; gb = go;
          break;
        case BinaryOp::sub:
          ga = go; gb = neg(go);
          break;
        case BinaryOp::mul:
          if (n.needs_input_grad(0)) ga = mul(go, n.saved(1));
          if (n.needs_input_grad(1)) gb = mul(go, n.saved(0));
          break;
        case BinaryOp::div: {
          Tensor bb = n.saved(1);
          if (n.needs_input_grad(0)) ga = div(go, bb);
          if (n.needs_input_grad(1)) gb = neg(div(mul(go, n.saved(0)), mul(bb, bb)));
          break;
        }
        case BinaryOp::maximum:
        case BinaryOp::minimum: {
          // The gradient goes to a where a wins (ties to a), else to b.
          Tensor a = n.saved(0), b = n.saved(1);
          Tensor a_wins = to(compare(op == BinaryOp::maximum ? CompareOp::ge : CompareOp::le, a, b), go.dtype());
          if (n.needs_input_grad(0)) ga = mul(go, a_wins);
          if (n.needs_input_grad(1)) gb = mul(go, add(neg(a_wins), 1.0));
          break;
        }
      }
      return {ga.defined() && n.needs_input_grad(0) ? sum_to(ga, sa) : Tensor(),
              gb.defined() && n.needs_input_grad(1) ? sum_to(gb, sb) : Tensor()};
    });
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::minimum, a, b); }

// ---------------------------------------------------------------------------------------------------
// Unary

namespace {
// d f'(s)/ds as a tensor; only double backward uses it, and a third derivative is not provided.
Tensor unary_second(UnaryOp op, const Tensor& s, double alpha, double beta) {
  OpScope scope("unary_second");
  ENGINE_CHECK(!graph::any_requires_grad({s}), unary_name(op),
               ": a third derivative is not supported (double backward is)");
  Tensor out = empty_like(s);
  run_kernel("unary_second", out, [&] { cpu::unary_d2(op, alpha, beta, s, out); },
             CUDA_KERNEL(cuda::unary_d2(op, alpha, beta, s, out)));
  engine::count_op("unary_second", double(out.numel()), double(2 * out.nbytes()));
  return out;
}
}  // namespace

Tensor unary(UnaryOp op, const Tensor& x, double alpha, double beta) {
  const char* name = unary_name(op);
  OpScope scope(name);
  check_floating(name, "x", x);
  Tensor y = empty_like(x);
  run_kernel(name, y, [&] { cpu::unary(op, alpha, beta, x, y); },
             CUDA_KERNEL(cuda::unary(op, alpha, beta, x, y)));
  engine::count_op(name, double(y.numel()), double(x.nbytes() + y.nbytes()));
  if (graph::any_requires_grad({x})) {
    std::vector<Tensor> saved;
    if (unary_needs_saved(op)) saved = {unary_saves_output(op) ? y : x};
    graph::record(name, {x}, {y}, saved, [op, alpha, beta](Node& n, const Grads& g) -> Grads {
      if (op == UnaryOp::affine) return {unary(UnaryOp::affine, g[0], alpha, 0.0)};
      return {unary_backward(op, g[0], n.saved(0), alpha, beta)};
    });
  }
  return y;
}

Tensor unary_backward(UnaryOp op, const Tensor& g, const Tensor& s, double alpha, double beta) {
  OpScope scope("unary_backward");
  check_same_dtype("unary_backward", g, s);
  ENGINE_CHECK(g.shape() == s.shape(), "unary_backward: gradient shape ", engine::shape_str(g.shape()),
               " differs from saved shape ", engine::shape_str(s.shape()));
  Tensor out = empty_like(g);
  run_kernel("unary_backward", out, [&] { cpu::unary_backward(op, alpha, beta, g, s, out); },
             CUDA_KERNEL(cuda::unary_backward(op, alpha, beta, g, s, out)));
  engine::count_op("unary_backward", 2.0 * double(out.numel()), double(g.nbytes() + s.nbytes() + out.nbytes()));
  if (graph::any_requires_grad({g, s})) {
    graph::record("unary_backward", {g, s}, {out}, {g, s}, [op, alpha, beta](Node& n, const Grads& gg) -> Grads {
      Tensor gr = n.saved(0), sv = n.saved(1);
      Tensor d_g = n.needs_input_grad(0) ? unary_backward(op, gg[0], sv, alpha, beta) : Tensor();
      Tensor d_s;
      if (n.needs_input_grad(1)) {
        Tensor second;
        {
          graph::NoGrad ng;  // f'' is treated as a constant: no third derivatives
          second = unary_second(op, sv.detach(), alpha, beta);
        }
        d_s = mul(mul(gg[0], gr), second);
      }
      return {d_g, d_s};
    });
  }
  return out;
}

Tensor add(const Tensor& x, double c) { return unary(UnaryOp::affine, x, 1.0, c); }
Tensor mul(const Tensor& x, double c) { return unary(UnaryOp::affine, x, c, 0.0); }
Tensor scale(const Tensor& x, double c) { return unary(UnaryOp::affine, x, c, 0.0); }
Tensor neg(const Tensor& x) { return unary(UnaryOp::affine, x, -1.0, 0.0); }
Tensor exp(const Tensor& x) { return unary(UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return unary(UnaryOp::sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary(UnaryOp::rsqrt, x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::sigmoid, x); }
Tensor relu(const Tensor& x) { return unary(UnaryOp::relu, x); }
Tensor leaky_relu(const Tensor& x, double slope) { return unary(UnaryOp::leaky_relu, x, slope); }
Tensor gelu(const Tensor& x) { return unary(UnaryOp::gelu, x); }
Tensor gelu_tanh(const Tensor& x) { return unary(UnaryOp::gelu_tanh, x); }
Tensor pow(const Tensor& x, double exponent) { return unary(UnaryOp::pow, x, exponent); }
Tensor erf(const Tensor& x) { return unary(UnaryOp::erf, x); }
Tensor softplus(const Tensor& x) { return unary(UnaryOp::softplus, x); }

// ---------------------------------------------------------------------------------------------------
// Comparisons

Tensor compare(CompareOp op, const Tensor& x, double c) {
  OpScope scope("compare");
  check_defined("compare", "x", x);
  Tensor out = new_empty(x, x.shape(), DType::boolean);
  run_kernel("compare", out, [&] { cpu::compare_scalar(op, x, c, out); },
             CUDA_KERNEL(cuda::compare_scalar(op, x, c, out)));
  engine::count_op("compare", double(out.numel()), double(x.nbytes() + out.nbytes()));
  return out;
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {
  OpScope scope("compare");
  check_same_dtype("compare", a, b);
  check_same_device("compare", a, b);
  Tensor out = new_empty(a, broadcast_shapes("compare", a.shape(), b.shape()), DType::boolean);
  run_kernel("compare", out, [&] { cpu::compare(op, a, b, out); }, CUDA_KERNEL(cuda::compare(op, a, b, out)));
  engine::count_op("compare", double(out.numel()), double(a.nbytes() + b.nbytes() + out.nbytes()));
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Casts, copies, broadcasting views

Tensor to(const Tensor& x, DType dtype) {
  check_defined("to", "x", x);
  if (x.dtype() == dtype) return x;
  OpScope scope("to");
  Tensor y = new_empty(x, x.shape(), dtype);
  run_kernel("to", y, [&] { cpu::copy(x, y); }, CUDA_KERNEL(cuda::copy(x, y)));
  engine::count_op("to", 0, double(x.nbytes() + y.nbytes()));
  if (engine::is_floating(dtype) && graph::any_requires_grad({x})) {
    DType from = x.dtype();
    graph::record("to", {x}, {y}, {}, [from](Node&, const Grads& g) -> Grads { return {to(g[0], from)}; });
  }
  return y;
}

Tensor clone(const Tensor& x) {
  OpScope scope("clone");
  check_defined("clone", "x", x);
  Tensor y = empty_like(x);
  run_kernel("clone", y, [&] { cpu::copy(x, y); }, CUDA_KERNEL(cuda::copy(x, y)));
  engine::count_op("clone", 0, double(2 * x.nbytes()));
  if (graph::any_requires_grad({x}))
    graph::record("clone", {x}, {y}, {}, [](Node&, const Grads& g) -> Grads { return {g[0]}; });
  return y;
}

Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : clone(x); }

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  check_defined("broadcast_to", "x", x);
  if (x.shape() == shape) return x;
  Shape full = broadcast_shapes("broadcast_to", x.shape(), shape);
  ENGINE_CHECK(full == shape, "broadcast_to: cannot broadcast ", engine::shape_str(x.shape()), " to ",
               engine::shape_str(shape));
  Shape strides(shape.size(), 0);
  int64_t lead = int64_t(shape.size()) - x.dim();
  for (int64_t i = 0; i < x.dim(); i++) strides[lead + i] = x.shape()[i] == 1 ? 0 : x.strides()[i];
  Tensor y = Tensor::view_of(x, shape, strides, x.offset());
  if (graph::any_requires_grad({x})) {
    Shape xs = x.shape();
    graph::record("broadcast_to", {x}, {y}, {}, [xs](Node&, const Grads& g) -> Grads { return {sum_to(g[0], xs)}; });
  }
  return y;
}

// ---------------------------------------------------------------------------------------------------
// In place

namespace {
void check_inplace(const char* op, const Tensor& a) {
  check_defined(op, "a", a);
  ENGINE_CHECK(!graph::any_requires_grad({a}), op, ": in-place update of a tensor that requires grad while "
               "grad mode is on (wrap it in graph::NoGrad)");
}
}  // namespace

void add_(const Tensor& a, const Tensor& b, double alpha) {
  OpScope scope("add_");
  check_inplace("add_", a);
  check_same_dtype("add_", a, b);
  ENGINE_CHECK(broadcast_shapes("add_", a.shape(), b.shape()) == a.shape(), "add_: ", engine::shape_str(b.shape()),
               " does not broadcast to ", engine::shape_str(a.shape()));
  run_kernel("add_", a, [&] { cpu::add_inplace(a, b, alpha); }, CUDA_KERNEL(cuda::add_inplace(a, b, alpha)));
  engine::count_op("add_", double(2 * a.numel()), double(2 * a.nbytes() + b.nbytes()));
}

void mul_(const Tensor& a, double c) {
  OpScope scope("mul_");
  check_inplace("mul_", a);
  run_kernel("mul_", a, [&] { cpu::scale_inplace(a, c); }, CUDA_KERNEL(cuda::scale_inplace(a, c)));
  engine::count_op("mul_", double(a.numel()), double(2 * a.nbytes()));
}

void fill_(const Tensor& a, double value) {
  OpScope scope("fill_");
  check_inplace("fill_", a);
  run_kernel("fill_", a, [&] { cpu::fill(a, value); }, CUDA_KERNEL(cuda::fill(a, value)));
  engine::count_op("fill_", 0, double(a.nbytes()));
}

void copy_(const Tensor& dst, const Tensor& src) {
  OpScope scope("copy_");
  check_inplace("copy_", dst);
  check_same_device("copy_", dst, src);
  ENGINE_CHECK(broadcast_shapes("copy_", dst.shape(), src.shape()) == dst.shape(), "copy_: source shape ",
               engine::shape_str(src.shape()), " does not broadcast to ", engine::shape_str(dst.shape()));
  run_kernel("copy_", dst, [&] { cpu::copy(src, dst); }, CUDA_KERNEL(cuda::copy(src, dst)));
  engine::count_op("copy_", 0, double(src.nbytes() + dst.nbytes()));
}

}  // namespace ops
