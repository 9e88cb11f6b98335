// cuda/elementwise.cu: every pointwise kernel of the family is one "map": out = f(inputs...), element by
// element, with f a small functor holding the op's scalar math (elementwise_math.h, shared with the CPU).
//
// Three kernels serve every map:
//   map_contiguous  every tensor dense and of one shape: each thread moves 16-byte packs (one vector load
//                   per input, one vector store), the common case of activations and gradients;
//   map_inner_vec   the innermost dimension (after collapsing) dense in out and dense or broadcast in every
//                   input: the same packs along it (a bias row, a per-row scale, a column slice);
//   map_strided     anything else (transposed views, broadcasts along the innermost dimension, odd sizes):
//                   the layout is collapsed on the host to the fewest dimensions (kernel_util.cuh's Indexer)
//                   and each thread finds its element's offsets with one division per dimension.
// Measured on an H200 (64M elements, GB/s counted as bytes read + written, copy ceiling 4.3 TB/s): add 4.0 TB/s
// (f32) / 3.9 (bf16); bias add 3.7 / 3.5; gelu 3.4 / 3.1; casts 3.9 / 3.6; a full 2-D transpose copy only
// 0.9 / 0.55 (strided reads, no shared-memory tiling).
// Both are bound by memory: bytes = n * (inputs' element sizes + output element size); there is no reuse.
// Kernels first, then the launcher, then the family's functions (ops/cpu/elementwise.h's contract).
#include <cstring>
#include <type_traits>

#include "ops/cpu/cpu_util.h"  // broadcast_strides
#include "ops/cuda/convert.cuh"
#include "ops/cuda/elementwise.h"

namespace ops::cuda {

using engine::Shape;
using engine::Tensor;

namespace {

constexpr int kThreads = 256;

// f applied to NIn stored values (pointers, so that unused inputs are never read).
template <int NIn, typename F, typename In>
__device__ __forceinline__ auto call(const F& f, const In* a, const In* b) {
  if constexpr (NIn == 0) return f();
  else if constexpr (NIn == 1) return f(*a);
  else return f(*a, *b);
}

// map_contiguous: out[i] = f(in0[i], in1[i]) for i < n, all dense with one shape.
// Threads: a grid-stride loop over VEC-element packs (VEC * widest element size = 16 bytes), one pack per
// thread per step; the n % VEC tail elements go to the first threads of the grid, one each.
template <int NIn, int VEC, typename Out, typename In, typename F>
__global__ void map_contiguous(int64_t n, Out* out, const In* in0, const In* in1, F f) {
  const int64_t packs = n / VEC;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t p = tid; p < packs; p += step) {
    Vec<In, VEC> a, b;
    if constexpr (NIn >= 1) a = reinterpret_cast<const Vec<In, VEC>*>(in0)[p];
    if constexpr (NIn >= 2) b = reinterpret_cast<const Vec<In, VEC>*>(in1)[p];
    Vec<Out, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; k++) o.v[k] = call<NIn>(f, &a.v[k], &b.v[k]);
    reinterpret_cast<Vec<Out, VEC>*>(out)[p] = o;
  }
  const int64_t i = packs * VEC + tid;
  if (i < n) out[i] = call<NIn>(f, in0 + i, in1 + i);
}

// map_strided: the same over any strides. Thread t of the grid-stride loop takes logical element i
// (row-major over out's shape), so consecutive threads touch consecutive elements of every dense inner
// dimension (coalesced). I is int32_t when all offsets fit (cheaper divisions), else int64_t.
template <int NIn, typename I, typename Out, typename In, typename F>
__global__ void map_strided(int64_t n, Out* out, const In* in0, const In* in1, Indexer<NIn + 1, I> ix, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    I off[NIn + 1];
    ix.offsets(I(i), off);
    if constexpr (NIn == 0) out[off[0]] = f();
    else if constexpr (NIn == 1) out[off[0]] = f(in0[off[1]]);
    else out[off[0]] = f(in0[off[1]], in1[off[2]]);
  }
}

// map_inner_vec: the strided case whose innermost dimension is dense in out and dense or broadcast
// (stride 0: a bias row, a per-row scale) in every input, its size a multiple of VEC: threads take VEC-element
// packs along it (16-byte accesses, and one division per dimension per pack instead of per element). The
// indexer describes packs: innermost size / VEC, stride VEC for dense tensors, 0 for broadcast ones, whose
// one element per pack is loaded once and repeated.
template <int VEC, typename In>
__device__ __forceinline__ Vec<In, VEC> load_pack(const In* p, bool broadcast) {
  if (!broadcast) return *reinterpret_cast<const Vec<In, VEC>*>(p);
  Vec<In, VEC> v;
  const In e = *p;
#pragma unroll
  for (int k = 0; k < VEC; k++) v.v[k] = e;
  return v;
}

template <int NIn, int VEC, typename Out, typename In, typename F>
__global__ void map_inner_vec(int64_t packs, Out* out, const In* in0, const In* in1, Indexer<NIn + 1, int32_t> ix,
                              bool broadcast0, bool broadcast1, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += step) {
    int32_t off[NIn + 1];
    ix.offsets(int32_t(p), off);
    Vec<In, VEC> a, b;
    if constexpr (NIn >= 1) a = load_pack<VEC>(in0 + off[1], broadcast0);
    if constexpr (NIn >= 2) b = load_pack<VEC>(in1 + off[NIn], broadcast1);
    Vec<Out, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; k++) o.v[k] = call<NIn>(f, &a.v[k], &b.v[k]);
    *reinterpret_cast<Vec<Out, VEC>*>(out + off[0]) = o;
  }
}

// ---------------------------------------------------------------------------------------------------
// The launcher: out (any strides) = f(ins...), each input broadcast to out's shape.

template <typename T> bool aligned_to(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) % sizeof(T)) == 0;
}

// True when out and every input are dense with out's shape: the map_contiguous case.
template <int NIn> bool all_dense(const Tensor& out, const std::array<const Tensor*, NIn>& ins) {
  bool dense = out.is_contiguous();
  for (const Tensor* t : ins) dense = dense && t->is_contiguous() && t->shape() == out.shape();
  return dense;
}

template <int NIn, typename In>
std::array<const In*, 2> input_pointers(const std::array<const Tensor*, NIn>& ins) {
  std::array<const In*, 2> p = {nullptr, nullptr};
  for (int k = 0; k < NIn; k++) p[size_t(k)] = static_cast<const In*>(ins[size_t(k)]->data_ptr());
  return p;
}

// Elements per 16-byte access for a map reading In and writing Out.
template <typename Out, typename In> constexpr int map_vec() {
  return int(16 / (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out)));
}

// The dense case alone (all_dense() holds): 16-byte packs when every pointer allows, else one element
// per thread. Separate so that hot ops can launch it with their op fixed at compile time.
template <int NIn, typename Out, typename In, typename F>
void launch_dense(const Tensor& out, const std::array<const Tensor*, NIn>& ins, F f) {
  const int64_t n = out.numel();
  if (n == 0) return;
  constexpr int kVec = map_vec<Out, In>();
  Out* po = static_cast<Out*>(out.data_ptr());
  std::array<const In*, 2> pin = input_pointers<NIn, In>(ins);
  bool vec = aligned_to<Vec<Out, kVec>>(po);
  for (int k = 0; k < NIn; k++) vec = vec && aligned_to<Vec<In, kVec>>(pin[size_t(k)]);
  cudaStream_t s = engine::cuda::stream();
  if (vec) {
    map_contiguous<NIn, kVec><<<grid_for(n / kVec + 1, kThreads), kThreads, 0, s>>>(n, po, pin[0], pin[1], f);
  } else {
    map_contiguous<NIn, 1><<<grid_for(n, kThreads), kThreads, 0, s>>>(n, po, pin[0], pin[1], f);
  }
}

// The map_inner_vec case, when the collapsed layout `ix` allows it (see the kernel); false otherwise.
template <int NIn, typename Out, typename In, typename F>
bool try_inner_vec(Indexer<NIn + 1, int32_t> ix, Out* po, const std::array<const In*, 2>& pin, int64_t n, F f) {
  constexpr int kVec = map_vec<Out, In>();
  const int last = ix.ndim - 1;
  if (kVec == 1 || last < 0 || ix.size[last] % kVec != 0 || ix.stride[0][last] != 1 ||
      !aligned_to<Vec<Out, kVec>>(po))
    return false;
  bool broadcast[2] = {false, false};
  for (int k = 0; k <= NIn; k++) {
    const int32_t inner = ix.stride[k][last];
    if (k > 0) broadcast[k - 1] = inner == 0;
    if (inner == 0) continue;
    if (inner != 1 || (k > 0 && !aligned_to<Vec<In, kVec>>(pin[size_t(k - 1)]))) return false;
    for (int d = 0; d < last; d++)
      if (ix.stride[k][d] % kVec != 0) return false;  // every pack starts 16-byte aligned
    ix.stride[k][last] = kVec;
  }
  ix.size[last] /= kVec;
  map_inner_vec<NIn, kVec><<<grid_for(n / kVec, kThreads), kThreads, 0, engine::cuda::stream()>>>(
      n / kVec, po, pin[0], pin[1], ix, broadcast[0], broadcast[1], f);
  return true;
}

// out (any strides) = f(ins...), each input broadcast to out's shape: the dense, inner-vectorized or
// strided kernel, whichever the layout allows.
template <int NIn, typename Out, typename In, typename F>
void launch_map(const char* op, const Tensor& out, const std::array<const Tensor*, NIn>& ins, F f) {
  const int64_t n = out.numel();
  if (n == 0) return;
  if (all_dense<NIn>(out, ins)) return launch_dense<NIn, Out, In>(out, ins, f);
  Out* po = static_cast<Out*>(out.data_ptr());
  std::array<const In*, 2> pin = input_pointers<NIn, In>(ins);
  std::array<Shape, NIn + 1> strides;
  strides[0] = out.strides();
  for (int k = 0; k < NIn; k++) strides[size_t(k + 1)] = cpu::broadcast_strides(*ins[size_t(k)], out.shape());
  bool small = fits_int32(n, {&out});
  for (int k = 0; k < NIn; k++) small = small && fits_int32(n, {ins[size_t(k)]});
  cudaStream_t s = engine::cuda::stream();
  if (small) {
    auto ix = make_indexer<NIn + 1, int32_t>(op, out.shape(), strides);
    if (try_inner_vec<NIn>(ix, po, pin, n, f)) return;
    map_strided<NIn><<<grid_for(n, kThreads), kThreads, 0, s>>>(n, po, pin[0], pin[1], ix, f);
  } else {
    auto ix = make_indexer<NIn + 1, int64_t>(op, out.shape(), strides);
    map_strided<NIn><<<grid_for(n, kThreads), kThreads, 0, s>>>(n, po, pin[0], pin[1], ix, f);
  }
}

// ---------------------------------------------------------------------------------------------------
// The functors: each is the CPU loop body of ops/cpu/elementwise.cpp, on device storage types.

template <typename T> struct BinaryF {
  BinaryOp op;
  __device__ T operator()(T a, T b) const { return st<T>(binary_f(op, ld(a), ld(b))); }
};

// kOp >= 0 fixes the op at compile time (the hot activations, see with_hot_op): the switch in
// elementwise_math.h then folds away and the packs' elements interleave; -1 reads it at run time.
template <typename T, int kOp = -1> struct UnaryF {
  using A = cpu_acc_t<T>;
  UnaryOp op;
  A alpha, beta;
  __device__ T operator()(T x) const {
    return st<T>(unary_f<A>(kOp >= 0 ? UnaryOp(kOp) : op, ld(x), alpha, beta));
  }
};

template <typename T, int kOp = -1> struct UnaryBackwardF {
  using A = cpu_acc_t<T>;
  UnaryOp op;
  A alpha, beta;
  __device__ T operator()(T g, T s) const {
    return st<T>(ld(g) * unary_df<A>(kOp >= 0 ? UnaryOp(kOp) : op, ld(s), alpha, beta));
  }
};

// Calls launch(std::integral_constant<int, op>) for the activations and scalings that dominate a training
// step, launch(std::integral_constant<int, -1>) for the rest.
template <typename L> void with_hot_op(UnaryOp op, L&& launch) {
  switch (op) {
    case UnaryOp::affine: return launch(std::integral_constant<int, int(UnaryOp::affine)>());
    case UnaryOp::relu: return launch(std::integral_constant<int, int(UnaryOp::relu)>());
    case UnaryOp::gelu: return launch(std::integral_constant<int, int(UnaryOp::gelu)>());
    case UnaryOp::gelu_tanh: return launch(std::integral_constant<int, int(UnaryOp::gelu_tanh)>());
    default: return launch(std::integral_constant<int, -1>());
  }
}

template <typename T> struct UnaryD2F {
  using A = cpu_acc_t<T>;
  UnaryOp op;
  A alpha, beta;
  __device__ T operator()(T s) const { return st<T>(unary_d2f<A>(op, ld(s), alpha, beta)); }
};

template <typename T> struct CompareF {
  CompareOp op;
  __device__ uint8_t operator()(T a, T b) const { return compare_f<double>(op, double(ld(a)), double(ld(b))); }
};

template <typename T> struct CompareScalarF {
  CompareOp op;
  double c;
  __device__ uint8_t operator()(T a) const { return compare_f<double>(op, double(ld(a)), c); }
};

template <typename D> struct CastF {
  template <typename S> __device__ D operator()(S v) const { return cast<D>(ld(v)); }
};

template <typename T> struct IdentityF {
  __device__ T operator()(T v) const { return v; }
};

template <typename T> struct ConstF {
  T v;
  __device__ T operator()() const { return v; }
};

template <typename T> struct AxpyF {
  using A = cpu_acc_t<T>;
  A alpha;
  __device__ T operator()(T a, T b) const { return st<T>(ld(a) + alpha * ld(b)); }
};

template <typename T> struct ScaleF {
  using A = cpu_acc_t<T>;
  A c;
  __device__ T operator()(T a) const { return st<T>(ld(a) * c); }
};

// The stored bits of static_cast<T>(static_cast<acc_t<T>>(value)) computed on the host by the CPU's own
// conversions (engine::bf16 / engine::f16 for the 16-bit floats), so a fill writes the CPU's exact bits.
template <typename T> T host_value(double value) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>) {
    using H = std::conditional_t<std::is_same_v<T, __half>, engine::f16, engine::bf16>;
    H h(static_cast<float>(value));
    T out;
    std::memcpy(&out, &h.bits, sizeof out);
    return out;
  } else {
    return static_cast<T>(static_cast<engine::acc_t<T>>(value));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// The family's kernels (ops/cpu/elementwise.h's contract).

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  ENGINE_CUDA_FLOAT_SWITCH(out.dtype(), T, { launch_map<2, T, T>("binary", out, {&a, &b}, BinaryF<T>{op}); });
  ENGINE_CUDA_LAUNCH_CHECK("binary");
}

void unary(UnaryOp op, double alpha, double beta, const Tensor& x, const Tensor& out) {
  ENGINE_CUDA_FLOAT_SWITCH(out.dtype(), T, {
    using A = cpu_acc_t<T>;
    if (all_dense<1>(out, {&x})) {
      with_hot_op(op, [&](auto k) {
        launch_dense<1, T, T>(out, {&x}, UnaryF<T, decltype(k)::value>{op, A(alpha), A(beta)});
      });
    } else {
      launch_map<1, T, T>("unary", out, {&x}, UnaryF<T>{op, A(alpha), A(beta)});
    }
  });
  ENGINE_CUDA_LAUNCH_CHECK("unary");
}

void unary_backward(UnaryOp op, double alpha, double beta, const Tensor& g, const Tensor& s, const Tensor& out) {
  ENGINE_CUDA_FLOAT_SWITCH(out.dtype(), T, {
    using A = cpu_acc_t<T>;
    if (all_dense<2>(out, {&g, &s})) {
      with_hot_op(op, [&](auto k) {
        launch_dense<2, T, T>(out, {&g, &s}, UnaryBackwardF<T, decltype(k)::value>{op, A(alpha), A(beta)});
      });
    } else {
      launch_map<2, T, T>("unary_backward", out, {&g, &s}, UnaryBackwardF<T>{op, A(alpha), A(beta)});
    }
  });
  ENGINE_CUDA_LAUNCH_CHECK("unary_backward");
}

void unary_d2(UnaryOp op, double alpha, double beta, const Tensor& s, const Tensor& out) {
  ENGINE_CUDA_FLOAT_SWITCH(out.dtype(), T, {
    using A = cpu_acc_t<T>;
    launch_map<1, T, T>("unary_d2", out, {&s}, UnaryD2F<T>{op, A(alpha), A(beta)});
  });
  ENGINE_CUDA_LAUNCH_CHECK("unary_d2");
}

void compare(CompareOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  ENGINE_CUDA_ALL_SWITCH(a.dtype(), T, { launch_map<2, uint8_t, T>("compare", out, {&a, &b}, CompareF<T>{op}); });
  ENGINE_CUDA_LAUNCH_CHECK("compare");
}

void compare_scalar(CompareOp op, const Tensor& a, double c, const Tensor& out) {
  ENGINE_CUDA_ALL_SWITCH(a.dtype(), T, {
    launch_map<1, uint8_t, T>("compare", out, {&a}, CompareScalarF<T>{op, c});
  });
  ENGINE_CUDA_LAUNCH_CHECK("compare");
}

void copy(const Tensor& src, const Tensor& dst) {
  if (dst.numel() == 0) return;
  if (src.dtype() == dst.dtype()) {  // same type: move the elements as they are (no rounding of i64)
    if (src.is_contiguous() && dst.is_contiguous() && src.shape() == dst.shape()) {
      ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                                        engine::cuda::stream()));
      return;
    }
    switch (engine::dtype_size(dst.dtype())) {
      case 1: launch_map<1, uint8_t, uint8_t>("copy", dst, {&src}, IdentityF<uint8_t>{}); break;
      case 2: launch_map<1, uint16_t, uint16_t>("copy", dst, {&src}, IdentityF<uint16_t>{}); break;
      case 4: launch_map<1, uint32_t, uint32_t>("copy", dst, {&src}, IdentityF<uint32_t>{}); break;
      default: launch_map<1, uint64_t, uint64_t>("copy", dst, {&src}, IdentityF<uint64_t>{}); break;
    }
    ENGINE_CUDA_LAUNCH_CHECK("copy");
    return;
  }
  ENGINE_CUDA_ALL_SWITCH(src.dtype(), S, {
    ENGINE_CUDA_ALL_SWITCH(dst.dtype(), D, { launch_map<1, D, S>("copy", dst, {&src}, CastF<D>{}); });
  });
  ENGINE_CUDA_LAUNCH_CHECK("copy");
}

void fill(const Tensor& dst, double value) {
  ENGINE_CUDA_ALL_SWITCH(dst.dtype(), T, { launch_map<0, T, T>("fill", dst, {}, ConstF<T>{host_value<T>(value)}); });
  ENGINE_CUDA_LAUNCH_CHECK("fill");
}

void add_inplace(const Tensor& a, const Tensor& b, double alpha) {
  ENGINE_CUDA_FLOAT_SWITCH(a.dtype(), T, {
    using A = cpu_acc_t<T>;
    launch_map<2, T, T>("add_", a, {&a, &b}, AxpyF<T>{A(alpha)});
  });
  ENGINE_CUDA_LAUNCH_CHECK("add_");
}

void scale_inplace(const Tensor& a, double c) {
  ENGINE_CUDA_FLOAT_SWITCH(a.dtype(), T, {
    using A = cpu_acc_t<T>;
    launch_map<1, T, T>("mul_", a, {&a}, ScaleF<T>{A(c)});
  });
  ENGINE_CUDA_LAUNCH_CHECK("mul_");
}

}  // namespace ops::cuda
